"""Stand-in for jax 0.10.1 on a TPU host: only the device queries a preflight makes.

The device count comes from ~/.standin.json ("device_count", default 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from _standin import device_count as _count

__version__ = "0.10.1"


@dataclass(frozen=True)
class Device:
    id: int
    platform: str = "tpu"
    device_kind: str = "TPU v6 lite"
    process_index: int = 0

    def __repr__(self) -> str:
        return f"TpuDevice(id={self.id}, process_index={self.process_index})"


def device_count() -> int:
    return _count()


def local_device_count() -> int:
    return _count()


def devices(backend: str | None = None) -> list[Device]:
    return [Device(i) for i in range(_count())]


def local_devices(process_index: int | None = None, backend: str | None = None) -> list[Device]:
    return devices(backend)


def process_count() -> int:
    return 1


def process_index() -> int:
    return 0


def default_backend() -> str:
    return "tpu"

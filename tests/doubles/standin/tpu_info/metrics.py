"""tpu_info.metrics.get_chip_usage as tpu-info 0.14.2 has it: libtpu's runtime metrics (served on
localhost:8431 only while a workload holds the TPU) as one Usage per device. Without a workload the real
call fails with grpc's UNAVAILABLE; this one raises an error of the same name. The values come from the
stand-in's control file (`hbm_used_bytes`, `duty_cycle_pct`)."""

from __future__ import annotations

import typing

from _standin import load_control

from tpu_info import device


class Usage(typing.NamedTuple):
    device_id: int
    memory_usage: int
    total_memory: int
    duty_cycle_pct: float


class _InactiveRpcError(Exception):
    """grpc's error for a call to a server that does not answer (StatusCode.UNAVAILABLE)."""


def get_chip_usage(chip_type: device.TpuChip, addr: str = "localhost:8431") -> list[Usage]:
    if not device.get_chip_owners():
        raise _InactiveRpcError(f"failed to connect to all addresses; last error: UNAVAILABLE: ipv4:{addr}")
    control = load_control()
    total = chip_type.value.hbm_gib << 30
    return [
        Usage(index, control["hbm_used_bytes"], total, control["duty_cycle_pct"])
        for index in range(device.get_local_chips()[1] * chip_type.value.devices_per_chip)
    ]

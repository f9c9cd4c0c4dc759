"""tpu_info.device as tpu-info 0.14.2 has it, for a host without TPU: the chips are the stand-in's
`device_count` v6e chips, and a chip's owner is a running stand-in MaxText process (where the real
module reads the processes holding /dev/vfio/N)."""

from __future__ import annotations

import enum
import typing
from pathlib import Path

from _standin import device_count

STANDIN_MODULES = (b"maxtext.trainers.post_train.rl.train_rl", b"maxtext.checkpoint_conversion.")


class _Info(typing.NamedTuple):
    name: str
    hbm_gib: int
    devices_per_chip: int


class TpuChip(enum.Enum):
    """The real enum's members, with their specs (name, HBM GiB, devices per chip)."""

    V2 = _Info("v2", 8, 2)
    V3 = _Info("v3", 16, 2)
    V4 = _Info("v4", 32, 1)
    V5E = _Info("v5e", 16, 1)
    V5P = _Info("v5p", 95, 1)
    V6E = _Info("v6e", 32, 1)
    V7X = _Info("7x", 192, 2)

    def __str__(self):
        return "TPU7x chip" if self.value.name == "7x" else f"TPU {self.value.name} chip"


def get_local_chips() -> tuple[TpuChip | None, int]:
    """The type and number of TPU chips, as the real function returns them ((None, 0) without any)."""
    count = device_count()
    return (TpuChip.V6E, count) if count else (None, 0)


def get_chip_owners() -> dict[str, int]:
    """Device path -> pid of the process using it: every chip belongs to a running stand-in MaxText."""
    owners = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue
        # `python3 -m MODULE`, or the training's `python3 - MODULE` (tpu_grpo/host/remote/run_module.py)
        if any(arg.startswith(STANDIN_MODULES) for arg in argv.split(b"\0")[1:3]):
            for index in range(device_count()):
                owners[f"/dev/vfio/{index}"] = int(cmdline.parent.name)
    return owners

"""The slice table (`tpu-grpo:slice`): one row per multi-host v6e shape, run on GKE with Pathways.

`v6e-8`, one `ct6e-standard-8t` VM (machines.py), is the default and the tutorial's path. A
bigger slice is several `ct6e-standard-4t` hosts of 4 chips each in one ICI domain, which GKE
places together (`placement_policy` COMPACT with the slice's topology); MaxText 0.2.3 runs RL on
more than one host only under Pathways. The rows are xpk 1.16.0's v6e shapes (its
`system_characteristics.py`) from 16 chips up; on GKE xpk also offers a 2-host v6e-8, which this
project leaves to the one VM.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_grpo.machines import MACHINES

ONE_VM = "v6e-8"
#: A slice's host: a row of the machine table (machines.py), its chips read from there.
HOST_MACHINE_TYPE = "ct6e-standard-4t"
CHIPS_PER_HOST = MACHINES[HOST_MACHINE_TYPE].chips
#: GKE's node label for v6e slice hosts (cloud.google.com/gke-tpu-accelerator).
GKE_ACCELERATOR = "tpu-v6e-slice"
#: The CPU host of the Pathways head (its proxy, resource manager and the trainer process) and of the
#: conversion and export jobs; xpk's default for `cluster create-pathways`.
CPU_MACHINE_TYPE = "n2-standard-64"
CPU_POOL = "cpu-np"  # xpk's name for it
#: Slices one stack may declare (`tpu-grpo:numSlices`): each is one TPU node pool.
MAX_SLICES = 4


@dataclass(frozen=True)
class Slice:
    name: str
    topology: str

    @property
    def chips(self) -> int:
        x, y = map(int, self.topology.split("x"))
        return x * y

    @property
    def hosts(self) -> int:
        return self.chips // CHIPS_PER_HOST

    def pool(self, cluster: str, index: int) -> str:
        """The TPU node pool of slice `index` (xpk's names: CLUSTER-np-0, -np-1, ...)."""
        return f"{cluster}-np-{index}"

    @property
    def pathways_instance_type(self) -> str:
        """The resource manager's `--instance_type`."""
        return f"tpuv6e:{self.topology}"


SLICES: dict[str, Slice] = {s.name: s for s in (
    Slice("v6e-16", "4x4"),
    Slice("v6e-32", "4x8"),
    Slice("v6e-64", "8x8"),
    Slice("v6e-128", "8x16"),
    Slice("v6e-256", "16x16"),
)}

"""The accelerator table: one row per v6e shape tpu-grpo runs on, the one VM's machine types and the multi-host
slices alike, in the spirit of xpk's `SystemCharacteristics` (its `system_characteristics.py`): topology, the
machine type of each host, chips per host, and from these the chips, hosts and HBM.

`v6e-8`, one `ct6e-standard-8t` VM, is the default and the tutorial's path (`tpu-grpo:machineType` picks the VM's
row). A slice (`tpu-grpo:slice`) is several `ct6e-standard-4t` hosts of 4 chips each in one ICI domain, which GKE
places together (`placement_policy` COMPACT with the slice's topology); MaxText 0.2.3 runs RL on more than one host
only under Pathways. The slice rows are xpk 1.16.0's v6e shapes from 16 chips up; on GKE xpk also offers a 2-host
v6e-8, which this project leaves to the one VM. Both the Pulumi program and the MaxText jobs (the `TPU_*`
environment the tutorial exports) read the numbers here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: HBM of one v6e chip, in GB (Google's Cloud TPU v6e page: 32 GB a chip).
HBM_GB_PER_CHIP = 32


@dataclass(frozen=True)
class Accelerator:
    name: str  # the accelerator type: v6e-CHIPS
    topology: str  # XxY
    machine_type: str  # the one VM's, or each slice host's
    chips_per_host: int

    @property
    def accelerator_type(self) -> str:
        return self.name

    @property
    def chips(self) -> int:
        x, y = map(int, self.topology.split("x"))
        return x * y

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def hbm_gb(self) -> int:
        return self.chips * HBM_GB_PER_CHIP

    def tpu_env(self) -> dict[str, str]:
        """The TPU topology variables the tutorial exports before `train_rl` (a one-host shape's)."""
        x, y = self.topology.split("x")
        return {
            "TPU_ACCELERATOR_TYPE": self.name,
            "TPU_TOPOLOGY": self.topology,
            "TPU_CHIPS_PER_HOST_BOUNDS": f"{x},{y},1",
            "TPU_HOST_BOUNDS": "1,1,1",
            "CHIPS_PER_VM": str(self.chips),
        }

    def pool(self, cluster: str, index: int) -> str:
        """The TPU node pool of slice `index` (xpk's names: CLUSTER-np-0, -np-1, ...)."""
        return f"{cluster}-np-{index}"

    @property
    def pathways_instance_type(self) -> str:
        """The resource manager's `--instance_type`."""
        return f"tpuv6e:{self.topology}"


ACCELERATORS: dict[str, Accelerator] = {
    row.name: row
    for row in (
        Accelerator("v6e-1", "1x1", "ct6e-standard-1t", 1),
        Accelerator("v6e-4", "2x2", "ct6e-standard-4t", 4),
        Accelerator("v6e-8", "2x4", "ct6e-standard-8t", 8),
        Accelerator("v6e-16", "4x4", "ct6e-standard-4t", 4),
        Accelerator("v6e-32", "4x8", "ct6e-standard-4t", 4),
        Accelerator("v6e-64", "8x8", "ct6e-standard-4t", 4),
        Accelerator("v6e-128", "8x16", "ct6e-standard-4t", 4),
        Accelerator("v6e-256", "16x16", "ct6e-standard-4t", 4),
    )
}
#: The one VM's machine types (`tpu-grpo:machineType`) and the multi-host slices (`tpu-grpo:slice`).
MACHINES: dict[str, Accelerator] = {row.machine_type: row for row in ACCELERATORS.values() if row.hosts == 1}
SLICES: dict[str, Accelerator] = {row.name: row for row in ACCELERATORS.values() if row.hosts > 1}

ONE_VM = "v6e-8"
#: A slice's host machine type and its chips, from the slice rows (all alike).
HOST_MACHINE_TYPE, CHIPS_PER_HOST = next((row.machine_type, row.chips_per_host) for row in SLICES.values())
#: GKE's node label for v6e slice hosts (cloud.google.com/gke-tpu-accelerator).
GKE_ACCELERATOR = "tpu-v6e-slice"
#: The CPU host of the Pathways head (its proxy, resource manager and the trainer process) and of the
#: conversion and export jobs; xpk's default for `cluster create-pathways`.
CPU_MACHINE_TYPE = "n2-standard-64"
CPU_POOL = "cpu-np"  # xpk's name for it
#: What one pod on the CPU host may hold: n2-standard-64's 256 GB less what GKE keeps for the kubelet and the system
#: (about 12 GiB by its formula for a 256 GB node) and its system pods.
CPU_POD_MEMORY_GB = 230
#: The CPU host's boot disk: GKE's default (100 GB) at least; the conversion's download (the pod's /tmp is on it)
#: and this much beside it for the post-training image and the system.
CPU_POOL_MIN_DISK_GB, CPU_POOL_SYSTEM_GB = 100, 60
#: Slices one stack may declare (`tpu-grpo:numSlices`): each is one TPU node pool.
MAX_SLICES = 4

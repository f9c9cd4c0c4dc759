"""The TPU machine table: one row per Compute Engine machine type we can run on.

Both the Pulumi program (chips and topology as stack outputs) and the MaxText jobs (the
`TPU_*` environment the tutorial exports) read it from here, so the numbers live once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    machine_type: str
    accelerator_type: str
    chips: int
    topology: str
    chips_per_host_bounds: str
    host_bounds: str

    def tpu_env(self) -> dict[str, str]:
        """The TPU topology variables the tutorial exports before `train_rl`."""
        return {
            "TPU_ACCELERATOR_TYPE": self.accelerator_type,
            "TPU_TOPOLOGY": self.topology,
            "TPU_CHIPS_PER_HOST_BOUNDS": self.chips_per_host_bounds,
            "TPU_HOST_BOUNDS": self.host_bounds,
            "CHIPS_PER_VM": str(self.chips),
        }


MACHINES: dict[str, Machine] = {
    m.machine_type: m
    for m in (
        Machine("ct6e-standard-1t", "v6e-1", 1, "1x1", "1,1,1", "1,1,1"),
        Machine("ct6e-standard-4t", "v6e-4", 4, "2x2", "2,2,1", "1,1,1"),
        Machine("ct6e-standard-8t", "v6e-8", 8, "2x4", "2,4,1", "1,1,1"),
    )
}

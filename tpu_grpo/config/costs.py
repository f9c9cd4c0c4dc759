"""What a stack's resources cost while they exist, from the catalogue's prices: its disks (the chips' price is
settings.Settings.usd_per_hour)."""

from __future__ import annotations

from typing import Any

from tpu_grpo.catalog.capacity import (
    HOURS_PER_MONTH,
    HYPERDISK_USD_PER_GIB_MONTH,
    HYPERDISK_USD_PER_IOPS_MONTH,
    HYPERDISK_USD_PER_MIBPS_MONTH,
    PD_BALANCED_USD_PER_GB_MONTH,
    SNAPSHOT_USD_PER_GB_MONTH,
)
from tpu_grpo.catalog.stores import INCLUDED_IOPS, INCLUDED_THROUGHPUT_MIBPS


def disks(settings) -> list[dict[str, Any]]:
    """Each disk the stack pays for while it exists, with its size and price per hour: the VM's boot and data disks
    (Hyperdisk Balanced) and a move's snapshot, or a slice's TPU hosts' boot disks (Hyperdisk Balanced) and its CPU
    host's (balanced persistent disk, sized for the model's conversion)."""
    if settings.tpu_slice:
        hosts = settings.tpu_slice.hosts * settings.num_slices
        found = [
            (
                f"boot disks of the {hosts} TPU hosts",
                settings.boot_disk_gb * hosts,
                "",
                HYPERDISK_USD_PER_GIB_MONTH,
                0.0,
            ),
            ("boot disk of the CPU host", settings.cpu_pool_disk_gb, "", PD_BALANCED_USD_PER_GB_MONTH, 0.0),
        ]
    else:
        iops, throughput = settings.data_disk_iops, settings.data_disk_throughput_mibps
        performance_usd_per_month = (iops - INCLUDED_IOPS) * HYPERDISK_USD_PER_IOPS_MONTH + (
            throughput - INCLUDED_THROUGHPUT_MIBPS
        ) * HYPERDISK_USD_PER_MIBPS_MONTH
        found = [
            ("boot disk", settings.boot_disk_gb, "", HYPERDISK_USD_PER_GIB_MONTH, 0.0),
            (
                "data disk",
                settings.data_disk_gb,
                f"{iops} IOPS, {throughput} MiB/s provisioned",
                HYPERDISK_USD_PER_GIB_MONTH,
                performance_usd_per_month,
            ),
        ]
        if settings.here.moved_from:  # kept (protected) as long as the stack says where the disk came from
            found.append(("the move's snapshot, at most", settings.data_disk_gb, "", SNAPSHOT_USD_PER_GB_MONTH, 0.0))
    return [
        {
            "disk": name,
            "gb": gb,
            "performance": performance,
            "performance_usd_per_hour": round(performance_usd_per_month / HOURS_PER_MONTH, 4),
            "usd_per_hour": round((gb * usd_per_gb_month + performance_usd_per_month) / HOURS_PER_MONTH, 4),
        }
        for name, gb, performance, usd_per_gb_month, performance_usd_per_month in found
    ]

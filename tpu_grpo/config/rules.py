"""The rules between settings, after each key's own (`keys.py`): what a capacity takes and fills in, the store and
its defaults, the slice and its shape, and the model that must fit the machine or slice."""

from __future__ import annotations

import ipaddress
from typing import Any

from tpu_grpo.catalog.accelerators import HOST_MACHINE_TYPE, MACHINES, ONE_VM, SLICES
from tpu_grpo.catalog.capacity import CAPACITIES, Capacity
from tpu_grpo.catalog.capacity import DEFAULT as DEFAULT_CAPACITY
from tpu_grpo.catalog.models import MODELS
from tpu_grpo.catalog.stores import store_for
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.keys import KEY, PROJECT


def check_capacity(values: dict[str, Any]) -> None:
    """The settings that only some capacities take; fills in the capacity's defaults."""
    capacity = values["capacity"] = values["capacity"] or DEFAULT_CAPACITY
    row = CAPACITIES[capacity]
    reservation, hours = KEY[f"{PROJECT}:reservation"], KEY[f"{PROJECT}:maxRunHours"]
    booking = next(name for name, other in CAPACITIES.items() if other.needs_reservation)
    limited = ", ".join(name for name, other in CAPACITIES.items() if other.run_limited)
    if row.needs_reservation and not values["reservation"]:
        raise SettingsError(
            reservation.name,
            None,
            f"is not set, and capacity {capacity} needs it",
            f"{reservation.set_command()} (or another capacity: pulumi config set {PROJECT}:capacity spot)",
        )
    if not row.needs_reservation and values["reservation"]:
        raise SettingsError(
            reservation.name,
            values["reservation"],
            f"is set, but capacity {capacity} uses no reservation",
            f"pulumi config rm {reservation.name} (or pulumi config set {PROJECT}:capacity {booking})",
        )
    if row.run_limited and values["maxRunHours"] is None:
        raise SettingsError(
            hours.name, None, f"is not set, and a {capacity} VM needs its maximum run time", hours.set_command()
        )
    if not row.run_limited and values["maxRunHours"] is not None:
        raise SettingsError(
            hours.name,
            values["maxRunHours"],
            f"is set, but only {limited} VMs have a maximum run time (capacity is {capacity})",
            f"pulumi config rm {hours.name}",
        )
    if values["idleStopMinutes"] is None:
        values["idleStopMinutes"] = row.idle_stop_minutes
    check_store(values, row)


def check_store(values: dict[str, Any], capacity: Capacity) -> None:
    """The checkpoint store, how often it is written, and the data disk's performance: defaults that fit
    the capacity."""
    store = KEY[f"{PROJECT}:checkpointStore"]
    values["checkpointStore"] = values["checkpointStore"] or capacity.checkpoint_store
    if values["checkpointStore"] == "shm" and capacity.shm_refused_because:
        raise SettingsError(
            store.name,
            "shm",
            f"loses the run with capacity {capacity.name}: {capacity.shm_refused_because}",
            f"{store.set_command('disk')} (or `pulumi config rm {store.name}`: {capacity.checkpoint_store} is this "
            "capacity's default)",
        )
    chosen = store_for(values["checkpointStore"])
    if values["bucket"] and chosen.name != "gs":
        bucket = KEY[f"{PROJECT}:bucket"]
        raise SettingsError(
            bucket.name,
            True,
            f"asks for a bucket, but checkpointStore is {chosen.name}",
            f"{store.set_command('gs://YOUR_BUCKET/runs')} (or pulumi config rm {bucket.name})",
        )
    values["dataDiskIops"] = values["dataDiskIops"] or chosen.disk_iops
    values["dataDiskThroughputMibps"] = values["dataDiskThroughputMibps"] or chosen.disk_throughput_mibps


def check_model(values: dict[str, Any]) -> None:
    """The export name fits the model, and the model fits the machine or slice: the memory arithmetic, and the smallest
    shape that holds it."""
    row = MODELS.get(values["model"])
    if row is not None and row.eager_load_method and values["lazyLoadTensors"]:
        lazy = KEY[f"{PROJECT}:lazyLoadTensors"]
        raise SettingsError(
            lazy.name,
            True,
            f"cannot convert {row.name}: MaxText's to_maxtext converts it only with "
            f"the {row.eager_load_method} eager loader",
            f"pulumi config set {lazy.name} false",
        )
    shape = SLICES.get(values["slice"]) or MACHINES.get(values["machineType"])  # both filled in by check_slice
    if row is None or shape is None:  # a placeholder, still to set (settings.pending)
        return
    export = KEY[f"{PROJECT}:exportModel"]
    values["exportModel"] = values["exportModel"] or row.export_model
    if values["exportModel"] not in {row.name, row.export_model}:
        raise SettingsError(
            export.name,
            values["exportModel"],
            f"is not a name of model {row.name} for "
            f"to_huggingface ({' or '.join(sorted({row.name, row.export_model}))})",
            f"pulumi config rm {export.name} (the model table's: {row.export_model})",
        )
    slices = values["numSlices"]  # 1 for the one VM (check_slice)
    if not row.fits(shape, slices):
        _, _, arithmetic = row.need_gb(shape, slices)
        smallest = row.smallest
        fix = (
            f"pulumi config set {PROJECT}:machineType {smallest.machine_type}"
            if smallest.hosts == 1
            else f"pulumi config set {PROJECT}:slice {smallest.name} (docs/slices.md)"
        )
        name = f"{shape.name} x{slices}" if slices > 1 else shape.name
        raise SettingsError(
            KEY[f"{PROJECT}:model"].name,
            row.name,
            f"does not fit a {name}: {arithmetic}; the smallest v6e that holds it is a {smallest.name}",
            fix,
        )


#: The names the stack makes of vmName for the one VM (infra/common.py, infra/tpu_host.py: its network, subnetwork,
#: firewall, data disk, and a moved disk's snapshot, `-data-` and 8 hex digits), each a Compute Engine name of at most
#: 63 characters; and for a slice, its GKE cluster and node pools (`-np-N`: catalog/accelerators.py), at most 40
#: (GKE's "Creating a zonal cluster": a cluster name has at most 40 characters; a node pool's name, the same).
VM_SUFFIXES = ("-net", "-subnet", "-ssh", "-data", "-data-" + "0" * 8)
MAX_GCE_NAME, MAX_GKE_NAME = 63, 40


def check_names(values: dict[str, Any]) -> None:
    """Every name made of vmName fits its resource's rule: refused now, not by the cloud midway through `up`."""
    name = values["vmName"]
    if not isinstance(name, str):
        return
    if values["slice"] in SLICES:
        longest, most, made = f"{name}-np-{(values['numSlices'] or 1) - 1}", MAX_GKE_NAME, "its GKE node pools"
    else:
        longest, most, made = name + max(VM_SUFFIXES, key=len), MAX_GCE_NAME, "its data disk's snapshot"
    if len(longest) > most:
        key = KEY[f"{PROJECT}:vmName"]
        raise SettingsError(
            key.name,
            name,
            f"is too long: {made} would be named {longest!r}, {len(longest)} characters, where at most {most} are "
            "taken",
            key.set_command(name[: len(name) - (len(longest) - most)].rstrip("-")),
        )


def check_slice(values: dict[str, Any]) -> None:
    """A multi-host slice runs under Pathways on GKE, with its runs in a bucket; the one VM takes no slice count."""
    named = values["slice"]
    shape = values["slice"] = named or ONE_VM
    count = KEY[f"{PROJECT}:numSlices"]
    machine = MACHINES.get(values["machineType"])
    if named == ONE_VM and machine and machine.name != ONE_VM:
        raise SettingsError(
            KEY[f"{PROJECT}:slice"].name,
            shape,
            f"is the one VM of 8 chips, but machineType {values['machineType']} is a {machine.name}",
            f"pulumi config rm {PROJECT}:slice (the "
            f"one VM of machineType), or pulumi config set {PROJECT}:machineType "
            f"{next(m for m, row in MACHINES.items() if row.name == ONE_VM)}",
        )
    if shape == ONE_VM:
        if values["numSlices"] is not None:
            raise SettingsError(
                count.name,
                values["numSlices"],
                f"is set, but slice {ONE_VM} is one VM",
                f"pulumi config rm {count.name} (or pulumi config set {PROJECT}:slice v6e-16)",
            )
        values["numSlices"] = 1
        return
    values["numSlices"] = values["numSlices"] or 1
    values["machineType"] = HOST_MACHINE_TYPE
    if not values["usePathways"]:
        pathways = KEY[f"{PROJECT}:usePathways"]
        raise SettingsError(
            pathways.name,
            False,
            f"but slice {shape} has several hosts, and MaxText 0.2.3 runs RL on several hosts only under Pathways",
            pathways.set_command("true"),
        )
    if store_for(values["checkpointStore"]).name != "gs":
        store = KEY[f"{PROJECT}:checkpointStore"]
        raise SettingsError(
            store.name,
            values["checkpointStore"],
            f"is not a bucket, and the pods of slice {shape} share no disk (and are gone when their job ends)",
            f"{store.set_command('gs://YOUR_BUCKET/runs')} "
            f"(and pulumi config set {PROJECT}:bucket true to declare it here)",
        )


def open_to_everyone(ranges: list) -> list[str]:
    """The ranges that together admit every IPv4 or every IPv6 address (0.0.0.0/0, or 0.0.0.0/1 with 128.0.0.0/1);
    a placeholder is none of them."""
    networks = []
    for cidr in ranges:
        try:
            networks.append((str(cidr), ipaddress.ip_network(str(cidr), strict=True)))
        except ValueError:
            continue
    wide = []
    for version in (4, 6):
        given = [(text, net) for text, net in networks if net.version == version]
        merged = list(ipaddress.collapse_addresses(net for _, net in given))  # type: ignore[type-var]
        if merged and merged[0].prefixlen == 0:  # said by the /0 itself, else by the ranges that add up to it
            wide += [text for text, net in given if net.prefixlen == 0] or [text for text, _ in given]
    return wide

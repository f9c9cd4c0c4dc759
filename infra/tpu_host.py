"""The TPU host as a Pulumi ComponentResource: the tutorial's `gcloud compute instances
create` (section 2), flag for flag, plus what a VM that outlives its reservation needs: a
data disk GCE will not delete with it, SSH for one key from known ranges only, on a
network of its own, and (when asked) the bucket that holds its checkpoints.

The tutorial's flag values are the constants below and the capacity table
(`tpu_grpo/catalog/capacity.py`); `gcloud_create_command` renders the same values back as the
command the tutorial types, so the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import cast

import pulumi
import pulumi_gcp as gcp

from infra.common import (
    HOST_COMPONENT,
    SLICE_COMPONENT,
    account_member,
    declare_bucket,
    declare_network,
    labels,
    switched_from,
)
from tpu_grpo.catalog.capacity import RESERVATION_KEY
from tpu_grpo.config.settings import Settings

# The tutorial's flags (section 2); its scheduling flags are the capacity table's `reservation` row.
IMAGE_PROJECT = "ubuntu-os-accelerator-images"
IMAGE_FAMILY = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
#: The provider stores the image the family resolved to and does not see it as a member of this family
#: (terraform-provider-google's diskImageFamilyEquals expects `-amd64` at the family's end, not in its
#: middle), and the boot disk forces replacement: without this, a later `pulumi up` deletes the VM, its
#: boot disk (the venv) and /dev/shm for a newer image. The image the VM booted is the `boot_image` output.
IGNORED_CHANGES = ["bootDisk.initializeParams.image"]
#: What Compute Engine changes only on a stopped VM (terraform-provider-google refuses them on a running one
#: without allow_stopping_for_update). A TPU VM is never stopped and started again (tpu_grpo/catalog/capacity.py,
#: `after_stop`), so a change to any of these replaces it, as `invoke plan` and `invoke up` say first.
REPLACED_ON_CHANGES = [
    "machineType",
    "serviceAccount",
    "scheduling",
    "networkInterfaces[*].network",
    "networkInterfaces[*].subnetwork",
]

#: terraform-provider-google's create timeout of an instance (resource_compute_instance.go:
#: `Create: schema.DefaultTimeout(20 * time.Minute)`), to which a request that may wait for capacity adds its wait.
#: On a timeout the provider clears the resource's id (`d.SetId("")`) while Compute Engine goes on with the request,
#: so a VM that comes later exists outside Pulumi's state (tpu_grpo/cloud/stack.py finds it).
CREATE_TIMEOUT_MINUTES = 20

#: What a data disk was made from: a snapshot when it was moved (`--move-disk`), which later updates no longer declare.
DISK_ORIGIN = ["snapshot"]

# Beyond the tutorial.
DISK_TYPE = "hyperdisk-balanced"  # v6e takes Hyperdisk only; pd-* is refused
DATA_DEVICE_NAME = "data"
DATA_DISK_DEVICE = f"/dev/disk/by-id/google-{DATA_DEVICE_NAME}"
SCOPES = (  # Cloud Storage for checkpoints and models; logs and metrics for the ops agent
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring.write",
)


def data_disk_name(vm_name: str) -> str:
    """The data disk's name, its Pulumi name too: a new vmName is a new disk, the old one deleted."""
    return f"{vm_name}-data"


def moved_snapshot_name(vm_name: str, moved_from: str) -> str:
    """The snapshot a moved data disk was made from: named by the zone it left (a digest, short enough for any
    vmName: keys.DERIVED_SUFFIXES), as snapshot names are the project's (a later move from another zone makes a new
    one before the old goes)."""
    return f"{vm_name}-data-{hashlib.sha256(moved_from.encode()).hexdigest()[:8]}"


def ssh_tag(settings: Settings) -> str:
    return f"{settings.vm_name}-ssh"


class TpuHost(pulumi.ComponentResource):
    """A reservation-bound TPU VM with its data disk, network, firewall and outputs."""

    def __init__(self, settings: Settings, opts: pulumi.ResourceOptions | None = None):
        super().__init__(HOST_COMPONENT, settings.vm_name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        shared = pulumi.ResourceOptions.merge(child, switched_from(settings, SLICE_COMPONENT))
        resource_labels = labels(settings)

        network, subnetwork = declare_network(settings, shared)
        self.firewall = gcp.compute.Firewall(
            f"{settings.vm_name}-ssh",
            name=f"{settings.vm_name}-ssh",
            network=network,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": ["22"]}],
            source_ranges=list(settings.ssh_source_ranges),
            target_tags=[ssh_tag(settings)],
            project=settings.project,
            opts=child,
        )
        # Moved to this zone by `invoke up` (tpu-grpo:placed.movedFrom): made from a snapshot of the disk it had
        # there, which Pulumi takes before it deletes that disk (the new disk's inputs wait for the snapshot's self
        # link). Protected, as the disk is: while the new disk is not made, the snapshot is the only copy. Each move's
        # snapshot is a resource of its own (named by the zone it left): were a second move a replacement of the
        # first's, the engine would delete the disk first, as a dependent of the snapshot it was made from
        # (delete-before-replace, step_generator.go's calculateDependentReplacements), before snapshotting it.
        moved_from = settings.here.moved_from
        self.snapshot = (
            gcp.compute.Snapshot(
                moved_snapshot_name(settings.vm_name, moved_from),
                name=moved_snapshot_name(settings.vm_name, moved_from),
                source_disk=data_disk_name(settings.vm_name),
                zone=moved_from,
                labels=resource_labels,
                project=settings.project,
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(protect=True)),
            )
            if moved_from
            else None
        )
        # Its own resource, attached but not auto-deleted: it survives the reservation's end. Its
        # provisioned throughput writes a checkpoint of the `disk` store in well under a minute. Protected: the
        # engine refuses any update or destroy that would delete or replace it (Pulumi's `protect`), until
        # tpu-grpo's own checks release it for one update (tpu_grpo/cloud/stack.py, `released`). The snapshot it
        # was made from is how it was created, not a setting: a later update without it keeps the disk
        # (the provider's `snapshot` is ForceNew, resource_compute_disk.go).
        self.data_disk = gcp.compute.Disk(
            data_disk_name(settings.vm_name),
            name=data_disk_name(settings.vm_name),
            type=DISK_TYPE,
            size=settings.data_disk_gb,
            zone=settings.zone,
            labels=resource_labels,
            provisioned_iops=settings.data_disk_iops,
            provisioned_throughput=settings.data_disk_throughput_mibps,
            snapshot=self.snapshot.self_link if self.snapshot else None,
            project=settings.project,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(protect=True, ignore_changes=DISK_ORIGIN)),
        )
        if settings.bucket:
            self.bucket = declare_bucket(settings, shared, account_member(settings))
        obtained = settings.obtained
        scheduling = cast(
            gcp.compute.InstanceSchedulingArgsDict,  # the capacity table's scheduling arguments
            {**obtained.scheduling, "provisioning_model": obtained.provisioning_model},
        )
        if settings.max_run_hours is not None:
            scheduling["max_run_duration"] = {"seconds": settings.max_run_hours * 3600}
        affinity: gcp.compute.InstanceReservationAffinityArgsDict | None = None
        if obtained.affinity == "SPECIFIC_RESERVATION":
            assert settings.reservation, "settings refuse this capacity without a reservation"
            affinity = {
                "type": obtained.affinity,
                "specific_reservation": {"key": RESERVATION_KEY, "values": [settings.reservation]},
            }
        elif obtained.affinity:
            affinity = {"type": obtained.affinity}
        boot_disk: gcp.compute.InstanceBootDiskArgsDict = {
            "auto_delete": True,
            "initialize_params": {
                "image": f"{IMAGE_PROJECT}/{IMAGE_FAMILY}",
                "size": settings.boot_disk_gb,
                "type": DISK_TYPE,
            },
        }
        data_disk: gcp.compute.InstanceAttachedDiskArgsDict = {
            "source": self.data_disk.id,
            "device_name": DATA_DEVICE_NAME,
            "mode": "READ_WRITE",
        }
        interface: gcp.compute.InstanceNetworkInterfaceArgsDict = {
            "network": network,
            "subnetwork": subnetwork,
            "access_configs": [{}],
        }
        account: gcp.compute.InstanceServiceAccountArgsDict = {
            "email": settings.service_account,
            "scopes": list(SCOPES),
        }
        self.instance = gcp.compute.Instance(
            settings.vm_name,
            name=settings.vm_name,
            zone=settings.zone,
            machine_type=settings.machine_type,
            boot_disk=boot_disk,
            attached_disks=[data_disk],
            scheduling=scheduling,
            reservation_affinity=affinity,
            network_interfaces=[interface],
            tags=[ssh_tag(settings)],
            metadata={
                "ssh-keys": f"{settings.ssh_user}:{settings.ssh_public_key}",
                "enable-oslogin": "FALSE",  # OS Login would ignore the ssh-keys entry
            },
            service_account=account,
            labels=resource_labels,
            deletion_protection=False,
            project=settings.project,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    ignore_changes=IGNORED_CHANGES,
                    replace_on_changes=REPLACED_ON_CHANGES,
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{CREATE_TIMEOUT_MINUTES + obtained.wait_minutes}m"),
                ),
            ),
        )
        nic = self.instance.network_interfaces[0]
        machine = settings.machine
        self.outputs = {
            "name": self.instance.name,
            "zone": settings.zone,
            "project": settings.project,
            "external_ip": nic.access_configs[0].nat_ip,
            "internal_ip": nic.network_ip,
            "ssh_user": settings.ssh_user,
            "data_disk_device": DATA_DISK_DEVICE,
            "machine_type": machine.machine_type,
            "capacity": settings.capacity,
            "max_run_hours": settings.max_run_hours,
            "service_account": settings.service_account,
            "checkpoint_store": settings.store.root,
            "boot_image": self.instance.boot_disk.initialize_params.image,
            "status": self.instance.current_status,
            "accelerator_type": machine.accelerator_type,
            "chips": machine.chips,
            "topology": machine.topology,
        }
        self.register_outputs(self.outputs)


def gcloud_create_command(settings: Settings) -> list[str]:
    """The `gcloud compute instances create` that makes the same VM: the tutorial's flags
    first, in its order, then the flags for what this project adds."""
    ssh_key = f"{settings.ssh_user}:{settings.ssh_public_key or '<' + settings.ssh_public_key_path + '>'}"
    network = [f"--network={settings.network or settings.vm_name + '-net'}"]
    if settings.subnetwork or not settings.network:
        network.append(f"--subnet={settings.subnetwork or settings.vm_name + '-subnet'}")
    service_account = [f"--service-account={settings.service_account}"] if settings.service_account else []
    return [
        "gcloud",
        "compute",
        "instances",
        "create",
        settings.vm_name,
        f"--zone={settings.zone}",
        f"--project={settings.project}",
        f"--machine-type={settings.machine_type}",
        f"--image-project={IMAGE_PROJECT}",
        f"--image-family={IMAGE_FAMILY}",
        f"--boot-disk-size={settings.boot_disk_gb}GB",
        *settings.obtained.gcloud_flags(settings.reservation, settings.max_run_hours),
        f"--boot-disk-type={DISK_TYPE}",
        f"--disk=name={settings.vm_name}-data,device-name={DATA_DEVICE_NAME},mode=rw,auto-delete=no",
        *network,
        f"--tags={ssh_tag(settings)}",
        dict_flag("metadata", {"enable-oslogin": "FALSE", "ssh-keys": ssh_key}),
        "--labels=" + ",".join(f"{k}={v}" for k, v in labels(settings).items()),
        *service_account,
        "--scopes=" + ",".join(SCOPES),
    ]


def dict_flag(name: str, values: dict[str, str]) -> str:
    """A gcloud dictionary flag: `--NAME=k1=v1,k2=v2`, or with a delimiter that no value holds (`--NAME=^;^k1=v1;k2=v2`,
    `gcloud topic escaping`) when one holds a comma (an SSH key's comment may)."""
    text = "".join(f"{key}={value}" for key, value in values.items())
    # gcloud takes any delimiter between the carets: a run of `#` longer than any in the text is always free
    delimiter = next(each for each in (",", ";", "|", "~", "::", "#" * (text.count("#") + 1)) if each not in text)
    items = delimiter.join(f"{key}={value}" for key, value in values.items())
    return f"--{name}={items}" if delimiter == "," else f"--{name}=^{delimiter}^{items}"


def render_command(argv: list[str]) -> str:
    """A copy-pasteable multi-line shell command: the command and what it names on the first line, a flag a line."""
    words = next((i for i, arg in enumerate(argv) if arg.startswith("--")), len(argv))
    head = " ".join(shlex.quote(a) for a in argv[:words])
    return " \\\n    ".join([head, *(shlex.quote(a) for a in argv[words:])])

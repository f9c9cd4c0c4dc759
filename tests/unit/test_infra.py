"""The Pulumi program under Pulumi's mocks: every flag of the tutorial's gcloud command, on
the inputs `pulumi up` would send, plus the disks, firewall, network and outputs."""

from __future__ import annotations

import re
import shlex

import pulumi
import pytest

from infra import offline
from infra.tpu_host import gcloud_create_command, render_command
from tests.support import TUTORIAL, run_entry_point
from tpu_grpo.config import keys
from tpu_grpo.config.settings import parse


def declared(stack_values, **overrides):
    mocks = offline.RecordingMocks(computed={"external_ip": "34.1.2.3", "internal_ip": "10.130.0.2"})
    settings, resources, outputs = offline.run({**stack_values, **overrides}, "dev", mocks=mocks)
    by_type = {}
    for resource in resources:
        by_type.setdefault(resource.type.split(":")[-1], []).append(resource)
    return settings, by_type, outputs


@pytest.fixture
def program(stack_values):
    return declared(stack_values)


@pytest.fixture
def vm(program):
    [instance] = program[1]["Instance"]
    return instance.inputs


def tutorial_create_command() -> list[str]:
    """Section 2's `gcloud compute instances create`, as argv, from the tutorial itself."""
    text = TUTORIAL.read_text()
    block = re.search(r"```\n(gcloud compute instances create.*?)\ngcloud compute ssh", text, re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_machine_type_project_and_zone(vm):
    assert vm["machineType"] == "ct6e-standard-8t"
    assert vm["project"] == "grpo-lab-123"
    assert vm["zone"] == "us-east5-b"
    assert vm["name"] == "tpu-grpo"


def test_boot_image_is_the_tutorials_family(vm):
    params = vm["bootDisk"]["initializeParams"]
    assert params["image"] == "ubuntu-os-accelerator-images/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


def test_boot_disk_is_200_gb_of_hyperdisk(vm):
    params = vm["bootDisk"]["initializeParams"]
    assert params["size"] == 200
    assert params["type"] == "hyperdisk-balanced"


def test_scheduling_is_reservation_bound_and_deleted_at_the_end(vm):
    assert vm["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "instanceTerminationAction": "DELETE",
        "provisioningModel": "RESERVATION_BOUND",
    }


def test_reservation_affinity_names_the_reservation(vm):
    affinity = vm["reservationAffinity"]
    assert affinity["type"] == "SPECIFIC_RESERVATION"
    assert affinity["specificReservation"]["key"] == "compute.googleapis.com/reservation-name"
    assert list(affinity["specificReservation"]["values"]) == ["v6e-8-calendar"]


def test_no_persistent_disk_type_anywhere(program):
    _, by_type, _ = program
    types = [by_type["Instance"][0].inputs["bootDisk"]["initializeParams"]["type"]]
    types += [disk.inputs["type"] for disk in by_type["Disk"]]
    assert types == ["hyperdisk-balanced", "hyperdisk-balanced"]


def test_data_disk_is_its_own_resource_and_outlives_the_vm(program, vm):
    _, by_type, _ = program
    [disk] = by_type["Disk"]
    assert disk.inputs["size"] == 500
    assert disk.inputs["zone"] == "us-east5-b"
    # the reservation's default store is shm: nothing writes checkpoints to the disk, the included performance serves
    assert (disk.inputs["provisionedIops"], disk.inputs["provisionedThroughput"]) == (3000, 140)
    [attached] = vm["attachedDisks"]
    assert attached["source"] == f"(id of {disk.name})"
    assert attached["deviceName"] == "data"
    # Only the boot disk is deleted with the VM; an attached disk never is.
    assert vm["bootDisk"]["autoDelete"] is True
    assert "autoDelete" not in attached


def test_data_disk_performance_comes_from_the_stack(stack_values):
    _, by_type, _ = declared(
        stack_values, **{"tpu-grpo:dataDiskIops": "5000", "tpu-grpo:dataDiskThroughputMibps": "300"}
    )
    [disk] = by_type["Disk"]
    assert (disk.inputs["provisionedIops"], disk.inputs["provisionedThroughput"]) == (5000, 300)


@pytest.mark.parametrize(
    "store, performance", [("shm", (3000, 140)), ("disk", (10_000, 2400)), ("gs://grpo-ckpts/runs", (3000, 140))]
)
def test_data_disk_performance_is_paid_for_only_where_checkpoints_land_on_it(stack_values, store, performance):
    """Performance above Hyperdisk Balanced's included 3,000 IOPS and 140 MiB/s is billed: only the disk store, which
    writes every checkpoint to the data disk, buys it by default."""
    settings, by_type, _ = declared(stack_values, **{"tpu-grpo:checkpointStore": store})
    [disk] = by_type["Disk"]
    assert (disk.inputs["provisionedIops"], disk.inputs["provisionedThroughput"]) == performance
    assert settings.default_shown(keys.KEY["tpu-grpo:dataDiskIops"]).endswith(
        f"({settings.store.name} store's default)".replace("(", "(the ")
    )


def test_a_bucket_store_is_declared_when_asked_in_the_vms_region_private_and_kept(stack_values, monkeypatch):
    import pulumi_gcp as gcp

    options = []

    class Recorded(gcp.storage.Bucket):  # what the program asks of the bucket beyond its inputs
        def __init__(self, resource_name, *args, opts=None, **kwargs):
            options.append(opts)
            super().__init__(resource_name, *args, opts=opts, **kwargs)

    monkeypatch.setattr(gcp.storage, "Bucket", Recorded)
    _, by_type, outputs = declared(
        stack_values,
        **{
            "tpu-grpo:checkpointStore": "gs://grpo-ckpts/runs",
            "tpu-grpo:bucket": "true",
            "tpu-grpo:serviceAccount": "tpu@grpo-lab-123.iam.gserviceaccount.com",
        },
    )
    [bucket] = by_type["Bucket"]
    assert bucket.inputs == {
        "name": "grpo-ckpts",
        "location": "US-EAST5",
        "uniformBucketLevelAccess": True,
        "publicAccessPrevention": "enforced",
        "forceDestroy": False,
        "project": "grpo-lab-123",
        "labels": {"app": "tpu-grpo", "stack": "dev"},
    }
    # objects, and the bucket itself: JAX/TensorStore read it (MaxText's rl_on_multi_host.md)
    assert sorted((m.name, m.inputs["role"]) for m in by_type["BucketIAMMember"]) == [
        ("store-legacyBucketReader", "roles/storage.legacyBucketReader"),
        ("store-objectAdmin", "roles/storage.objectAdmin"),
    ]
    assert all(
        m.inputs
        == {
            "bucket": "grpo-ckpts",
            "role": m.inputs["role"],
            "member": "serviceAccount:tpu@grpo-lab-123.iam.gserviceaccount.com",
        }
        for m in by_type["BucketIAMMember"]
    )
    assert outputs["checkpoint_store"] == "gs://grpo-ckpts/runs"
    assert [opts.retain_on_delete for opts in options] == [True]  # pulumi destroy and invoke down leave it


def test_the_default_compute_account_gets_the_bucket_roles_too(stack_values):
    """No Editor is assumed for the project's default compute account (organisations since May 2024 do not grant
    it): with no tpu-grpo:serviceAccount, the account the VM runs as, read from the Compute API, gets the roles."""
    _, by_type, _ = declared(
        stack_values, **{"tpu-grpo:checkpointStore": "gs://grpo-ckpts/runs", "tpu-grpo:bucket": "true"}
    )
    assert {m.inputs["member"] for m in by_type["BucketIAMMember"]} == {
        "serviceAccount:PROJECT_NUMBER-compute@developer.gserviceaccount.com"
    }
    assert len(by_type["BucketIAMMember"]) == 2


def test_an_existing_bucket_or_another_store_declares_none(stack_values):
    for changes in ({"tpu-grpo:checkpointStore": "gs://grpo-ckpts"}, {}):
        _, by_type, outputs = declared(stack_values, **changes)
        assert "Bucket" not in by_type and "BucketIAMMember" not in by_type
    assert outputs["checkpoint_store"] == "/dev/shm"


def test_firewall_opens_only_port_22_to_the_configured_ranges(program, vm):
    _, by_type, _ = program
    [firewall] = by_type["Firewall"]
    inputs = firewall.inputs
    assert inputs["direction"] == "INGRESS"
    assert inputs["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert inputs["sourceRanges"] == ["203.0.113.7/32", "198.51.100.0/24"]
    assert "0.0.0.0/0" not in inputs["sourceRanges"]
    assert inputs["targetTags"] == list(vm["tags"]) == ["tpu-grpo-ssh"]


def test_own_network_and_subnet_by_default(program, vm):
    _, by_type, _ = program
    [network] = by_type["Network"]
    [subnet] = by_type["Subnetwork"]
    assert network.inputs["autoCreateSubnetworks"] is False
    assert subnet.inputs["region"] == "us-east5"
    assert subnet.inputs["network"] == f"(id of {network.name})"
    assert by_type["Firewall"][0].inputs["network"] == f"(id of {network.name})"
    [interface] = vm["networkInterfaces"]
    assert interface["network"] == f"(id of {network.name})"
    assert interface["subnetwork"] == f"(id of {subnet.name})"
    assert interface["accessConfigs"] == [{}]  # an ephemeral external IP


def test_existing_network_is_used_when_named(stack_values):
    _, by_type, _ = declared(stack_values, **{"tpu-grpo:network": "shared-vpc", "tpu-grpo:subnetwork": "tpu"})
    assert "Network" not in by_type and "Subnetwork" not in by_type
    assert by_type["Firewall"][0].inputs["network"] == "shared-vpc"
    interface = by_type["Instance"][0].inputs["networkInterfaces"][0]
    assert (interface["network"], interface["subnetwork"]) == ("shared-vpc", "tpu")


def test_ssh_key_in_metadata_for_the_ssh_user(vm, key_pair):
    public_key = key_pair[1].read_text().strip()
    assert vm["metadata"]["ssh-keys"] == f"ubuntu:{public_key}"
    assert vm["metadata"]["enable-oslogin"] == "FALSE"


def test_labels_and_service_account_scopes(program, vm):
    _, by_type, _ = program
    assert vm["labels"] == {"app": "tpu-grpo", "stack": "dev"}
    assert by_type["Disk"][0].inputs["labels"] == vm["labels"]
    scopes = vm["serviceAccount"]["scopes"]
    assert "https://www.googleapis.com/auth/devstorage.read_write" in scopes
    assert "email" not in vm["serviceAccount"]  # the project's default compute account


def test_named_service_account_and_extra_labels(stack_values):
    _, by_type, _ = declared(
        stack_values,
        **{
            "tpu-grpo:serviceAccount": "grpo@grpo-lab-123.iam.gserviceaccount.com",
            "tpu-grpo:labels": {"team": "ml"},
        },
    )
    vm = by_type["Instance"][0].inputs
    assert vm["serviceAccount"]["email"] == "grpo@grpo-lab-123.iam.gserviceaccount.com"
    assert vm["labels"] == {"app": "tpu-grpo", "stack": "dev", "team": "ml"}


def test_destroy_is_not_blocked(vm):
    assert vm["deletionProtection"] is False
    assert "allowStoppingForUpdate" not in vm and "desiredStatus" not in vm  # never stopped and started again


def test_outputs_give_the_invoke_side_what_it_needs(program):
    _, _, outputs = program
    assert outputs == {
        "name": "tpu-grpo",
        "zone": "us-east5-b",
        "project": "grpo-lab-123",
        "external_ip": "34.1.2.3",
        "internal_ip": "10.130.0.2",
        "ssh_user": "ubuntu",
        "data_disk_device": "/dev/disk/by-id/google-data",
        "machine_type": "ct6e-standard-8t",
        "capacity": "reservation",
        "max_run_hours": None,
        "service_account": None,
        "checkpoint_store": "/dev/shm",
        "boot_image": "ubuntu-os-accelerator-images/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
        "status": "(known after apply)",
        "accelerator_type": "v6e-8",
        "chips": 8,
        "topology": "2x4",
    }


@pytest.mark.parametrize(
    "machine_type, accelerator, chips, topology, model",
    [
        ("ct6e-standard-1t", "v6e-1", 1, "1x1", "qwen3-0.6b"),
        ("ct6e-standard-4t", "v6e-4", 4, "2x2", "qwen3-4b"),
    ],
)
def test_smaller_machines_come_from_the_same_table(stack_values, machine_type, accelerator, chips, topology, model):
    _, by_type, outputs = declared(stack_values, **{"tpu-grpo:machineType": machine_type, "tpu-grpo:model": model})
    assert by_type["Instance"][0].inputs["machineType"] == machine_type
    assert (outputs["accelerator_type"], outputs["chips"], outputs["topology"]) == (accelerator, chips, topology)


def test_gcloud_command_starts_with_the_tutorials_command_word_for_word(program):
    settings = program[0]
    tutorial = tutorial_create_command()
    filled = [
        arg.replace("${TPU_NAME}", settings.vm_name)
        .replace("${ZONE}", settings.zone)
        .replace("${PROJECT}", settings.project)
        .replace("${RESERVATION}", settings.reservation)
        for arg in tutorial
    ]
    command = gcloud_create_command(settings)
    assert command[: len(filled)] == filled
    assert command[len(filled) : len(filled) + 2] == [
        "--boot-disk-type=hyperdisk-balanced",
        "--disk=name=tpu-grpo-data,device-name=data,mode=rw,auto-delete=no",
    ]


def test_entry_point_exports_the_outputs(stack_values):
    mocks = offline.RecordingMocks()
    exported = run_entry_point(stack_values, mocks)
    assert exported["accelerator_type"] == "v6e-8"
    assert exported["data_disk_device"] == "/dev/disk/by-id/google-data"
    assert set(exported) == set(declared(stack_values)[2])
    assert "gcp:compute/instance:Instance" in {r.type for r in mocks.resources}


def test_entry_point_stops_on_a_placeholder_with_one_line_and_no_resources(stack_values):
    mocks = offline.RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_entry_point({**stack_values, "gcp:project": "YOUR_PROJECT_ID"}, mocks)
    assert mocks.resources == []
    assert str(raised.value) == (
        "gcp:project='YOUR_PROJECT_ID' is still a placeholder; fix: pulumi config set gcp:project YOUR_PROJECT_ID"
    )


def gcloud_dictionary(argument: str) -> dict[str, str]:
    """A dictionary flag's value as gcloud reads it, from `gcloud topic escaping`: items separated by commas, or by
    the DELIM a value starting `^DELIM^` names; each item a key and a value at its first '='."""
    delimiter = ","
    if argument.startswith("^") and "^" in argument[1:]:
        delimiter, argument = argument[1:].split("^", 1)
    return dict(item.split("=", 1) for item in argument.split(delimiter))


@pytest.mark.parametrize("comment", ["test@tpu-grpo", "me, my laptop; its key"])
def test_the_gcloud_command_passes_the_ssh_key_whole_whatever_its_comment(stack_values, tmp_path, comment):
    """The plan's `gcloud compute instances create`, pasted into a shell, gives gcloud the key line as written: a
    comma in the key's comment would have started another metadata item."""
    key = tmp_path / "id.pub"
    key.write_text(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2 {comment}\n")
    settings = parse({**stack_values, "tpu-grpo:sshPublicKeyPath": str(key)}, "dev", tmp_path)
    argv = shlex.split(render_command(gcloud_create_command(settings)).replace("\\\n", ""))
    [metadata] = [arg.removeprefix("--metadata=") for arg in argv if arg.startswith("--metadata=")]
    assert gcloud_dictionary(metadata) == {
        "enable-oslogin": "FALSE",
        "ssh-keys": f"{settings.ssh_user}:{key.read_text().strip()}",
    }

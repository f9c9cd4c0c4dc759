"""What `pulumi up` replaces when a setting changes, from the provider's force-new fields (infra/replacements.py):
each setting changed once, against the state the unchanged stack left; and `invoke up` refusing to delete a data
disk that holds what is nowhere else."""

from __future__ import annotations

import inspect
import json

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli, state_of
from tests.support import FLEX, SPOT, invoke

INSTANCE, DISK = "gcp:compute/instance:Instance", "gcp:compute/disk:Disk"
POOL = "gcp:container/nodePool:NodePool"
SLICE = {"tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true",
         "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs", "tpu-grpo:bucket": "true"}


def changes_after(before: dict, after: dict) -> set[tuple[str, str, str]]:
    from infra import offline, program, replacements

    state = state_of({k: v for k, v in before.items() if v is not None}, "dev")["deployment"]["resources"]
    _, declared, _ = offline.run({k: v for k, v in after.items() if v is not None}, "dev")
    return {(c.type.rsplit(":", 1)[-1], c.name, c.action)
            for c in replacements.diff(state, declared, program.REPLACE_ON_CHANGES)}


@pytest.mark.parametrize("change, replaced", [
    ({"gcp:zone": "us-east5-a"}, {("Disk", "tpu-grpo-data", "replace"), ("Instance", "tpu-grpo", "replace")}),
    ({"tpu-grpo:machineType": "ct6e-standard-4t", "tpu-grpo:model": "qwen3-4b"},
     {("Instance", "tpu-grpo", "replace")}),
    (SPOT, {("Instance", "tpu-grpo", "replace")}),
    (FLEX, {("Instance", "tpu-grpo", "replace")}),
    ({"tpu-grpo:reservation": "another-reservation"}, {("Instance", "tpu-grpo", "replace")}),
    ({"tpu-grpo:serviceAccount": "sa@grpo-lab-123.iam.gserviceaccount.com"}, {("Instance", "tpu-grpo", "replace")}),
    ({"gcp:project": "another-project-1"}, {
        ("Disk", "tpu-grpo-data", "replace"), ("Instance", "tpu-grpo", "replace"),
        ("Firewall", "tpu-grpo-ssh", "replace"), ("Network", "tpu-grpo-net", "replace"),
        ("Subnetwork", "tpu-grpo-subnet", "replace")}),
    ({"tpu-grpo:vmName": "tpu-other"}, {
        ("Disk", "tpu-grpo-data", "delete"), ("Instance", "tpu-grpo", "delete"),
        ("Firewall", "tpu-grpo-ssh", "delete"), ("Network", "tpu-grpo-net", "delete"),
        ("Subnetwork", "tpu-grpo-subnet", "delete")}),
    ({"tpu-grpo:network": "default", "tpu-grpo:subnetwork": "default"}, {
        ("Instance", "tpu-grpo", "replace"), ("Network", "tpu-grpo-net", "delete"),
        ("Subnetwork", "tpu-grpo-subnet", "delete")}),
    # updated in place: disk size and performance, the boot disk's size, SSH ranges and key, labels
    ({"tpu-grpo:dataDiskGb": "900"}, set()),
    ({"tpu-grpo:dataDiskIops": "6000", "tpu-grpo:dataDiskThroughputMibps": "600"}, set()),
    ({"tpu-grpo:bootDiskGb": "300"}, set()),
    ({"tpu-grpo:sshSourceRanges": ["192.0.2.0/24"]}, set()),
    ({"tpu-grpo:labels": {"team": "ml"}}, set()),
])
def test_each_setting_replaces_what_the_provider_says(stack_values, change, replaced):
    assert changes_after(stack_values, {**stack_values, **change}) == replaced


@pytest.mark.parametrize("change, replaced", [
    ({"tpu-grpo:slice": "v6e-32"}, {("NodePool", "tpu-grpo-np-0", "replace")}),
    (SPOT, {("NodePool", "tpu-grpo-np-0", "replace")}),
    ({"gcp:zone": "us-east5-a"}, {("Cluster", "tpu-grpo", "replace"), ("NodePool", "tpu-grpo-np-0", "replace"),
                                  ("NodePool", "tpu-grpo-cpu-np", "replace")}),
    ({"tpu-grpo:numSlices": "2"}, set()),  # one more pool, the first kept
])
def test_a_slices_settings_replace_what_the_provider_says(stack_values, change, replaced):
    before = {**stack_values, **SLICE}
    found = changes_after(before, {**before, **change})
    assert found == replaced


def test_every_force_new_field_is_an_input_pulumi_gcp_knows():
    """The table's names are Pulumi's (camelCase, lists pluralised): the first part of each is an argument of the
    pulumi-gcp resource it belongs to."""
    import re

    import pulumi_gcp as gcp

    from infra.replacements import EVERY_FIELD, FORCE_NEW

    for type_, fields in FORCE_NEW.items():
        if fields == EVERY_FIELD:
            continue
        module, name = type_.split(":")[1].split("/")[0], type_.rsplit(":", 1)[-1]
        arguments = set(inspect.signature(getattr(getattr(gcp, module), name)._internal_init).parameters)
        for field in fields:
            first = re.sub("([A-Z])", r"_\1", field.split(".")[0].split("[")[0]).lower()
            assert first in arguments, (type_, field)


def test_a_reference_changes_only_with_what_it_refers_to():
    from infra.replacements import forcing_fields

    old = {"zone": "z", "networkInterfaces": [{"network": "projects/p/global/networks/n"}]}
    new = {"zone": "z", "networkInterfaces": [{"network": "(id of n)"}]}
    rules = ("networkInterfaces[*].network",)
    assert forcing_fields(INSTANCE, old, new, set(), rules) == []
    assert forcing_fields(INSTANCE, old, new, {"n"}, rules) == [
        ("networkInterfaces[0].network", "projects/p/global/networks/n", "(id of n)")]


# ---------------------------------------------------------------- invoke plan and up against the Pulumi CLI double


def write_stack(stack_dir, values) -> None:
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": {k: v for k, v in values.items()
                                                                           if v is not None}}))


def test_plan_and_up_say_a_zone_change_deletes_the_data_disk(stack_dir, stack_values, tmp_path):
    """A disk's zone is force-new: the data disk goes, and `plan`, `up` and the double's preview all say so; the VM
    does not answer, so `up` cannot know what only the disk holds and refuses, creating nothing."""
    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "127.0.0.1", "ssh_user": "ubuntu"})
    cli.deployed(stack_values)
    write_stack(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    env = {**cli.env(), "TPU_GRPO_KNOWN_HOSTS": str(tmp_path / "known_hosts")}
    disk = ("Disk tpu-grpo-data (zone us-east5-b -> us-east5-a): the data disk is DELETED with all it holds (saved "
            "models, checkpoints, the kept conversion, the caches) and a new, empty one is made")
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)
    assert disk in plan["replaces"] and not any("stays" in line for line in plan["replaces"])
    up = invoke("up", "--yes", "--stack", "dev", cwd=stack_dir, env=env)
    assert up.returncode == 1, up.stderr
    assert f"replaces: {disk}" in up.stdout
    assert up.stderr.startswith("error: refusing to update stack 'dev': the update deletes the data disk, and the "
                                "VM does not answer")
    assert not [call for call in cli.calls() if call.startswith("up ")]


def test_the_doubles_preview_replaces_by_the_table(stack_dir, stack_values, tmp_path):
    """`pulumi up` (the double) shows the same replacements, then records the new state: a second `up` replaces
    nothing."""
    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "127.0.0.1", "ssh_user": "ubuntu"})
    cli.deployed(stack_values)
    write_stack(stack_dir, {**stack_values, **SPOT})
    first = invoke("up", "--yes", cwd=stack_dir, env=cli.env())
    assert first.returncode == 0, first.stderr
    assert "replaces: Instance tpu-grpo (" in first.stdout and "scheduling.provisioningModel" in first.stdout
    second = invoke("up", "--yes", cwd=stack_dir, env=cli.env())
    assert second.returncode == 0 and "replaces:" not in second.stdout


@pytest.mark.parametrize("extra", [{}, SLICE])
def test_the_replace_on_changes_read_are_those_the_program_gives(stack_values, extra):
    """infra/replacements.py reads the program's `replace_on_changes` from one table (the mocks never see resource
    options): each resource declared gets exactly its type's row."""
    import pulumi

    from infra import offline, program

    given = {}

    def record(args: pulumi.ResourceTransformationArgs):
        given.setdefault(args.type_, set()).add(tuple(args.opts.replace_on_changes or ()))

    values = {k: v for k, v in {**stack_values, **extra}.items() if v is not None}
    pulumi.runtime.set_mocks(offline.RecordingMocks(), project="tpu-grpo", stack="dev", preview=False)
    pulumi.runtime.set_all_config(offline.config_for_pulumi(values))

    @pulumi.runtime.test
    def run():
        component = program.TpuSlice if extra else program.TpuHost
        component(program.read_settings(configured=values), pulumi.ResourceOptions(transformations=[record]))

    run()
    for type_, seen in given.items():
        assert seen == {program.REPLACE_ON_CHANGES.get(type_, ())}, type_


@pytest.mark.parametrize("key, first, second, extra", [
    ("tpu-grpo:serviceAccount", "sa@grpo-lab-123.iam.gserviceaccount.com", "sb@grpo-lab-123.iam.gserviceaccount.com",
     {}),
    ("tpu-grpo:maxRunHours", "4", "8", FLEX),
])
def test_a_setting_set_for_the_first_time_replaces_the_vm_as_a_change_of_its_value_does(stack_values, key, first,
                                                                                         second, extra):
    """From unset to a value, as from one value to another: the VM is replaced, and plan and up say so by the field."""
    from infra import offline, program, replacements
    from tpu_grpo.cloud import stack

    def said(before: dict, after: dict) -> list[str]:
        state = state_of({k: v for k, v in before.items() if v is not None}, "dev")["deployment"]["resources"]
        _, declared, _ = offline.run({k: v for k, v in after.items() if v is not None}, "dev")
        return [stack.describe(change) for change in replacements.diff(state, declared, program.REPLACE_ON_CHANGES)]

    base = {**stack_values, **extra}
    unset_to_value = said(base, {**base, key: first})
    value_to_value = said({**base, key: first}, {**base, key: second})
    assert len(unset_to_value) == len(value_to_value) == 1
    assert unset_to_value[0].startswith("Instance tpu-grpo (") and value_to_value[0].startswith("Instance tpu-grpo (")
    assert unset_to_value[0].split("(")[1].split()[0] == value_to_value[0].split("(")[1].split()[0]  # one field
    assert unset_to_value[0].endswith(value_to_value[0].rsplit("): ", 1)[1])  # the same meaning

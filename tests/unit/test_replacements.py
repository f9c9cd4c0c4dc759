"""What `pulumi up` replaces when a setting changes, from the provider's force-new fields (infra/replacements.py):
each setting changed once, against the state the unchanged stack left; and `invoke up` refusing to delete a data
disk that holds what is nowhere else."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli, state_of
from tests.support import DATA, FLEX, ROOT, SPOT, invoke

INSTANCE, DISK = "gcp:compute/instance:Instance", "gcp:compute/disk:Disk"
POOL = "gcp:container/nodePool:NodePool"
RELEASED = DATA / "released-resources.txt"
SLICE = {
    "tpu-grpo:slice": "v6e-16",
    "tpu-grpo:usePathways": "true",
    "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
    "tpu-grpo:bucket": "true",
}


def changes_after(before: dict, after: dict) -> set[tuple[str, str, str]]:
    from infra import offline, replacements

    state = state_of({k: v for k, v in before.items() if v is not None}, "dev")["deployment"]["resources"]
    _, declared, _ = offline.run({k: v for k, v in after.items() if v is not None}, "dev")
    return {(c.type.rsplit(":", 1)[-1], c.name, c.action) for c in replacements.diff(state, declared)}


@pytest.mark.parametrize(
    "change, replaced",
    [
        ({"gcp:zone": "us-east5-a"}, {("Disk", "tpu-grpo-data", "replace"), ("Instance", "tpu-grpo", "replace")}),
        (
            {"tpu-grpo:machineType": "ct6e-standard-4t", "tpu-grpo:model": "qwen3-4b"},
            {("Instance", "tpu-grpo", "replace")},
        ),
        (SPOT, {("Instance", "tpu-grpo", "replace")}),
        (FLEX, {("Instance", "tpu-grpo", "replace")}),
        ({"tpu-grpo:reservation": "another-reservation"}, {("Instance", "tpu-grpo", "replace")}),
        ({"tpu-grpo:serviceAccount": "sa@grpo-lab-123.iam.gserviceaccount.com"}, {("Instance", "tpu-grpo", "replace")}),
        (
            {"gcp:project": "another-project-1"},
            {
                ("Disk", "tpu-grpo-data", "replace"),
                ("Instance", "tpu-grpo", "replace"),
                ("Firewall", "tpu-grpo-ssh", "replace"),
                ("Network", "tpu-grpo-net", "replace"),
                ("Subnetwork", "tpu-grpo-subnet", "replace"),
            },
        ),
        (
            {"tpu-grpo:vmName": "tpu-other"},
            {
                ("Disk", "tpu-grpo-data", "delete"),
                ("Instance", "tpu-grpo", "delete"),
                ("Firewall", "tpu-grpo-ssh", "delete"),
                ("Network", "tpu-grpo-net", "delete"),
                ("Subnetwork", "tpu-grpo-subnet", "delete"),
            },
        ),
        (
            {"tpu-grpo:network": "default", "tpu-grpo:subnetwork": "default"},
            {
                ("Instance", "tpu-grpo", "replace"),
                ("Network", "tpu-grpo-net", "delete"),
                ("Subnetwork", "tpu-grpo-subnet", "delete"),
            },
        ),
        # a smaller data disk is a new, empty one (resource_compute_disk.go: ForceNewIfChange("size", IsDiskShrinkage))
        ({"tpu-grpo:dataDiskGb": "400"}, {("Disk", "tpu-grpo-data", "replace")}),
        # updated in place: a larger disk and its performance, the boot disk's size, SSH ranges and key, labels
        ({"tpu-grpo:dataDiskGb": "1900"}, set()),
        ({"tpu-grpo:dataDiskIops": "6000", "tpu-grpo:dataDiskThroughputMibps": "600"}, set()),
        ({"tpu-grpo:bootDiskGb": "300"}, set()),
        ({"tpu-grpo:sshSourceRanges": ["192.0.2.0/24"]}, set()),
        ({"tpu-grpo:labels": {"team": "ml"}}, set()),
    ],
)
def test_each_setting_replaces_what_the_provider_says(stack_values, change, replaced):
    assert changes_after(stack_values, {**stack_values, **change}) == replaced


@pytest.mark.parametrize(
    "change, replaced",
    [
        ({"tpu-grpo:slice": "v6e-32"}, {("NodePool", "tpu-grpo-np-0", "replace")}),
        (SPOT, {("NodePool", "tpu-grpo-np-0", "replace")}),
        (
            {"gcp:zone": "us-east5-a"},
            {
                ("Cluster", "tpu-grpo", "replace"),
                ("NodePool", "tpu-grpo-np-0", "replace"),
                ("NodePool", "tpu-grpo-cpu-np", "replace"),
            },
        ),
        ({"tpu-grpo:numSlices": "2"}, set()),  # one more pool, the first kept
        # the CPU pool's disk follows the model: an update GKE applies with a new node (the Pathways head)
        (
            {"tpu-grpo:model": "qwen3-32b", "tpu-grpo:slice": "v6e-32"},
            {("NodePool", "tpu-grpo-cpu-np", "recreate nodes"), ("NodePool", "tpu-grpo-np-0", "replace")},
        ),
    ],
)
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


@pytest.mark.parametrize("extra", [{}, SPOT, FLEX, SLICE, {"tpu-grpo:bucket": "true", **SLICE}])
def test_the_table_is_the_providers_schemas_on_every_field_the_program_sets(stack_values, extra):
    """infra/replacements.py's FORCE_NEW against terraform-provider-google's own Go schemas (read apart by
    tests/doubles/provider.py): every entry is force-new there, and every force-new field the program sets is in the
    table, so that `plan`'s estimate misses no replacement the engine makes."""
    from infra import offline, replacements
    from tests.doubles import provider

    _, declared, _ = offline.run({k: v for k, v in {**stack_values, **extra}.items() if v is not None}, "dev")
    for resource in declared:
        table = replacements.FORCE_NEW.get(resource.type)
        if table is None or table == replacements.EVERY_FIELD:
            assert resource.type.startswith(("tpu-grpo:", "pulumi", "kubernetes:")) or resource.type in (
                provider.NO_UPDATE
            ), resource.type
            continue
        theirs = {path for path, _ in provider.FORCE_NEW_PATHS[resource.type]}
        assert set(table) <= theirs, (resource.type, set(table) - theirs)
        for path in theirs - set(table):
            assert not provider.values_at(resource.inputs, path.split(".")), (resource.type, path)


def test_the_engine_doubles_reading_of_the_provider_sees_what_the_table_misses(stack_values, monkeypatch):
    """The engine double decides on the provider's schemas, not on the table: a table that forgot a disk's zone
    says nothing of a zone change, while the double (and so the lifecycle's invariant) still replaces the disk."""
    from infra import offline, replacements
    from tests.doubles import provider

    state = state_of(stack_values, "dev")["deployment"]["resources"]
    _, declared, _ = offline.run({**stack_values, "gcp:zone": "us-east5-a"}, "dev")
    forgot = {**replacements.FORCE_NEW, DISK: tuple(f for f in replacements.FORCE_NEW[DISK] if f != "zone")}
    monkeypatch.setattr(replacements, "FORCE_NEW", forgot)
    assert ("Disk", "replace") not in {
        (c.type.rsplit(":", 1)[-1], c.action) for c in replacements.diff(state, declared)
    }
    assert (DISK, "tpu-grpo-data", "replace") in {(c.type, c.name, c.action) for c in provider.changes(state, declared)}


def test_a_reference_changes_only_with_what_it_refers_to():
    from infra.replacements import forcing_fields

    old = {"zone": "z", "networkInterfaces": [{"network": "projects/p/global/networks/n"}]}
    new = {"zone": "z", "networkInterfaces": [{"network": "(id of n)"}]}
    rules = ("networkInterfaces[*].network",)
    assert forcing_fields(INSTANCE, old, new, set(), rules) == []
    assert forcing_fields(INSTANCE, old, new, {"n"}, rules) == [
        ("networkInterfaces[0].network", "projects/p/global/networks/n", "(id of n)")
    ]


# ---------------------------------------------------------------- invoke plan and up against the Pulumi CLI double


def write_stack(stack_dir, values) -> None:
    (stack_dir / "Pulumi.dev.yaml").write_text(
        yaml.safe_dump({"config": {k: v for k, v in values.items() if v is not None}})
    )


def test_plan_and_up_say_a_zone_change_deletes_the_data_disk(stack_dir, stack_values, tmp_path):
    """A disk's zone is force-new: the data disk goes, and `plan`, `up` and the double's preview all say so; the VM
    does not answer, so `up` cannot know what only the disk holds and refuses, creating nothing."""
    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "127.0.0.1", "ssh_user": "ubuntu"})
    cli.deployed(stack_values)
    write_stack(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    env = {**cli.env(), "TPU_GRPO_KNOWN_HOSTS": str(tmp_path / "known_hosts")}
    disk = (
        "Disk tpu-grpo-data (zone us-east5-b -> us-east5-a): the data disk is DELETED with all it holds (saved "
        "models, checkpoints, the kept conversion, the caches) and a new, empty one is made; it is protected: `up` "
        "releases it only once every run on it is fetched or published, or to move it (--move-disk)"
    )
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)
    assert disk in plan["replaces"] and not any("stays" in line for line in plan["replaces"])
    shown = invoke("plan", cwd=stack_dir, env={**env, "COLUMNS": "400"}).stdout.splitlines()
    said = shown.index(f"replaces: {disk}")  # offline, the plan says whose answer it is: an estimate
    assert shown[said - 1] == "an estimate from the provider's rules; `invoke up` decides on Pulumi's own preview:"
    up = invoke("up", "--yes", "--stack", "dev", cwd=stack_dir, env=env)
    assert up.returncode == 1, up.stderr
    assert f"replaces: {disk}" in up.stdout
    assert up.stderr.startswith(
        "error: refusing to update stack 'dev': the update deletes the data disk, and the VM does not answer"
    )
    assert not [call for call in cli.calls() if call.startswith("up ")]


def test_the_doubles_preview_replaces_by_the_providers_schemas(stack_dir, stack_values, tmp_path):
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


def test_a_run_of_the_program_leaves_no_event_loop_open_behind_it(stack_values):
    """Pulumi's runtime runs the program on the thread's current event loop and closes none: one left open was
    collected at exit after its sockets and printed an "Exception ignored in: BaseEventLoop.__del__" traceback under
    `invoke up`'s error now and then (issue 79). Each run closes the loop it ran on."""
    values = {k: v for k, v in stack_values.items() if v is not None}
    check = (
        "import asyncio, json, sys, warnings\n"
        "from infra import offline\n"
        "offline.run(json.loads(sys.argv[1]), 'dev')\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "try:\n"
        "    left = asyncio.get_event_loop()\n"
        "except RuntimeError:\n"
        "    left = None\n"
        "print('open' if left is not None and not left.is_closed() else 'none')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, json.dumps(values)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "none", done.stderr


def test_a_run_records_each_resources_options_once_however_many_runs_went_before(stack_values):
    """Pulumi keeps stack transformations on the root stack resource, which outlives a mocked run: a run that
    registered its own would pass every later run's resources through it too, a cost that grows with each run."""
    from infra import offline

    class Counting(offline.RecordingMocks):
        calls = 0

        def record_options(self, args) -> None:
            Counting.calls += 1
            super().record_options(args)

    values = {k: v for k, v in stack_values.items() if v is not None}
    counted = []
    for _ in range(3):
        Counting.calls = 0
        offline.run(values, "dev", mocks=Counting())
        counted.append(Counting.calls)
    assert counted[0] > 0 and counted == [counted[0]] * 3


@pytest.mark.parametrize("extra", [{}, SLICE])
def test_the_options_the_engine_acts_on_are_recorded_as_the_program_gives_them(stack_values, extra):
    """The mocks see no resource options; the offline run records them from a stack transformation, which sees what
    the engine gets: what replaces the VM and a pool, the grant's earlier name, what `destroy` leaves, the VM's
    create timeout (the provider's 20 minutes, plus a flex-start request's wait), what the engine refuses to delete
    (the data disk), the changes it ignores (the boot image, the disk's snapshot, the bucket's location), and the
    other component's URN that what both declare was made under (a stack switched between one VM and a slice)."""
    from infra import offline

    values = {k: v for k, v in {**stack_values, **extra}.items() if v is not None}
    _, declared, _ = offline.run(values, "dev")
    options = {(r.type.rsplit(":", 1)[-1], r.name): r.options for r in declared}
    special = {key: option for key, option in options.items() if option != offline.Options()}
    host = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost::tpu-grpo"
    slice_ = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuSlice::tpu-grpo"
    if not extra:
        assert special == {
            ("Instance", "tpu-grpo"): offline.Options(
                (
                    "machineType",
                    "serviceAccount",
                    "scheduling",
                    "networkInterfaces[*].network",
                    "networkInterfaces[*].subnetwork",
                ),
                create_timeout="20m",
                ignore_changes=("bootDisk.initializeParams.image",),
            ),
            ("Disk", "tpu-grpo-data"): offline.Options(protect=True, ignore_changes=("snapshot",)),
            ("Network", "tpu-grpo-net"): offline.Options(alias_parents=(slice_,)),
            ("Subnetwork", "tpu-grpo-subnet"): offline.Options(alias_parents=(slice_,)),
        }
        _, flex, _ = offline.run({**values, **FLEX}, "dev")
        assert next(r for r in flex if r.type == INSTANCE).options.create_timeout == "140m"
        return
    pools = ("placementPolicy.tpuTopology",)
    assert special == {
        ("NodePool", "tpu-grpo-cpu-np"): offline.Options(pools),
        ("NodePool", "tpu-grpo-np-0"): offline.Options(pools),
        ("Network", "tpu-grpo-net"): offline.Options(alias_parents=(host,)),
        ("Subnetwork", "tpu-grpo-subnet"): offline.Options(alias_parents=(host,)),
        ("Bucket", "store"): offline.Options(
            aliases=("tpu-grpo-store",), retain_on_delete=True, ignore_changes=("location",), alias_parents=(host,)
        ),
        ("BucketIAMMember", "store-objectAdmin"): offline.Options(
            aliases=("tpu-grpo-store-objectAdmin", "tpu-grpo-store-access"), alias_parents=(host,)
        ),
        ("BucketIAMMember", "store-legacyBucketReader"): offline.Options(
            aliases=("tpu-grpo-store-legacyBucketReader",), alias_parents=(host,)
        ),
        ("Repository", "images"): offline.Options(aliases=("tpu-grpo-images",)),
        ("RepositoryIamMember", "images-reader"): offline.Options(aliases=("tpu-grpo-images-reader",)),
        ("IAMMember", "tpu-grpo-node-role"): offline.Options(retain_on_delete=True),
    }


def released(path: Path = RELEASED) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in path.read_text().splitlines() if line and not line.startswith("#")]


def test_every_name_a_release_declared_is_declared_or_aliased_still(stack_values):
    """An upgrade never makes Pulumi delete what an earlier release made: each name of tests/data/released-resources.txt
    (`{vm}`: tpu-grpo:vmName) is declared now, or is an alias of what is; and every name declared now is in the list,
    so that a rename has something to be checked against."""
    from infra import offline

    everything = {**stack_values, **SLICE, "tpu-grpo:numSlices": "2"}
    declared = [
        r
        for raw in (
            {**stack_values, "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs", "tpu-grpo:bucket": "true"},
            everything,
        )
        for r in offline.run({k: v for k, v in raw.items() if v is not None}, "dev")[1]
        if not r.type.startswith("tpu-grpo:")
    ]
    names = {(r.type, r.name) for r in declared} | {(r.type, alias) for r in declared for alias in r.options.aliases}
    listed = {(type_, name.format(vm="tpu-grpo")) for type_, name in released()}
    assert listed - names == set(), "a released name is neither declared nor aliased: give it an alias"
    assert {(r.type, r.name) for r in declared} - listed == set(), "a new name: add it to released-resources.txt"


def test_a_renamed_grant_is_the_same_grant_not_a_new_one_and_a_delete(stack_values):
    """The state of the release that named the bucket grant `{vm}-store-access`: the alias makes it the same
    resource, so `up` neither creates it anew nor deletes the old name (which would strip the binding both hold,
    tpgiamresource/resource_iam_member.go); without the alias the old name is a delete."""
    from infra import offline, replacements

    raw = {
        k: v
        for k, v in {
            **stack_values,
            "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
            "tpu-grpo:bucket": "true",
        }.items()
        if v is not None
    }
    state = state_of(raw, "dev")["deployment"]["resources"]
    for resource in state:
        if resource["urn"].endswith("::store-objectAdmin"):
            resource["urn"] = resource["urn"].replace("store-objectAdmin", "tpu-grpo-store-access")
    _, declared, _ = offline.run(raw, "dev")
    assert replacements.diff(state, declared) == []
    unaliased = [replace(r, options=replace(r.options, aliases=())) for r in declared]
    # without the alias: a delete of the very binding the new name holds, which `up` refuses
    assert [(c.name, c.action) for c in replacements.diff(state, unaliased)] == [("tpu-grpo-store-access", "strip")]


@pytest.mark.parametrize(
    "type_, path, old, new, forced",
    [
        (DISK, "size", 1000, 500, True),
        (DISK, "size", 1000.0, 1000, False),
        (DISK, "size", 500, 1000, False),
        ("gcp:compute/subnetwork:Subnetwork", "ipCidrRange", "10.130.0.0/24", "10.130.0.0/25", True),
        ("gcp:compute/subnetwork:Subnetwork", "ipCidrRange", "10.130.0.0/24", "10.131.0.0/24", True),
        ("gcp:compute/subnetwork:Subnetwork", "ipCidrRange", "10.130.0.0/24", "10.130.0.0/23", False),
        ("gcp:compute/subnetwork:Subnetwork", "ipCidrRange", "10.130.0.0/24", "not a range", False),
    ],
)
def test_the_providers_conditional_force_new_fields(type_, path, old, new, forced):
    """customdiff.ForceNewIfChange: a disk that shrinks, a subnet range that does not hold the old one."""
    from infra.replacements import forcing_fields

    assert bool(forcing_fields(type_, {path: old}, {path: new}, set())) == forced


@pytest.mark.parametrize(
    "key, first, second, extra",
    [
        (
            "tpu-grpo:serviceAccount",
            "sa@grpo-lab-123.iam.gserviceaccount.com",
            "sb@grpo-lab-123.iam.gserviceaccount.com",
            {},
        ),
        ("tpu-grpo:maxRunHours", "4", "8", FLEX),
    ],
)
def test_a_setting_set_for_the_first_time_replaces_the_vm_as_a_change_of_its_value_does(
    stack_values, key, first, second, extra
):
    """From unset to a value, as from one value to another: the VM is replaced, and plan and up say so by the field."""
    from infra import offline, replacements
    from tpu_grpo.cloud import stack

    def said(before: dict, after: dict) -> list[str]:
        state = state_of({k: v for k, v in before.items() if v is not None}, "dev")["deployment"]["resources"]
        _, declared, _ = offline.run({k: v for k, v in after.items() if v is not None}, "dev")
        return [stack.describe(change) for change in replacements.diff(state, declared)]

    base = {**stack_values, **extra}
    unset_to_value = said(base, {**base, key: first})
    value_to_value = said({**base, key: first}, {**base, key: second})
    assert len(unset_to_value) == len(value_to_value) == 1
    assert unset_to_value[0].startswith("Instance tpu-grpo (") and value_to_value[0].startswith("Instance tpu-grpo (")
    assert unset_to_value[0].split("(")[1].split()[0] == value_to_value[0].split("(")[1].split()[0]  # one field
    assert unset_to_value[0].endswith(value_to_value[0].rsplit("): ", 1)[1])  # the same meaning


@pytest.mark.parametrize("marked", [False, True])
def test_down_leaves_the_project_wide_role_whatever_release_made_the_state(stack_dir, stack_values, tmp_path, marked):
    """`roles/container.defaultNodeServiceAccount` of the default compute account is the project's, not the stack's:
    other clusters and stacks rely on it. The program retains it on delete; a state of an earlier release does not
    say so, and `pulumi destroy` acts on the state, so `down` first forgets it (`pulumi state delete`, which deletes
    nothing in the cloud). `plan` says what `down` keeps."""
    cli = PulumiCli(tmp_path / "pulumi")
    raw = {**stack_values, **SLICE}
    write_stack(stack_dir, raw)
    state = state_of({k: v for k, v in raw.items() if v is not None}, "dev")
    role = next(r for r in state["deployment"]["resources"] if r["urn"].endswith("::tpu-grpo-node-role"))
    assert role["retainOnDelete"] is True
    if not marked:  # as the release before this one recorded it
        del role["retainOnDelete"]
    (cli.folder / "state.json").write_text(json.dumps(state))
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=cli.env()).stdout)
    assert plan["kept"] == [
        "Bucket store: the checkpoint bucket and what it holds",
        "IAMMember tpu-grpo-node-role: a project-wide role of the nodes' account: other clusters of the project, or "
        "another stack, may rely on it",
    ]
    down = invoke("down", "--yes", cwd=stack_dir, env=cli.env())
    assert down.returncode == 0, down.stderr
    forgets = [call for call in cli.calls() if call.startswith("state delete")]
    assert forgets == ([] if marked else [f"state delete --stack dev --yes --target-dependents {role['urn']}"])
    assert cli.calls()[-1] == "destroy --stack dev --yes --skip-preview"
    assert json.loads((cli.folder / "state.json").read_text())["deployment"]["resources"] == []


def test_an_update_that_would_delete_a_grant_it_declares_is_refused(stack_values):
    """An upgrade and a new vmName in one `up`: the aliases name the old resources under the new vmName, so the
    earlier release's image grant (the project's repository, the same binding as the one declared now) would be
    deleted after the new one is made, stripping it (subtractFromBindings). The preview calls that a strip, and
    `up` refuses it."""
    from infra import offline, replacements
    from tpu_grpo.cloud import stack

    raw = {k: v for k, v in {**stack_values, **SLICE}.items() if v is not None}
    state = state_of(raw, "dev")["deployment"]["resources"]
    for resource in state:  # as the release before this one named it
        resource["urn"] = resource["urn"].replace("::images-reader", "::tpu-grpo-images-reader")
    _, declared, _ = offline.run({**raw, "tpu-grpo:vmName": "tpu-other"}, "dev")
    changes = replacements.diff(state, declared)
    [strip] = [change for change in changes if change.action == "strip"]
    assert strip.name == "tpu-grpo-images-reader" and stack.strips_a_grant(changes)
    assert stack.describe(strip).endswith("an IAM member's delete removes its binding): refused")
    _, same_name, _ = offline.run(raw, "dev")
    assert not stack.strips_a_grant(replacements.diff(state, same_name))  # the alias adopts it


def test_the_engines_preview_steps_read_as_changes():
    """`pulumi preview --json` as the CLI prints it (pkg/display/json.go's previewStep: op, urn, oldState, newState,
    replaceReasons, detailedDiff with each path's kind), read without the offline table: a replace named by its
    `*-replace` paths, a delete of a retained resource forgotten, one of a grant the update declares anew a strip, a
    pool's machine type updated in place as GKE recreating its nodes, and a same step nothing."""
    from infra import replacements

    disk = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:compute/disk:Disk::tpu-grpo-data"
    steps = [
        {
            "op": "replace",
            "urn": disk,
            "oldState": {"inputs": {"zone": "us-east5-b", "size": 500}},
            "newState": {"inputs": {"zone": "us-east5-a", "size": 500}},
            "replaceReasons": ["zone"],
            "detailedDiff": {"zone": {"kind": "update-replace", "inputDiff": True}, "labels": {"kind": "update"}},
        },
        {"op": "same", "urn": disk.replace("disk:Disk::tpu-grpo-data", "network:Network::tpu-grpo-net")},
        {
            "op": "delete",
            "urn": "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:storage/bucket:Bucket::store",
            "oldState": {"inputs": {"name": "b"}, "retainOnDelete": True},
        },
        {
            "op": "delete",
            "urn": "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuSlice$gcp:projects/iAMMember:IAMMember::old-role",
            "oldState": {"inputs": {"role": "r", "member": "m", "project": "p"}},
        },
        {
            "op": "update",
            "urn": "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuSlice$gcp:container/nodePool:NodePool::cpu-np",
            "oldState": {"inputs": {"nodeConfig": {"machineType": "n2-standard-32"}}},
            "newState": {"inputs": {"nodeConfig": {"machineType": "n2-standard-64"}}},
            "diffReasons": ["nodeConfig.machineType"],
        },
    ]

    class Grant:  # the update declares the same binding under another name
        type = "gcp:projects/iAMMember:IAMMember"
        inputs = {"role": "r", "member": "m", "project": "p"}

    changes = replacements.from_steps(steps, [Grant()])
    assert [(c.type.rsplit(":", 1)[-1], c.name, c.action, c.fields) for c in changes] == [
        ("Disk", "tpu-grpo-data", "replace", (("zone", "us-east5-b", "us-east5-a"),)),
        ("NodePool", "cpu-np", "recreate nodes", (("nodeConfig.machineType", "n2-standard-32", "n2-standard-64"),)),
        ("Bucket", "store", "forget", ()),
        ("IAMMember", "old-role", "strip", ()),
    ]


def test_down_forgets_an_unmarked_bucket_with_the_grants_that_depend_on_it(stack_dir, stack_values, tmp_path):
    """A state whose bucket an earlier release did not mark retained: `pulumi state delete` refuses a resource others
    depend on (state_delete.go: "... can't be safely deleted because the following resources depend on it"), here the
    bucket's grants, so `down` forgets it with them (`--target-dependents`: all stay in the cloud), then destroys."""
    cli = PulumiCli(tmp_path / "pulumi")
    raw = {**stack_values, "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs", "tpu-grpo:bucket": "true"}
    write_stack(stack_dir, raw)
    state = state_of({k: v for k, v in raw.items() if v is not None}, "dev")
    bucket = next(r for r in state["deployment"]["resources"] if r["urn"].endswith("::store"))
    del bucket["retainOnDelete"]  # as a release before the bucket was retained recorded it
    grants = [r["urn"] for r in state["deployment"]["resources"] if bucket["urn"] in r.get("dependencies", [])]
    assert len(grants) == 2
    (cli.folder / "state.json").write_text(json.dumps(state))
    down = invoke("down", "--yes", "--force", cwd=stack_dir, env=cli.env())
    assert down.returncode == 0, down.stderr
    calls = cli.calls()
    assert calls.index(f"state delete --stack dev --yes --target-dependents {bucket['urn']}") < calls.index(
        "destroy --stack dev --yes --skip-preview"
    )

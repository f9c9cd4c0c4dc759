"""The engine is the last guard of the data (issue 77): the data disk and a move's snapshot are declared protected
(Pulumi's `protect`), and only tpu-grpo's own checks release them, for the one update (or destroy) they checked.
Each test runs `invoke up` or `invoke down` against the Pulumi CLI double (tests/doubles/pulumi), which refuses to
replace or delete a protected resource with the engine's own words (pkg/resource/deploy/step_generator.go, step.go)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import ROOT, ctrl_c_as_in_a_terminal, invoke, task_environment, wait_for
from tests.unit.test_replacements import SLICE as SLICE_VALUES
from tests.unit.test_search import stack_config
from tpu_grpo.cloud import search, stack

DISK_URN = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:compute/disk:Disk::tpu-grpo-data"
SNAPSHOT = "tpu-grpo-data-" + hashlib.sha256(b"us-east5-b").hexdigest()[:8]


def resources(cli: PulumiCli) -> dict[str, dict]:
    """The double's state, by resource type's last part: each resource as `pulumi stack export` prints it."""
    state = json.loads((cli.folder / "state.json").read_text())["deployment"]["resources"]
    return {resource["type"].rsplit(":", 1)[-1]: resource for resource in state}


def write(stack_dir, values: dict) -> None:
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))


def test_an_update_no_check_released_the_disk_for_is_refused_by_the_engine(stack_dir, stack_values, cloud, monkeypatch):
    """tpu-grpo's own guard taken away (its preview never sees the data disk go, so it checks nothing and releases
    nothing): a new gcp:zone would replace the disk, and Pulumi's engine refuses, the disk where it was."""
    cli, env = cloud
    cli.deployed(stack_values)
    assert resources(cli)["Disk"]["protect"] is True  # the program declares it so
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    monkeypatch.setattr(stack, "data_disk_lost", lambda changes: False)
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255, result.stderr
    assert f'unable to replace resource "{DISK_URN}"\nas it is currently marked for protection' in result.stderr
    assert "what went wrong: the update would delete or replace what tpu-grpo protects" in result.stderr
    assert resources(cli)["Disk"]["inputs"]["zone"] == "us-east5-b"
    assert not [call for call in cli.calls() if call.startswith("state unprotect")]


def test_move_disk_makes_the_new_zones_disk_from_a_snapshot_released_for_that_update_only(spot_stack, cloud):
    """The home zone is out of chips; --move-disk makes the next zone's disk from a snapshot of the old, recorded as
    where it came from. The disk is released for the attempt that moves it (a snapshot first), not for the one that
    leaves it alone, and the disk made anew is protected again by the program."""
    stack_dir, values = spot_stack
    cli, env = cloud
    cli.deployed(values)
    cli.answer_at("us-east5-b", "spot", "stockout")
    result = invoke("up", "--yes", "--move-disk", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert "spot in us-east5-a: got chips" in result.stdout
    placed = json.loads(stack_config(stack_dir)["tpu-grpo:placed"])
    assert placed == {"zone": "us-east5-a", "capacity": "spot", "movedFrom": "us-east5-b"}
    assert "releases tpu-grpo-data (protected): the update copies it to a snapshot first (--move-disk)" in result.stdout
    assert "moves: the data disk from us-east5-b to us-east5-a, copied whole: a snapshot of it first" in result.stdout
    assert "DELETED" not in result.stdout  # what a move does is no deletion of what the disk holds
    calls = cli.calls()
    release = calls.index(f"state unprotect --stack dev --yes {DISK_URN}")
    ups = [index for index, call in enumerate(calls) if call.startswith("up ")]
    assert ups[0] < release < ups[1] and len(ups) == 2  # released after the home attempt, before the move
    made = resources(cli)
    assert made["Disk"]["inputs"]["zone"] == "us-east5-a" and made["Disk"]["protect"] is True
    assert made["Disk"]["inputs"]["snapshot"] == f"(self link of {SNAPSHOT})"
    assert made["Snapshot"]["protect"] is True and made["Snapshot"]["inputs"] == {
        "name": SNAPSHOT,
        "sourceDisk": "tpu-grpo-data",
        "zone": "us-east5-b",
        "project": "grpo-lab-123",
        "labels": {"app": "tpu-grpo", "stack": "dev"},
    }
    assert made["Instance"]["inputs"]["zone"] == "us-east5-a"


def test_move_disk_moves_the_disk_of_a_stack_without_fallback(stack_dir, stack_values, cloud):
    """A stack with no fallback whose gcp:zone changed: --move-disk snapshots the disk and makes the new zone's from
    it, recording where it came from (before, the move was taken for granted and the disk deleted, no snapshot)."""
    cli, env = cloud
    cli.deployed(stack_values)
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    result = invoke("up", "--yes", "--move-disk", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    placed = json.loads(stack_config(stack_dir)["tpu-grpo:placed"])
    assert placed == {"zone": "us-east5-a", "capacity": "reservation", "movedFrom": "us-east5-b"}
    made = resources(cli)
    assert made["Snapshot"]["inputs"]["zone"] == "us-east5-b" and made["Snapshot"]["inputs"]["sourceDisk"] == (
        "tpu-grpo-data"
    )
    assert made["Disk"]["inputs"]["zone"] == "us-east5-a"
    assert made["Disk"]["inputs"]["snapshot"] == f"(self link of {SNAPSHOT})"


def test_after_a_move_the_next_up_keeps_the_disk_and_lets_the_snapshot_go(stack_dir, stack_values, cloud):
    """The snapshot a moved disk was made from is how it was made, not a setting: the next `up` no longer declares
    it, keeps the disk (the provider's `snapshot` is ForceNew: without ignore_changes, an empty disk would replace
    it), and deletes the snapshot, released because the disk made from it holds what it held."""
    cli, env = cloud
    cli.deployed(stack_values)
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    assert invoke("up", "--yes", "--move-disk", cwd=stack_dir, env=env).returncode == 0
    again = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert again.returncode == 0, again.stderr
    assert "replaces: Disk" not in again.stdout
    assert f"replaces: Snapshot {SNAPSHOT} is no longer declared: it is deleted" in again.stdout
    assert f"releases {SNAPSHOT} (protected): a data disk made from it holds what it held" in again.stdout
    made = resources(cli)
    assert "Snapshot" not in made
    assert made["Disk"]["inputs"]["zone"] == "us-east5-a" and made["Disk"]["protect"] is True
    assert json.loads(stack_config(stack_dir)["tpu-grpo:placed"]) == {"zone": "us-east5-a", "capacity": "reservation"}


def test_a_move_whose_new_disk_was_never_made_makes_it_from_the_snapshot(stack_dir, stack_values, cloud):
    """The old disk went and the new one's create failed (a quota, an interrupt): the state holds the snapshot and
    no disk. The next `up`, wherever it goes, makes the disk from that snapshot, which it never deletes."""
    cli, env = cloud
    cli.deployed(stack_values)
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    assert invoke("up", "--yes", "--move-disk", cwd=stack_dir, env=env).returncode == 0
    state = json.loads((cli.folder / "state.json").read_text())
    state["deployment"]["resources"] = [
        r for r in state["deployment"]["resources"] if not r["type"].endswith(("Disk", "Instance"))
    ]
    (cli.folder / "state.json").write_text(json.dumps(state))
    config = stack_config(stack_dir)
    del config["tpu-grpo:placed"]  # what the stack file says no longer matters: the state does
    write(stack_dir, {**config, "gcp:zone": "us-east5-b"})
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert "Snapshot" not in "".join(line for line in result.stdout.splitlines() if line.startswith("replaces:"))
    made = resources(cli)
    assert made["Snapshot"]["inputs"]["name"] == SNAPSHOT
    assert made["Disk"]["inputs"]["zone"] == "us-east5-b"
    assert made["Disk"]["inputs"]["snapshot"] == f"(self link of {SNAPSHOT})"


def test_an_update_that_did_not_run_protects_again_what_it_released(stack_dir, stack_values, cloud):
    """Released for a move, then Pulumi refuses to go on unasked (no --yes in a script): the disk is protected in
    the state again, so that a later update nobody checked cannot replace it."""
    cli, env = cloud
    cli.deployed(stack_values)
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    result = invoke("up", "--move-disk", cwd=stack_dir, env=env)
    assert result.returncode == 255
    calls = cli.calls()
    assert calls.index(f"state unprotect --stack dev --yes {DISK_URN}") < calls.index(
        f"state protect --stack dev --yes {DISK_URN}"
    )
    assert resources(cli)["Disk"]["protect"] is True


def test_the_first_update_over_an_earlier_releases_state_protects_the_disk_first(stack_dir, stack_values, cloud):
    """The engine decides on the state's protect bit, which only an update writes: a state an earlier release left
    marks nothing, so `up` protects the disk before its update, and the update that would replace it unchecked is
    refused there too."""
    cli, env = cloud
    cli.deployed(stack_values)
    state = json.loads((cli.folder / "state.json").read_text())
    for resource in state["deployment"]["resources"]:
        resource.pop("protect", None)
    (cli.folder / "state.json").write_text(json.dumps(state))
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert f"state protect --stack dev --yes {DISK_URN}" in cli.calls()
    assert resources(cli)["Disk"]["protect"] is True


def test_down_releases_what_it_protects_once_its_check_passed(stack_dir, stack_values, cloud):
    """`down --force` (the check that asks nothing): the disk is released for the destroy, which then deletes it;
    the double's destroy refuses while anything is protected, as the engine's DeleteStep does."""
    cli, env = cloud
    cli.deployed(stack_values)
    result = invoke("down", "--yes", "--force", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert "releases tpu-grpo-data (protected): --force: deleting what only the data disk holds was asked for" in (
        result.stdout
    )
    calls = cli.calls()
    assert calls.index(f"state unprotect --stack dev --yes {DISK_URN}") < calls.index(
        "destroy --stack dev --yes --skip-preview"
    )
    assert resources(cli) == {}


def test_one_update_of_a_stack_at_a_time_from_this_laptop(stack_dir, stack_values, cloud, monkeypatch):
    """While one `invoke up` (or a recovery) updates the stack, another, or a `down`, is refused before it records a
    place or runs Pulumi, with what to do."""
    cli, env = cloud
    cli.deployed(stack_values)
    monkeypatch.setenv("TPU_GRPO_STATE", env["TPU_GRPO_STATE"])
    with search.updating("dev"):
        result = invoke("up", "--yes", cwd=stack_dir, env=env)
        down = invoke("down", "--force", "--yes", cwd=stack_dir, env=env)
    for refused in (result, down):
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: stack 'dev' is being updated from this laptop already (pid ")
    assert not [call for call in cli.calls() if call.startswith(("up ", "config set", "destroy", "state "))]
    assert invoke("up", "--yes", cwd=stack_dir, env=env).returncode == 0  # released when the first ends


def up_interrupted_at(mark: Path, stack_dir: Path, env: dict) -> tuple[subprocess.Popen, str, str]:
    """`invoke up --yes`, and Ctrl-C (SIGINT to tpu-grpo alone, as Pulumi runs in a session of its own) once the
    Pulumi double writes `mark`: the process, its stdout and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "up", "--yes"],
        cwd=stack_dir,
        env=task_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    wait_for(lambda: mark.exists() or process.poll() is not None, 600, f"the double's {mark.name}")
    assert process.poll() is None, process.communicate()
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=600)
    return process, out, err


def test_ctrl_c_cancels_the_update_and_the_next_up_adopts_what_the_cloud_made(stack_dir, stack_values, cloud):
    """Ctrl-C while Pulumi makes the VM: tpu-grpo forwards one SIGINT and waits for Pulumi's cancel (before, CPython
    killed Pulumi 0.25 s after the KeyboardInterrupt), exits 130 and names the create left pending; the cloud finishes
    the VM, and the next `up` adopts it by its id instead of meeting a 409 for it."""
    cli, env = cloud
    cli.deployed(stack_values)
    state = json.loads((cli.folder / "state.json").read_text())
    state["deployment"]["resources"] = [
        r for r in state["deployment"]["resources"] if not r["type"].endswith("Instance")
    ]
    (cli.folder / "state.json").write_text(json.dumps(state))  # Compute Engine deleted the VM: `up` makes it again
    cli.hold_up()
    # a loaded machine takes its time to reach the create (a SIGINT sent before it stopped the preview instead)
    process, out, err = up_interrupted_at(cli.folder / "holding", stack_dir, env)
    assert process.returncode == 130, err
    assert (cli.folder / "sigints").read_text() == "SIGINT\n"  # one, forwarded: Pulumi's cancel, not its terminate
    assert "^C received; cancelling." in out
    assert (
        "`pulumi up` cancelled (Ctrl-C): Pulumi finished what it had started and stopped; pending in the state: "
        in (err)
    )
    assert "the create of tpu-grpo, which the cloud may finish (and bill)" in err
    (cli.folder / "hold-up").unlink()
    again = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert again.returncode == 0, again.stderr
    vm = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:compute/instance:Instance::tpu-grpo"
    assert (
        f"refresh --yes --skip-preview --stack dev --import-pending-creates {vm} --import-pending-creates "
        "projects/grpo-lab-123/zones/us-east5-b/instances/tpu-grpo" in cli.calls()
    )
    assert "already exists" not in again.stderr and "Instance" in resources(cli)


def test_a_409_names_what_exists_and_deletes_only_a_vm(stack_values, tmp_path):
    """The Compute API's 409 names the resource that exists: a VM's fix deletes it (its data disk stays), a disk's
    or a snapshot's never does (it may hold data)."""
    from tpu_grpo.config.settings import parse

    settings = parse({k: v for k, v in stack_values.items() if v is not None}, "dev", tmp_path)
    disk = "googleapi: Error 409: The resource 'projects/p/zones/z/disks/tpu-grpo-data' already exists, alreadyExists"
    [said] = stack.outside_state(settings, [disk])
    assert said.startswith("projects/p/zones/z/disks/tpu-grpo-data exists outside Pulumi's state")
    assert "gcloud compute instances delete" not in said and "deletes nothing" in said
    vm = "googleapi: Error 409: The resource 'projects/p/zones/z/instances/tpu-grpo' already exists, alreadyExists"
    [said] = stack.outside_state(settings, [vm])
    assert "gcloud compute instances delete tpu-grpo --zone=us-east5-b" in said
    # Cloud Storage's 409 names no bucket: the stack's own is named (terraform-google-cloud-storage#238's text)
    store = parse(
        {
            **{k: v for k, v in stack_values.items() if v is not None},
            "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/r",
        },
        "dev",
        tmp_path,
    )
    bucket = (
        "googleapi: Error 409: Your previous request to create the named bucket succeeded and you already own it., "
        "conflict"
    )
    [said] = stack.outside_state(store, [bucket])
    assert said.startswith("bucket gs://grpo-lab-runs exists outside Pulumi's state") and "deletes nothing" in said
    # a slice's cluster (GKE's 409, gke-logging-sinks-demo#11's text) is named, never deleted
    sliced = parse({**{k: v for k, v in stack_values.items() if v is not None}, **SLICE_VALUES}, "dev", tmp_path)
    cluster = (
        "googleapi: Error 409: Already exists: projects/grpo-lab-123/zones/us-east5-b/clusters/tpu-grpo., alreadyExists"
    )
    [said] = stack.outside_state(sliced, [cluster])
    assert said.startswith("projects/grpo-lab-123/zones/us-east5-b/clusters/tpu-grpo exists outside Pulumi's state")
    assert "gcloud" not in said


def test_a_create_left_pending_is_adopted_by_the_id_the_provider_gives_it():
    """Each billed resource an interrupted update may leave pending is adopted by its provider's id (the importers'
    forms); a grant, which has none, is left to the refresh, which clears it, and the next update adds it again."""
    state = {
        "deployment": {
            "pending_operations": [
                {"type": "creating", "resource": {"urn": f"urn:{type_}::{name}", "type": type_, "inputs": inputs}}
                for type_, name, inputs in [
                    ("gcp:container/cluster:Cluster", "c", {"project": "p", "location": "us-east5-b", "name": "c"}),
                    (
                        "gcp:container/nodePool:NodePool",
                        "tpu",
                        {"project": "p", "location": "us-east5-b", "cluster": "c", "name": "tpu"},
                    ),
                    ("gcp:storage/bucketIAMMember:BucketIAMMember", "g", {"bucket": "b", "role": "r", "member": "m"}),
                ]
            ]
        }
    }
    with mock.patch.object(stack, "_pulumi_json", lambda *args: state):
        assert stack.pending_creates("dev") == [
            ("urn:gcp:container/cluster:Cluster::c", "projects/p/locations/us-east5-b/clusters/c"),
            ("urn:gcp:container/nodePool:NodePool::tpu", "projects/p/locations/us-east5-b/clusters/c/nodePools/tpu"),
            ("urn:gcp:storage/bucketIAMMember:BucketIAMMember::g", None),
        ]


def test_up_decides_on_the_engines_preview_not_on_its_own_table(stack_dir, stack_values, cloud, monkeypatch):
    """tpu-grpo's copy of the provider's force-new fields (infra/replacements.py) loses the disk's zone, as a copy
    can go stale; `up` decides on Pulumi's own preview (the double runs in a process of its own, with the provider's
    rules), so it still sees the disk go and runs its check: the VM does not answer, and it refuses before anything."""
    from infra import replacements

    cli, env = cloud
    cli.deployed(stack_values)
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"})
    disk_fields = tuple(field for field in replacements.FORCE_NEW[replacements.DISK] if field != "zone")
    monkeypatch.setitem(replacements.FORCE_NEW, replacements.DISK, disk_fields)
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 1, result.stderr
    assert "replaces: Disk tpu-grpo-data (zone us-east5-b -> us-east5-a)" in result.stdout
    assert result.stderr.startswith("error: refusing to update stack 'dev': the update deletes the data disk, and ")
    assert not [call for call in cli.calls() if call.startswith(("up ", "state unprotect", "config set"))]
    assert resources(cli)["Disk"]["inputs"]["zone"] == "us-east5-b"


def test_the_bucket_stays_where_it_was_made_and_plan_says_so(stack_dir, stack_values, cloud):
    """A new gcp:zone in another region would move the stack's bucket: a bucket cannot move, and a new one of the same
    global name is refused (409), so the program keeps it where it was made, and `plan` says where."""
    cli, env = cloud
    values = {**stack_values, "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs", "tpu-grpo:bucket": "true"}
    cli.deployed(values)
    write(stack_dir, {**values, "gcp:zone": "us-central1-b"})
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)
    assert not [line for line in plan["replaces"] if line.startswith("Bucket")]
    assert (
        "Bucket store stays in US-EAST5, where it was made (a bucket cannot move), not US-CENTRAL1: the VM reads and "
        "writes its runs across regions"
    ) in plan["warnings"]
    result = invoke("up", "--yes", "--move-disk", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert resources(cli)["Bucket"]["inputs"]["location"] == "US-EAST5"


def test_ctrl_c_between_pulumis_commands_exits_130_and_says_no_update_started(stack_dir, stack_values, cloud):
    """Ctrl-C while the engine previews (before any update): Invoke's own answer to a KeyboardInterrupt is exit 1,
    the code of a failure; the project's for Ctrl-C is 130, with a line that says what to do."""
    cli, env = cloud
    cli.deployed(stack_values)
    (cli.folder / "hold-preview").touch()
    process, out, err = up_interrupted_at(cli.folder / "previewing", stack_dir, env)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "error: interrupted (Ctrl-C) between two of Pulumi's commands; no update had started; fix: run "
        "`uv run invoke up` again"
    )
    assert not any(call.startswith("up ") for call in cli.calls())


def test_an_update_that_changed_after_its_check_is_not_run(stack_dir, stack_values, cloud, monkeypatch):
    """`up`'s checks passed on an update that replaced nothing; the stack file was edited before the plan was saved
    (the VM to spot: a new VM, /dev/shm emptied). The plan Pulumi saved holds that replacement, which nobody checked:
    tpu-grpo does not run it, and the state is as it was."""
    from infra import offline
    from tpu_grpo.config.settings import parse

    cli, env = cloud
    cli.deployed(stack_values)
    settings = parse(stack_values, "dev", stack_dir)
    spot = {**{k: v for k, v in stack_values.items() if k != "tpu-grpo:reservation"}, "tpu-grpo:capacity": "spot"}
    write(stack_dir, spot)
    _, declared, _ = offline.run(spot, "dev")
    monkeypatch.chdir(stack_dir)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = resources(cli)["Instance"]["inputs"]
    code, messages = stack.up(settings, yes=True, say=lambda line: None, checked=[], declared=declared)
    assert code == 1 and messages[0].startswith(stack.UPDATE_CHANGED)
    assert "gcp:compute/instance:Instance', 'tpu-grpo', 'replace'" in messages[0]
    assert not [call for call in cli.calls() if call.startswith("up ")]
    assert resources(cli)["Instance"]["inputs"] == before

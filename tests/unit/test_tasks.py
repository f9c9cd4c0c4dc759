"""The Invoke CLI as a user runs it, in a project folder: Invoke's own Program in this process, and a real
`invoke` process where the process is what is checked (imports, bytecode)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import ROOT, TEST_TOKEN, invoke, invoke_process


def imported_modules(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("--list",), ("--help", "plan"), ("--help", "up")])
def test_listing_and_help_do_not_import_pulumi(args):
    result = invoke_process(*args, cwd=ROOT, python_flags=("-X", "importtime"))
    assert result.returncode == 0, result.stderr
    modules = imported_modules(result.stderr)
    assert "invoke" in modules
    assert not {m for m in modules if m.startswith("pulumi")}


@pytest.mark.parametrize("python_says", [{}, {"PYTHONDONTWRITEBYTECODE": "1"}])
def test_tasks_keep_pythons_bytecode_setting_that_invoke_turns_off(tmp_path, python_says):
    """Invoke stops Python caching bytecode for what tasks import, so Fabric, paramiko and tpu_grpo were
    compiled from source on every run; tasks.py gives the choice back to Python (PYTHONDONTWRITEBYTECODE, -B)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(python_says, PYTHONPYCACHEPREFIX=str(tmp_path / "pyc"), COLUMNS="200")
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "settings", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    written = (
        {path.name.split(".")[0] for path in (tmp_path / "pyc").rglob("*.pyc")}
        if (tmp_path / "pyc").exists()
        else set()
    )
    if python_says:
        assert written == set()
    else:
        assert {"settings", "accelerators", "errors"} <= written  # imported by tasks.py and its task


def test_every_task_has_help():
    listing = invoke("--list", cwd=ROOT).stdout
    tasks = [
        line.split()[0]
        for line in listing.splitlines()[2:]
        if line.strip() and line.startswith("  ") and not line.startswith("   ")
    ]
    assert {"plan", "settings", "up"} <= set(tasks)
    for name in tasks:
        result = invoke("--help", name, cwd=ROOT)
        assert result.returncode == 0
        assert "Docstring:\n  none" not in result.stdout


def test_plan_shows_what_up_creates_the_hours_cost_a_run_and_the_next_command(stack_dir):
    result = invoke("plan", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "`pulumi up` creates 5 resources: Disk tpu-grpo-data, Firewall tpu-grpo-ssh, Instance tpu-grpo" in out
    assert "Still to set" not in out
    disks = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["cost"]["disks_usd_per_hour"]
    assert (
        f"per hour: 8 v6e chips × $2.70 = $21.60, + disks ${disks:.3f} = ${21.6 + disks:.2f} an hour while it runs"
        in out
    )
    assert "billed through its reservation" in out
    assert "conversion: ≈ 5 min" in out and "training: ≈ 10 min" in out  # the tutorial's, its model on its machine
    assert "export: the best checkpoint to Hugging Face format; not measured" in out
    assert "next: uv run invoke up" in out and "uv run invoke plan --scripts" in out


def test_plan_scripts_shows_every_input_the_gcloud_command_and_the_scripts(stack_dir):
    result = invoke("plan", "--scripts", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "gcloud compute instances create tpu-grpo \\\n    --zone=us-east5-b \\\n" in out
    assert "--reservation=v6e-8-calendar" in out and " maxtext.trainers.post_train.rl.train_rl " in out


def test_plan_of_the_tutorials_stack_fits_a_screen_and_exits_2_while_a_setting_is_still_to_set(home):
    """The committed example, placeholders and all, at 80 columns: what is still to set first, and as the refusal's
    one line at the end (a refusal says itself on stderr, as every other)."""
    result = invoke("plan", cwd=ROOT, env={**home, "COLUMNS": "80"})
    assert result.returncode == 2 and result.stderr == (
        "error: still to set before `pulumi up`: gcp:project, tpu-grpo:reservation, tpu-grpo:sshSourceRanges, "
        "tpu-grpo:sshPublicKeyPath; fix: the commands above, then uv run invoke plan\n"
    )
    lines = result.stdout.splitlines()
    assert len(lines) < 60, len(lines)
    assert "Still to set before `pulumi up` (4)" in lines[1]
    plan = json.loads(invoke("plan", "--json", cwd=ROOT, env=home).stdout)
    assert plan["pending"][0] == {
        "key": "gcp:project",
        "problem": "is still a placeholder",
        "fix": "pulumi config set gcp:project YOUR_PROJECT_ID",
    }
    cost = plan["cost"]
    assert cost["usd_per_hour_total"] == round(cost["usd_per_hour"] + sum(d["usd_per_hour"] for d in cost["disks"]), 2)


def test_plan_json_is_the_same_plan_as_data(stack_dir):
    result = invoke("plan", "--json", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["pending"] == []
    assert sorted(r["type"].split(":")[-1] for r in plan["resources"]) == [
        "Disk",
        "Firewall",
        "Instance",
        "Network",
        "Subnetwork",
    ]
    assert plan["gcloud"][:5] == ["gcloud", "compute", "instances", "create", "tpu-grpo"]
    assert plan["cost"]["usd_per_hour"] == 21.6
    assert plan["outputs"]["accelerator_type"] == "v6e-8"


def test_plan_of_the_committed_example_stack_lists_what_to_set(home):
    result = invoke("plan", cwd=ROOT, env=home)
    assert result.returncode == 2
    assert "Still to set before `pulumi up`" in result.stdout
    assert "pulumi config set gcp:project YOUR_PROJECT_ID" in " ".join(result.stdout.split())


def test_plan_with_a_bad_setting_is_one_line_and_nonzero(stack_dir):
    path = stack_dir / "Pulumi.dev.yaml"
    path.write_text(path.read_text().replace("us-east5-b", "us-east5"))
    result = invoke("plan", cwd=stack_dir)
    assert result.returncode == 2
    assert result.stderr == (
        "error: gcp:zone='us-east5' is not a zone of the form region-letter (us-east5-b; an AI zone: "
        "us-south1-ai1b); "
        "fix: pulumi config set gcp:zone us-east5-b\n"
    )
    assert result.stdout == ""


def test_up_without_a_cloud_account_says_what_is_missing(stack_dir, home):
    result = invoke("up", cwd=stack_dir, env=home)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: `pulumi up` for stack 'dev' cannot start; missing:"
    assert any("the Pulumi CLI" in line for line in lines)
    assert any("gcloud auth application-default login" in line for line in lines)
    assert not any("setting" in line for line in lines)
    assert lines[-1].endswith("uv run invoke plan")


def test_up_counts_a_credentials_path_to_no_file_as_missing_credentials(stack_dir, pulumi_cli, tmp_path):
    cli, env = pulumi_cli
    result = invoke("up", cwd=stack_dir, env={**env, "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent.json"})
    assert result.returncode == 2 and not [line for line in cli.calls() if line.startswith("up")]
    assert (
        "  - Google Cloud credentials: $GOOGLE_APPLICATION_CREDENTIALS names /nonexistent.json, which is no "
        "readable file: point it at your key file, or unset it and run `gcloud auth application-default login`"
        in result.stderr.splitlines()
    )
    unreadable = tmp_path / "folder.json"
    unreadable.mkdir()
    assert invoke("up", cwd=stack_dir, env={**env, "GOOGLE_APPLICATION_CREDENTIALS": str(unreadable)}).returncode == 2


def test_up_names_placeholders_too(home):
    result = invoke("up", cwd=ROOT, env=home)
    assert result.returncode == 2
    assert "setting gcp:project='YOUR_PROJECT_ID' is still a placeholder" in result.stderr


@pytest.fixture
def pulumi_cli(tmp_path, home):
    """The Pulumi CLI double (tests/doubles/pulumi) first on PATH, with Google credentials and a Hugging Face token,
    in an empty home."""
    cli = PulumiCli(tmp_path / "pulumi")
    return cli, {**home, **cli.env(), "HF_TOKEN": TEST_TOKEN}


def test_up_runs_pulumi_on_the_stack_when_ready(stack_dir, pulumi_cli):
    """With a Pulumi CLI and credentials present, `invoke up --yes` hands over to `pulumi up`, agreed beforehand."""
    cli, env = pulumi_cli
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    lines = cli.calls()
    assert lines[:7] == [
        "whoami",
        "stack select --create dev",
        "stack export --stack dev",  # a create an interrupted update left pending?
        "refresh --yes --skip-preview --stack dev",  # a VM Compute Engine deleted or stopped
        "stack export --stack dev",  # what tpu-grpo keeps, or protects, that an earlier release did not mark
        "stack export --stack dev",  # where the data disk is, a stopped VM
        "preview --json --stack dev",  # what the update replaces, by the engine
    ]
    assert lines[7].startswith("preview --json --stack dev --save-plan /")  # the update to run, and no other
    assert lines[8].startswith("up --stack dev --plan /") and " --yes --skip-preview --event-log /" in lines[8]
    assert lines[7].rsplit(" ", 1)[-1] == lines[8].split()[4]  # the plan that preview saved


def test_a_plain_up_leaves_the_question_to_pulumi(stack_dir, pulumi_cli):
    """Without --yes, `pulumi up` shows its preview and asks: in a script (no terminal) the real CLI refuses, and
    its own line reaches the user; in a terminal the answer decides (the double asks as the CLI does)."""
    import os
    import pty
    import subprocess
    import sys

    from tests.support import ROOT, task_environment

    cli, env = pulumi_cli
    refused = invoke("up", cwd=stack_dir, env=env)
    assert refused.returncode == 255
    assert refused.stderr == (
        "error: --yes or --skip-preview must be passed in to proceed when running in non-interactive mode\n"
    )
    for answer, code in (("no", 255), ("yes", 0)):
        leader, follower = pty.openpty()
        os.write(leader, f"{answer}\n".encode())
        done = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), "up"],
            cwd=stack_dir,
            stdin=follower,
            env=task_environment({**env, "CI": ""}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.close(leader), os.close(follower)
        assert done.returncode == code, done.stderr
        assert "Do you want to perform this update? yes/no" in done.stdout
        [up] = [line for line in cli.calls() if line.startswith("up ")][-1:]
        assert up.startswith("up --stack dev --plan /") and up.endswith("--event-log " + up.rsplit(" ", 1)[-1])
        assert "--yes" not in up


def test_up_explains_a_full_reservation(stack_dir, pulumi_cli):
    cli, env = pulumi_cli
    error = (
        "error: creating Instance: googleapi: Error 400: Reservation v6e-8-calendar does not have "
        "sufficient capacity for the requested resources."
    )
    cli.up_fails(
        255,
        [
            json.dumps(
                {"sequence": 1, "timestamp": 1, "diagnosticEvent": {"message": "warming up", "severity": "info"}}
            ),
            json.dumps({"sequence": 2, "timestamp": 2, "diagnosticEvent": {"message": error, "severity": "error"}}),
            '{"sequence": 3, "timest',  # cut short, as when the CLI is killed
        ],
    )
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255
    assert result.stderr.startswith("what went wrong: the reservation has no free chips")
    assert len(result.stderr.splitlines()) == 1


def test_up_failure_without_a_known_error_keeps_pulumis_exit_code(stack_dir, pulumi_cli):
    cli, env = pulumi_cli
    cli.up_fails(3, [])
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 3
    assert result.stderr == ""


@pytest.mark.parametrize(
    "message, meaning",
    [
        ("Error 400: Reservation r is incorrect for the requested resources", "another machine type or zone"),
        ("Could not find the given reservation with the following name: r", "no reservation of that name"),
        ("Invalid value: it requires reservation to be in READY state", "not active yet"),
        ("The reservation must exist in the same project as the instance.", "another project"),
        (
            "The zone 'projects/p/zones/us-east5-b' does not have enough resources (ZONE_RESOURCE_POOL_EXHAUSTED)",
            "no capacity outside reservations",
        ),
        ("Quota 'TPUS_PER_PROJECT' exceeded. Limit: 0.0", "quota is too low"),
        ("googleapi: Error 403: QUOTA_EXCEEDED", "quota is too low"),  # the search's words for a quota are up's too
        (
            'unable to delete resource "urn:pulumi:dev::tpu-grpo::gcp:compute/disk:Disk::tpu-grpo-data"\n'
            "as it is currently marked for protection",
            "so Pulumi's engine refused: undo the change to the stack file",
        ),
    ],
)
def test_known_compute_engine_errors_are_explained(message, meaning):
    from tpu_grpo.cloud.stack import explain

    [explanation] = explain([message, message])
    assert meaning in explanation


def test_plan_lists_the_provisioning_steps(stack_dir):
    text = invoke("plan", "--scripts", cwd=stack_dir, env={"HF_TOKEN": TEST_TOKEN}).stdout
    assert "`invoke provision`: playbooks/host.yml with its default variables" in text
    assert "uv python install 3.12" in text and "9. uv (pip): skipped (when: uv_source == pip)" in text
    steps = json.loads(invoke("plan", "--json", cwd=stack_dir, env={"HF_TOKEN": TEST_TOKEN}).stdout)["provision"]
    assert [step["step"] for step in steps if step["runs"]][:3] == [
        "apt update and upgrade",
        "build tools",
        "data disk",
    ]
    token = next(step for step in steps if step["step"] == "Hugging Face token")
    assert token["command"] == "copy hf_token to ~/.cache/huggingface/token (mode 600, over SFTP)"
    without = json.loads(invoke("plan", "--json", cwd=stack_dir, env={"HF_TOKEN_PATH": "/nonexistent"}).stdout)
    token = next(step for step in without["provision"] if step["step"] == "Hugging Face token")
    assert not token["runs"] and token["command"] == (
        "none: this laptop has no hf_token (meta-llama/Llama-3.1-8B-Instruct is gated: export HF_TOKEN=hf_... first)"
    )


def test_provision_without_host_or_pulumi_says_how_to_name_one(stack_dir, home):
    result = invoke("provision", cwd=stack_dir, env={**home, "HF_TOKEN": TEST_TOKEN})
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: no --host given and no pulumi CLI to read stack 'dev' outputs; fix: pass --host"
    )


def test_provision_finds_the_vm_in_the_stack_outputs(stack_dir, pulumi_cli, tmp_path):
    """The host comes from `pulumi stack output`: its IP and SSH user (nothing listens there, so it cannot connect)."""
    cli, env = pulumi_cli
    cli.set_outputs({"external_ip": "127.0.0.1", "ssh_user": "tpuuser"})
    result = invoke("provision", "--json", cwd=stack_dir, env={**env, "TPU_GRPO_STATE": str(tmp_path / "state")})
    assert result.returncode == 1
    assert "stack output --json --stack dev" in cli.calls()
    assert json.loads(result.stdout)["hosts"][0]["error"].startswith("tpuuser@127.0.0.1: cannot connect")


def test_a_stack_under_a_passphrase_is_told_to_export_it(stack_dir, pulumi_cli, tmp_path):
    """`pulumi stack init` on a `pulumi login --local` backend puts the stack's secrets under a passphrase (its salt in
    the stack file), which `pulumi up` and `refresh` ask for. `up --yes` and `pipeline --recover` (where nobody may be
    there to type it) want it exported first; an older CLI whose `stack output` wants it too is said so, not taken
    for a stack without a VM."""
    cli, env = pulumi_cli
    cli.set_outputs({"external_ip": "127.0.0.1", "ssh_user": "tpuuser"})
    stack_file = stack_dir / "Pulumi.dev.yaml"
    stack_file.write_text(stack_file.read_text() + "encryptionsalt: v1:Zm9v:v1:YmFy:YmF6\n")
    env = {**env, "TPU_GRPO_STATE": str(tmp_path / "state")}
    up = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert up.returncode == 2
    assert "the stack's passphrase: stack 'dev' keeps its secrets under the passphrase" in up.stderr
    assert "export PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE" in up.stderr
    recover = invoke("pipeline", "--recover", "1", cwd=stack_dir, env=env)
    assert recover.returncode == 2 and recover.stderr.startswith(
        "error: --recover 1 brings a lost VM back with nobody there, and stack 'dev' keeps its secrets"
    )
    assert [call for call in cli.calls() if call.startswith(("up", "refresh"))] == []
    assert invoke("status", cwd=stack_dir, env=env).stderr.startswith("error: tpuuser@127.0.0.1: cannot connect")
    (cli.folder / "old-stack-output").touch()
    status = invoke("status", cwd=stack_dir, env=env)
    assert status.returncode == 2
    assert status.stderr == (
        "error: the Pulumi CLI could not read stack 'dev': passphrase must be set with "
        "PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE environment variables; fix: "
        "export PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE (the one `pulumi stack init` asked for), "
        "or PULUMI_CONFIG_PASSPHRASE_FILE=FILE\n"
    )
    given = invoke("status", cwd=stack_dir, env={**env, "PULUMI_CONFIG_PASSPHRASE": "s3cret"})
    assert given.returncode == 1 and "tpuuser@127.0.0.1: cannot connect" in given.stderr


@pytest.mark.parametrize(
    "capacity, stopped",
    [
        (
            "spot",
            "if the spot VM stopped itself after 60 idle minutes (tpu-grpo:idleStopMinutes), or was preempted "
            "(and deleted), `uv run invoke up` creates it anew around the same data disk, then `uv run invoke "
            "provision`; else check its firewall",
        ),
        (
            "reservation",
            "if the reservation VM was deleted at its reservation's end or a host maintenance event, "
            "`uv run invoke up` creates it anew",
        ),
    ],
)
def test_a_stack_vm_that_does_not_answer_is_told_what_brings_it_back(
    stack_dir, pulumi_cli, tmp_path, capacity, stopped
):
    """The stack's VM may have stopped (an idle stop, a preemption, its capacity's end): status, fetch and down say
    what brings it back, and down, which cannot know what only the VM's disk holds, refuses unless --force."""
    cli, env = pulumi_cli
    cli.set_outputs({"external_ip": "127.0.0.1", "ssh_user": "tpuuser"})  # nothing listens on its port 22
    stack_file = stack_dir / "Pulumi.dev.yaml"
    config = yaml.safe_load(stack_file.read_text())["config"]
    if capacity == "spot":
        config.pop("tpu-grpo:reservation")
    stack_file.write_text(yaml.safe_dump({"config": {**config, "tpu-grpo:capacity": capacity}}))
    env = {**env, "TPU_GRPO_STATE": str(tmp_path / "state")}
    for task in ("status", "fetch"):
        result = invoke(task, cwd=stack_dir, env=env)
        assert result.returncode == 1
        assert result.stderr.startswith("error: tpuuser@127.0.0.1: cannot connect (")
        assert stopped in result.stderr
    down = invoke("down", "--yes", cwd=stack_dir, env=env)
    assert down.returncode == 1
    assert down.stderr.startswith(
        "error: refusing to destroy stack 'dev': the VM does not answer, so what only its "
        "data disk holds is unknown (tpuuser@127.0.0.1: cannot connect"
    )
    assert down.stderr.endswith("or pass --force, which deletes the data disk and the models on it\n")
    assert [call for call in cli.calls() if call.startswith("destroy")] == []
    if capacity == "spot":  # docs/first-run.md quotes both lines, for its spot stack's VM
        page = (ROOT / "docs/first-run.md").read_text()
        assert (
            re.sub(
                r"^error: \S+ cannot connect \([^)]*\)",
                "error: ubuntu@203.0.113.7: cannot connect (timed out)",
                result.stderr.strip(),
            )
            in page
        )
        assert re.sub(r"unknown \(.*\); fix:", "unknown (...); fix:", down.stderr.strip()) in page
    assert invoke("down", "--yes", "--force", cwd=stack_dir, env=env).returncode == 0
    assert [call for call in cli.calls() if call.startswith("destroy")] == ["destroy --stack dev --yes --skip-preview"]


@pytest.mark.parametrize(
    "capacity, meaning",
    [
        ("reservation", "no capacity outside reservations"),
        ("spot", "spot capacity comes and goes"),
        ("flex-start", "a zone that offers v6e flex-start"),
        ("on-demand", "a reservation is what guarantees capacity"),
    ],
)
def test_a_zone_out_of_capacity_means_what_it_means_for_the_stacks_capacity(capacity, meaning):
    from tpu_grpo.catalog.capacity import CAPACITIES
    from tpu_grpo.cloud.stack import explain

    [explanation] = explain(["Error 503: ZONE_RESOURCE_POOL_EXHAUSTED in us-east5-b"], CAPACITIES[capacity])
    assert meaning in explanation
    # Google's other words for it (tpu_grpo/cloud/refusals.py cites each): the VM's with details, a slice's node pool
    others = [
        "A ct6e-standard-8t VM instance is currently unavailable in the us-east5-b zone. Capacity changes frequently",
        "googleapi: Error 400: GCE_STOCKOUT",
    ]
    assert explain(others, CAPACITIES[capacity]) == [explanation]


def test_a_tasks_flags_are_checked_once_before_any_task_runs(stack_dir, monkeypatch):
    """The executor checks every task of the command line first; the bodies get the checked values, and build
    nothing again (here: each step's run, built once per task)."""
    from tpu_grpo.jobs import pipeline

    built = []
    real = pipeline.build_run
    monkeypatch.setattr(pipeline, "build_run", lambda *args, **kwargs: built.append(args) or real(*args, **kwargs))
    result = invoke("convert", "--dry-run", "train", "--dry-run", "--batches", "3", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    assert len(built) == 2 and "export NUM_BATCHES=3" in result.stdout


@pytest.mark.parametrize(
    "flags, taken",
    [
        (("train", "--batches", "100000", "--dry-run"), True),
        (("train", "--batches", "100001", "--dry-run"), False),
        (("pipeline", "--recover", "100", "--dry-run"), True),
        (("pipeline", "--recover", "101", "--dry-run"), False),
    ],
)
def test_the_documented_maxima_are_taken_and_one_more_is_refused(stack_dir, pulumi_cli, flags, taken):
    """docs: --batches up to 100,000, --recover up to 100."""
    _, env = pulumi_cli
    result = invoke(*flags, cwd=stack_dir, env=env)
    if taken:
        assert result.returncode == 0, result.stderr
        assert flags[1] == "--recover" or f"export NUM_BATCHES={flags[2]}" in result.stdout
    else:
        assert result.returncode == 2 and result.stderr == (
            f"error: {flags[1]} '{flags[2]}' is not a whole number from {0 if flags[1] == '--recover' else 1} to "
            f"{flags[2][:-1]}0; fix: e.g. {flags[1]} {'3' if flags[1] == '--recover' else '50'}\n"
        )


@pytest.mark.parametrize("dataset", ["gsm8k", "openai/gsm8k/main", "openai/gsm8k "])
def test_a_dataset_that_is_not_owner_slash_name_is_refused_before_pulumi_runs(
    stack_dir, stack_values, pulumi_cli, dataset
):
    """tpu-grpo:dataset names a Hub dataset as OWNER/NAME, like the tokenizer: a typo is one line, and `pulumi up`
    never starts."""
    cli, env = pulumi_cli
    (stack_dir / "Pulumi.dev.yaml").write_text(
        yaml.safe_dump({"config": {**stack_values, "tpu-grpo:dataset": dataset}})
    )
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: tpu-grpo:dataset={dataset!r} is not a Hugging Face repository id"
    )
    assert len(result.stderr.splitlines()) == 1 and not any(call.startswith("up") for call in cli.calls())


@pytest.mark.parametrize(
    "argv", [["up", "--yes", "provision", "pipeline"], ["provision"], ["pipeline", "--recover", "1"]]
)
def test_a_gated_model_without_a_token_is_refused_before_anything_is_made(stack_dir, pulumi_cli, argv):
    """`env -u HF_TOKEN invoke up --yes provision pipeline` would make a paid VM whose model download then fails: the
    whole command line's check finds the token missing first (the committed stack trains Llama 3.1, which is gated),
    and no Pulumi command that makes anything runs."""
    cli, env = pulumi_cli
    cli.set_outputs({"external_ip": "127.0.0.1", "ssh_user": "tpuuser"})
    env = {key: value for key, value in env.items() if key != "HF_TOKEN"}
    result = invoke(*argv, cwd=stack_dir, env=env)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "error: tpu-grpo:model='llama3.1-8b-Instruct' is gated on the Hugging Face Hub "
        "(meta-llama/Llama-3.1-8B-Instruct), and this laptop has no token for it"
    )
    assert "export HF_TOKEN=hf_..." in result.stderr
    assert not [call for call in cli.calls() if call.startswith(("up", "refresh", "destroy", "stack select"))]


def test_an_ungated_model_or_steps_without_the_token_need_none(stack_dir, stack_values, pulumi_cli):
    """Qwen's weights are not gated, and `--tags idle` sends no token: neither is refused for want of one (each then
    fails only where nothing answers at the stack's address)."""
    _, env = pulumi_cli
    env = {key: value for key, value in env.items() if key != "HF_TOKEN"}
    tagged = invoke("provision", "--tags", "idle", "--host", "tpuuser@127.0.0.1:1", cwd=stack_dir, env=env)
    assert tagged.returncode == 1 and "gated" not in tagged.stderr, tagged.stderr
    (stack_dir / "Pulumi.dev.yaml").write_text(
        yaml.safe_dump(
            {"config": {**stack_values, "tpu-grpo:model": "qwen3-0.6b", "tpu-grpo:machineType": "ct6e-standard-1t"}}
        )
    )
    qwen = invoke("provision", "--host", "tpuuser@127.0.0.1:1", cwd=stack_dir, env=env)
    assert qwen.returncode == 1 and "gated" not in qwen.stderr, qwen.stderr


@pytest.mark.parametrize(
    "error",
    [
        # terraform-plugin-sdk's helper/retry TimeoutError, as the provider's ComputeOperationWaitTime returns it
        "error: creating Instance: timeout while waiting for state to become 'DONE' (last state: 'RUNNING', timeout: "
        "2h20m0s)",
        # the Compute API's answer to an insert of a name that exists (a VM the last timed-out request made)
        "error: creating Instance: googleapi: Error 409: The resource "
        "'projects/grpo-lab-123/zones/us-east5-a/instances/tpu-grpo' already exists, alreadyExists",
    ],
)
def test_a_vm_made_outside_the_state_is_named_with_the_command_that_deletes_it(
    stack_dir, stack_values, pulumi_cli, tmp_path, error
):
    """A flex-start request that outlives the create timeout goes on in Compute Engine while the provider forgets the
    VM (resource_compute_instance.go: d.SetId("") on a wait error): `up` says so and prints the delete command,
    which runs as printed (here against a gcloud that records its argv)."""
    cli, env = pulumi_cli
    values = {**stack_values, "tpu-grpo:capacity": "flex-start", "tpu-grpo:maxRunHours": "4", "gcp:zone": "us-east5-a"}
    del values["tpu-grpo:reservation"]
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli.up_fails(
        255, [json.dumps({"sequence": 1, "timestamp": 1, "diagnosticEvent": {"message": error, "severity": "error"}})]
    )
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255
    [said] = [line for line in result.stderr.splitlines() if "outside Pulumi's state" in line]
    command = said.split("delete it with `", 1)[1].split("`", 1)[0]
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "gcloud").write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (tools / "gcloud").chmod(0o755)
    pasted = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env={"PATH": f"{tools}:/usr/bin:/bin"}
    )
    assert json.loads(pasted.stdout) == [
        "compute",
        "instances",
        "delete",
        "tpu-grpo",
        "--zone=us-east5-a",
        "--project=grpo-lab-123",
        "--quiet",
    ]


def test_export_takes_step_or_last_not_both(stack_dir):
    result = invoke("export", "--step", "20", "--last", "--host", "tpu@203.0.113.9", cwd=stack_dir)
    assert result.returncode == 2
    assert result.stderr == "error: --step 20 and --last both choose the checkpoint; fix: give one of them\n"


def test_plan_says_what_evaluating_costs_and_what_trades_it(stack_dir):
    """The tutorial's 50 batches: before, after batches 10 to 50 and after, 7 passes over the 10 choosing examples,
    and 10 report examples: 80 greedy answers beside 50 x 1 prompt x 2 generations; fewer test batches, fewer."""
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    assert plan["evaluation"] == {
        "passes": 7,
        "choosing_examples": 10,
        "report_examples": 10,
        "eval_answers": 80,
        "train_answers": 100,
    }
    text = " ".join(invoke("plan", "--scripts", cwd=stack_dir).stdout.split())
    assert "80 greedy answers beside the training's 100 sampled ones, 44% of what the run generates" in text
    stack = stack_dir / "Pulumi.dev.yaml"
    stack.write_text(
        stack.read_text().replace(
            "config:\n", "config:\n  tpu-grpo:testBatches: '2'\n  tpu-grpo:reportBatches: '0'\n", 1
        )
    )
    fewer = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["evaluation"]
    assert (fewer["eval_answers"], fewer["report_examples"]) == (14, 0)


def test_an_export_dry_run_refuses_a_step_no_run_of_these_settings_keeps_and_says_the_best_is_chosen_later(stack_dir):
    """checkpointPeriod 10 over 50 batches: 25 is no checkpoint (docs/training.md said `--step 25`); 20 and the last
    are. Without --step the export converts the best scored checkpoint, which only the host knows."""
    refused = invoke("export", "--run-name", "r1", "--step", "25", "--dry-run", cwd=stack_dir)
    assert refused.returncode == 2 and refused.stderr == (
        "error: --step 25 is no checkpoint: a run of these settings keeps one every 10 steps "
        "(tpu-grpo:checkpointPeriod) and its last, 50; fix: --step 20, or --last\n"
    )
    for step in ("20", "50"):
        assert invoke("export", "--run-name", "r1", "--step", step, "--dry-run", cwd=stack_dir).returncode == 0
    best = invoke("export", "--run-name", "r1", "--dry-run", cwd=stack_dir).stdout
    assert "# the checkpoint its intermediate evaluations scored best, known once connected" in best
    page = (ROOT / "docs/training.md").read_text()
    assert "uv run invoke export --run-name RUN --step 20" in page and "--step 25" not in page

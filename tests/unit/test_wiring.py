"""Promises a user feels that sit where a tested function is called (issue 68): each held through the task that calls
it, the acceptance beside each refusal, at the lowest tier that sees it. docs/development.md says how a breakage of
one was shown to fail its test."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import TEST_TOKEN, invoke


@pytest.fixture
def cloud(tmp_path, home):
    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "127.0.0.1", "ssh_user": "ubuntu"})
    cli.gets_chips_anywhere()
    return cli, {**home, **cli.env(), "HF_TOKEN": TEST_TOKEN, "TPU_GRPO_STATE": str(tmp_path / "state")}


def write(stack_dir, values: dict, name: str = "dev") -> None:
    (stack_dir / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": values}))


def test_an_exported_passphrase_lets_up_and_a_recovery_go_ahead(stack_dir, cloud):
    """Promise 1: a stack under a passphrase is refused by `up --yes` and `pipeline --recover` only while no variable
    gives it; exported, even empty, both go ahead (up calls the CLI's `up`)."""
    cli, env = cloud
    stack_file = stack_dir / "Pulumi.dev.yaml"
    stack_file.write_text(stack_file.read_text() + "encryptionsalt: v1:Zm9v:v1:YmFy:YmF6\n")
    # exported empty is a passphrase: the CLI's readPassphrase takes whatever os.LookupEnv finds
    # (pulumi/pulumi, pkg/secrets/passphrase/manager.go)
    for passphrase in ("s3cret", ""):
        given = {**env, "PULUMI_CONFIG_PASSPHRASE": passphrase}
        up = invoke("up", "--yes", cwd=stack_dir, env=given)
        assert up.returncode == 0, up.stderr
        recover = invoke("pipeline", "--recover", "1", "--dry-run", cwd=stack_dir, env=given)
        assert recover.returncode == 0, recover.stderr
    assert sum(call.startswith("up ") for call in cli.calls()) == 2
    for unset in ({}, {"PULUMI_CONFIG_PASSPHRASE_FILE": ""}):  # an empty file name: the CLI reads no file
        refused = invoke("pipeline", "--recover", "1", cwd=stack_dir, env={**env, **unset})  # a dry run needs none
        assert refused.returncode == 2 and "keeps its secrets under the passphrase" in refused.stderr


@pytest.mark.parametrize(
    "capacity, meaning",
    [
        ("spot", "spot capacity comes and goes"),
        ("flex-start", "a zone that offers v6e flex-start"),
        ("on-demand", "a reservation is what guarantees capacity"),
    ],
)
def test_up_out_of_chips_tells_the_stack_its_own_capacitys_meaning(stack_dir, stack_values, cloud, capacity, meaning):
    """Promise 2: `up` passes the stack's capacity to the message, not the reservation's."""
    cli, env = cloud
    values = {key: value for key, value in stack_values.items() if key != "tpu-grpo:reservation"}
    zone = "us-central2-b" if capacity == "flex-start" else values["gcp:zone"]
    extra = {"tpu-grpo:maxRunHours": 24} if capacity == "flex-start" else {}
    write(stack_dir, {**values, **extra, "tpu-grpo:capacity": capacity, "gcp:zone": zone})
    cli.answer_at(zone, capacity, "stockout")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert meaning in said and "no capacity outside reservations" not in said, said


@pytest.mark.parametrize("name, taken", [(".", False), ("-x", False), (".hidden", False), ("a.b-1", True)])
def test_a_run_name_never_begins_with_a_dot_or_a_dash(stack_dir, name, taken):
    """Promise 3: `--run-name .` would make the saved model's path the models folder itself, which save replaces."""
    result = invoke("pipeline", "--run-name", name, "--dry-run", cwd=stack_dir)
    assert result.returncode == (0 if taken else 2), result.stderr
    if not taken:
        assert result.stderr.startswith(f"error: --run-name {name!r} is not a name")


def test_the_stack_flag_wins_over_the_environment(stack_dir, stack_values, cloud):
    """Promise 4: `--stack test` with TPU_GRPO_STACK=prod exported acts on test: its settings, and `down`'s destroy."""
    cli, env = cloud
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-a"}, "test")
    write(stack_dir, {**stack_values, "gcp:zone": "us-east5-c"}, "prod")
    env = {**env, "TPU_GRPO_STACK": "prod"}
    shown = json.loads(invoke("settings", "--json", "--stack", "test", cwd=stack_dir, env=env).stdout)
    assert shown["settings"]["gcp:zone"]["value"] == "us-east5-a"
    assert json.loads(invoke("settings", "--json", cwd=stack_dir, env=env).stdout)["settings"]["gcp:zone"]["value"] == (
        "us-east5-c"
    )
    down = invoke("down", "--yes", "--force", "--stack", "test", cwd=stack_dir, env=env)
    assert down.returncode == 0, down.stderr
    assert [call for call in cli.calls() if call.startswith("destroy")] == ["destroy --stack test --yes --skip-preview"]


@pytest.mark.parametrize(
    "text, line",
    [
        ("config:\n  gcp:project: grpo-lab-123\n  gcp:zone: [us-east5-b\n", 4),  # the unclosed [ runs to the end
        ("config:\n  gcp:project: grpo-lab-123\n  gcp:zone: us-east5-b: x\n  tpu-grpo:batches: 50\n", 3),
    ],
    ids=["at-the-end", "in-the-middle"],
)
def test_a_broken_stack_file_names_the_line_a_person_sees(stack_dir, text, line):
    """Promise 5: YAML's marks count from 0; the message counts lines as an editor does, on a middle line (the
    second `: ` of line 3) as at the file's end."""
    (stack_dir / "Pulumi.dev.yaml").write_text(text)
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2, result.stderr
    assert f"at line {line})" in result.stderr and f"fix Pulumi.dev.yaml at line {line}" in result.stderr, result.stderr


def test_host_on_a_slice_stack_is_refused_for_a_step_and_honoured_for_the_host_alone(stack_dir, stack_values, cloud):
    """Promise 6: a step's --host on a slice stack would run a one-VM script of a slice's settings: refused; a task
    that only reads the host named (status) acts on that host."""
    _, env = cloud
    slice_values = {
        **stack_values,
        "tpu-grpo:slice": "v6e-16",
        "tpu-grpo:usePathways": "true",
        "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
    }
    write(stack_dir, slice_values)
    host = ("--host", "tpu@203.0.113.9")
    for args in (("train", "--dry-run"), ("pipeline", "--dry-run"), ("export", "--dry-run")):
        result = invoke(*args, *host, cwd=stack_dir, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: --host runs the step on one VM, but stack 'dev' is slice v6e-16")
    status = invoke("status", *host, "--wait", "0", cwd=stack_dir, env=env)
    assert status.returncode == 1 and status.stderr.startswith("error: tpu@203.0.113.9: cannot connect")
    write(stack_dir, stack_values)
    assert invoke("train", "--dry-run", *host, cwd=stack_dir, env=env).returncode == 0


def test_recover_on_a_slice_stack_is_refused_with_its_reason(stack_dir, stack_values, cloud):
    """Promise 8: a slice's JobSet restarts its own pods; --recover, which brings a VM back, is refused, saying so."""
    _, env = cloud
    write(
        stack_dir,
        {**stack_values, "tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true",
         "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs"},
    )  # fmt: skip
    result = invoke("pipeline", "--recover", "1", "--dry-run", cwd=stack_dir, env=env)
    assert result.returncode == 2
    assert "a slice's JobSet restarts its own pods (its failure policy); fix: run without --recover" in result.stderr


def test_a_recovery_brings_the_vm_back_unasked(stack_dir, cloud, monkeypatch):
    """Held by the host tier before, here by the decision itself: nobody is there to answer Pulumi's question, so the
    recovery's `pulumi up` goes ahead with --yes (without it the CLI waits at its prompt for hours), after a refresh;
    the old host keys are forgotten and the VM provisioned again."""
    from tpu_grpo.config import settings as settings_module
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import recovery

    cli, env = cloud
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(stack_dir)
    provisioned, forgotten = [], []
    monkeypatch.setattr(recovery, "provision_again", lambda values, found, say: provisioned.append(found))
    monkeypatch.setattr(hosts, "forget_host_key", forgotten.append)
    chosen = settings_module.load("dev", stack_dir)
    target = hosts.parse("ubuntu@127.0.0.1", None)
    recovery.bring_back(chosen, lambda: [target], {}, say=lambda line: None)
    ran = [call.split()[0] for call in cli.calls() if call.split()[0] in ("refresh", "up")]
    assert ran == ["refresh", "up"]
    [up] = [call for call in cli.calls() if call.startswith("up ")]
    assert "--yes" in up.split() and "--skip-preview" in up.split()
    assert forgotten == [target] and provisioned == [[target]]


@pytest.mark.parametrize(
    "status, lost", [("RUNNING", None), ("TERMINATED", "TERMINATED"), ("STOPPED", "STOPPED"), (None, "DELETED")]
)
def test_a_deleted_or_stopped_vm_is_lost_and_a_running_one_is_not(stack_dir, cloud, monkeypatch, status, lost):
    """Held by the host tier before: after a refresh, a VM gone from the state (Compute Engine deleted it) is lost,
    never taken for one that runs; a stopped one is lost too (no TPU VM is started again)."""
    from tpu_grpo.config import settings as settings_module
    from tpu_grpo.jobs import recovery

    cli, env = cloud
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(stack_dir)
    cli.set_status(status)
    assert recovery.gone(settings_module.load("dev", stack_dir)) == lost
    assert [call.split()[0] for call in cli.calls()] == ["refresh", "stack"]  # refreshed, then read


def test_a_failed_step_shows_the_last_lines_of_its_log(monkeypatch):
    """Held by the host tier before: the error names the job and its exit, and quotes the log's last lines (where
    MaxText's traceback ends), not its first."""
    from tpu_grpo.jobs import pipeline, vm_jobs

    log = "\n".join(f"line {number}" for number in range(1, 101)).encode()
    monkeypatch.setattr(vm_jobs, "read_log", lambda connection, job_id: log)
    said = str(pipeline.failure(None, "20261206-1-train", "train", 3))
    assert said.startswith("train failed (job 20261206-1-train, exit 3); last lines of its log:\n  line 86\n")
    assert "  line 100\n" in said and "line 85\n" not in said and said.endswith("finished steps are skipped")


def test_freeze_writes_its_lock_to_a_new_file(tmp_path):
    """Held by the host tier before: `--lock` may name a file that does not exist yet (checked before anything
    connects), and the lock is written there whole, no temporary file left."""
    from tpu_grpo.provision.lock import check_lock_path, write_lock

    path = check_lock_path(str(tmp_path / "new.lock.txt"))
    assert write_lock(path, "# made\nfabric==3.2.2\ninvoke==2.2.0\n") == (path, 2)
    assert path.read_text().endswith("invoke==2.2.0\n") and [p.name for p in tmp_path.iterdir()] == ["new.lock.txt"]


def test_an_export_is_done_only_while_dev_shm_holds_that_runs_model(tmp_path):
    """What the probe concludes from a host's answer, not the script's text: /dev/shm/.../hf-trained holds the newest
    export only, so a run's export counts as done only when its record is the newest; another run exported since
    holds it now."""
    import dataclasses
    import os
    import subprocess
    import time

    from tests.tutorial import RUN
    from tpu_grpo.jobs import pipeline

    home, shm = tmp_path / "home", tmp_path / "shm"
    ours, theirs = RUN.named("ours"), dataclasses.replace(RUN, run_name="theirs")

    def done(run) -> bool:
        test = pipeline.output_test(run, "export").replace("/dev/shm/", f"{shm}/")
        return subprocess.run(["bash", "-c", test], env={"HOME": str(home), "PATH": "/usr/bin:/bin"}).returncode == 0

    records = home / "tpu-grpo/done"
    records.mkdir(parents=True)
    export = shm / f"{RUN.model}/hf-trained"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (records / pipeline.record_key(ours, "export")).write_text("{}")
    assert done(ours)
    later = records / pipeline.record_key(theirs, "export")
    later.write_text("{}")
    os.utime(later, (time.time() + 5, time.time() + 5))
    assert not done(ours) and done(theirs)
    (export / "config.json").unlink()
    assert not done(theirs)  # a restart emptied /dev/shm


def test_a_host_whose_step_failed_is_summarised_as_failed_with_the_steps_last_lines():
    """Held by the host tier before: the provisioning summary's line for a host one of whose steps failed says
    FAILED (a host that connected and ran every other step is still failed), with the step's exit and last lines;
    a host whose steps all passed says done."""
    import io

    from rich.console import Console

    from tpu_grpo.provision.engine import HostReport, Report, StepResult
    from tpu_grpo.provision.report import print_summary

    output = "\n".join(f"apt line {number}" for number in range(1, 41))
    failed = HostReport("a", [StepResult("uv", "ok"), StepResult("apt", "failed", exit_code=100, output=output)])
    passed = HostReport("b", [StepResult("uv", "ok"), StepResult("apt", "changed")])
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    print_summary(Report("playbooks/host.yml", False, [failed, passed]), console)
    said = console.file.getvalue()
    assert "a: 'apt' failed with exit code 100\n" in said and "    apt line 40\n" in said and "apt line 1\n" not in said
    assert "a: FAILED  1 ok, 0 changed, 1 failed, 0 skipped" in said
    assert "b: done  1 ok, 1 changed, 0 failed, 0 skipped" in said


@pytest.fixture
def reached(monkeypatch) -> list[str]:
    """The VM as the tasks reach it, with no SSH: each connection opened records the address it went to."""
    from tpu_grpo.host import hosts

    addresses: list[str] = []

    def connect(host, notices=None, wait_s=0):
        addresses.append(host.address)
        return SimpleNamespace(is_connected=True, close=lambda: None)

    monkeypatch.setattr(hosts, "connect", connect)
    return addresses


@pytest.fixture
def recovering(cloud, reached, monkeypatch):
    """`pipeline --recover 1` on the stack's VM, whose first attempt loses its link: what each attempt's session was
    (its address, and the cloud's answer to its lost-VM question) and what was provisioned after a recovery."""
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import pipeline, recovery

    attempts, provisioned = [], []

    def run_pipeline(session, run, **_):
        attempts.append((session.host.address, session.vm_gone() if session.vm_gone else "never asked"))
        if len(attempts) == 1:
            raise hosts.ConnectError(f"{session.host.name}: the link dropped")
        return pipeline.Outcome(run.name, session.host.name, saved="~/tpu-grpo/models/durable")

    monkeypatch.setattr(pipeline, "run_pipeline", run_pipeline)
    monkeypatch.setattr(recovery, "provision_again", lambda values, found, say: provisioned.append(found))
    monkeypatch.setattr(recovery, "where_training_stands", lambda connection, run: (None, None))
    return attempts, provisioned


def test_after_a_recovery_the_pipeline_reaches_the_vm_made_anew(stack_dir, cloud, reached, recovering, tmp_path):
    """Promise 7: Compute Engine makes the VM anew at another ephemeral address with a new host key (the double's
    `up` does too); the next session goes to the new address, and the keys recorded for both addresses are
    forgotten, so the new key is recorded afresh rather than refused or a stale one trusted."""
    cli, env = cloud
    attempts, provisioned = recovering
    known_hosts = tmp_path / "state" / "known_hosts"
    known_hosts.parent.mkdir(parents=True)
    other = "203.0.113.5 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther\n"
    known_hosts.write_text(
        "127.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILost\n"
        + other
        + "127.0.0.2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStale\n"
    )
    cli.set_status(None)  # Compute Engine deleted the VM
    result = invoke("pipeline", "--run-name", "durable", "--recover", "1", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [address for address, _ in attempts] == ["127.0.0.1", "127.0.0.2"]
    assert [[host.address for host in found] for found in provisioned] == [["127.0.0.2"]]
    assert reached[-1] == "127.0.0.2" and "127.0.0.1" not in reached[1:]
    assert known_hosts.read_text() == other


@pytest.mark.parametrize("status, brought_back", [("RUNNING", False), (None, True), ("TERMINATED", True)])
def test_a_dropped_link_asks_the_cloud_whether_the_vm_is_lost(stack_dir, cloud, recovering, status, brought_back):
    """Held by the recovery's own tests before, here through the pipeline: the session a step follows asks the cloud
    (a refresh) when its link drops, and a link lost while the VM runs ends the pipeline as without --recover, with
    no `pulumi up`; a VM deleted or stopped is brought back."""
    cli, env = cloud
    attempts, _ = recovering
    cli.set_status(status)
    result = invoke("pipeline", "--run-name", "durable", "--recover", "1", cwd=stack_dir, env=env)
    assert attempts[0][1] == (None if status == "RUNNING" else status or "DELETED")  # the cloud's answer
    ups = [call for call in cli.calls() if call.startswith("up ")]
    if brought_back:
        assert result.returncode == 0 and len(ups) == 1 and len(attempts) == 2, result.stderr
    else:
        assert result.returncode == 1 and ups == [] and len(attempts) == 1
        assert "ubuntu@127.0.0.1: the link dropped" in result.stderr


def test_a_failed_step_ends_the_pipeline_with_the_last_lines_of_its_log(stack_dir, cloud, reached, monkeypatch):
    """Through `invoke pipeline`: the host's chain says the training exited 3 and ends, and the task fails with the
    error that names its job and exit and quotes its log's last lines; the steps after it were never followed."""
    from tpu_grpo.jobs import pipeline, vm_jobs, watch

    _, env = cloud
    followed = []
    monkeypatch.setattr(pipeline, "scored", lambda connection, run: run)
    monkeypatch.setattr(pipeline, "probe", lambda connection, run: pipeline.Probed())
    monkeypatch.setattr(pipeline, "running_jobs", lambda connection, run: {})
    monkeypatch.setattr(pipeline, "preflight", lambda connection, run, need_gb, check_tpu: None)
    monkeypatch.setattr(pipeline, "write_record", lambda connection, run: None)
    monkeypatch.setattr(pipeline, "start_chain", lambda connection, run, keep: "job-chain")
    said = b"".join(
        f"tpu-grpo pipeline: {line}\n".encode()
        for line in ("convert job job-convert", "convert exit 0", "train job job-train", "train exit 3")
    )

    def chain(session, job, on_bytes, *_, **__):
        assert job == "job-chain"
        on_bytes(said[:30])  # a line cut in two by the stream
        on_bytes(said[30:])
        return 3

    monkeypatch.setattr(vm_jobs, "follow", chain)
    monkeypatch.setattr(
        watch, "follow", lambda session, job, step, *_: followed.append(step) or (3 if step == "train" else 0)
    )
    log = "\n".join(f"traceback line {number}" for number in range(1, 41)).encode()
    monkeypatch.setattr(vm_jobs, "read_log", lambda connection, job_id: log if job_id == "job-train" else b"")
    result = invoke("pipeline", "--run-name", "durable", cwd=stack_dir, env=env)
    assert result.returncode == 1 and followed == ["convert", "train"]
    assert "train failed (job job-train, exit 3); last lines of its log:\n  traceback line 26\n" in result.stderr
    assert "  traceback line 40\n" in result.stderr and "traceback line 25\n" not in result.stderr


def test_freeze_writes_the_lock_where_lock_says(stack_dir, home, reached, monkeypatch, tmp_path):
    """Through `invoke freeze`: `--lock FILE` is where the lock goes, not playbooks/host.lock.txt."""
    from tpu_grpo.provision import lock

    default = tmp_path / "default.lock.txt"  # where a freeze that dropped --lock would write (not the checkout's)
    monkeypatch.setattr(lock, "LOCK", default)
    monkeypatch.setattr(lock, "freeze", lambda connection, book, values, name: "# made\nfabric==3.2.2\n")
    given = tmp_path / "mine" / "host.lock.txt"
    given.parent.mkdir()
    result = invoke("freeze", "--host", "tpu@203.0.113.9", "--lock", str(given), cwd=stack_dir, env=home)
    assert result.returncode == 0, result.stderr
    assert given.is_file() and not default.exists()
    assert given.read_text() == "# made\nfabric==3.2.2\n"
    assert f"wrote {given}: 1 packages from tpu@203.0.113.9" in result.stdout
    assert reached == ["203.0.113.9"]


@pytest.mark.parametrize("status, code", [("failed", 1), ("changed", 0)])
def test_provision_exits_1_when_a_step_failed(stack_dir, home, monkeypatch, status, code):
    """Through `invoke provision`: a host one of whose steps failed makes the task exit 1 (a script chaining
    `provision && pipeline` stops), with the summary; every step passing exits 0."""
    from tpu_grpo.provision import engine

    def apply(book, values, targets, **_):
        steps = [
            engine.StepResult("uv", "ok"),
            engine.StepResult("apt", status, exit_code=100 if status == "failed" else None),
        ]
        return engine.Report(str(book.path), False, [engine.HostReport(targets[0].name, steps)])

    monkeypatch.setattr(engine, "apply", apply)
    result = invoke("provision", "--host", "tpu@203.0.113.9", cwd=stack_dir, env={**home, "HF_TOKEN": TEST_TOKEN})
    assert result.returncode == code, result.stdout + result.stderr
    assert ("tpu@203.0.113.9: FAILED" in result.stdout) == (status == "failed")

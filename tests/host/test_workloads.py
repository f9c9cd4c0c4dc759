"""convert, train, export and pipeline for real over SSH, against a test host whose venv holds
the stand-in MaxText (tests/doubles/standin): it replays the real recorded logs and writes the real
output tree, so jobs, locks, follow, progress, save, fetch and metrics all run for real."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests import tutorial
from tests.doubles.pulumi_cli import PulumiCli
from tests.support import FAST, FIXTURES, TEST_TOKEN, is_report, job_dirs, modules, scan_for_token, wait_for
from tests.tutorial import assert_same_as_tutorial
from tpu_grpo.jobs import vm_jobs


def command_lines() -> list[bytes]:
    """Every process's /proc/PID/cmdline on this machine (the test hosts' processes included)."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes())
        except OSError:  # the process ended meanwhile
            continue
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pipeline_runs_end_to_end_then_fetch_metrics_and_down(workload_host, tmp_path):
    host = workload_host
    result = host.invoke("pipeline", "--batches", "50", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout

    # Progress and evals come from MaxText's own log lines, as they happen.
    assert "train: GRPO step 13/50" in out and "train: GRPO step 50/50" in out
    assert "train: pre eval: accuracy 0% (0/4)" in out
    assert "train: intermediate eval (step 25): accuracy 0% (0/4)" in out
    assert "train: post eval: accuracy 0% (0/4)" in out
    # the tutorial's three modules, and before the conversion the export's report evaluation (a train_rl of no
    # batches: tests/unit/test_maxtext.py holds its argv)
    assert modules(host.records()) == ["to_maxtext", "train_rl", "report", "to_huggingface"]
    records = [record for record in host.records() if not is_report(record)]
    assert [record["module"] for record in records] == list(tutorial.MODULES)

    # Each step got the tutorial's argv and environment, character for character.
    run_name = next(arg for arg in records[1]["argv"] if arg.startswith("run_name=")).removeprefix("run_name=")
    assert len(run_name) == 19 and run_name[4] == "-"  # YYYY-MM-DD-HH-MM-SS
    theirs = tutorial.calls(tmp_path, TEST_TOKEN, run_name)
    for record in records[1:]:  # the job's TPU_NAME is the host's hostname, as the tutorial's $(hostname)
        assert record["env"]["TPU_NAME"] == os.uname().nodename
    assert_same_as_tutorial({r["module"]: r for r in records}, theirs)
    # The export carries the tokenizer the run trained with (the Instruct one), not the base model's.
    assert host.records("tokenizers") == [{"from_pretrained": "meta-llama/Llama-3.1-8B-Instruct"}]
    # One job on the host ran the steps in order, each step a job of its own, all of them detached: each runs in a
    # session of its own, led by its job's wrapper (the `pid` file).
    chain, *dirs = job_dirs(host)
    assert [d.name.rsplit("-", 1)[-1] for d in (chain, *dirs)] == ["pipeline", "convert", "train", "export", "save"]
    pids = [int((folder / "pid").read_text()) for folder in dirs[:3]]
    assert [(record["sid"], record["pgid"]) for record in records] == [(pid, pid) for pid in pids]
    assert len({int((folder / "pid").read_text()) for folder in (chain, *dirs)}) == 5

    # Job folders hold the command that ran, the log, the pid and the exit code.
    for folder in (chain, *dirs):
        assert (folder / "exit_code").read_text().strip() == "0"
        assert json.loads((folder / "job.json").read_text()).get("chain", chain.name) == chain.name
    for folder in dirs[:3]:
        assert re.search(r"^python3 -m? ?maxtext\.", (folder / "command.sh").read_text(), re.M)  # the training's: `-`
    assert "saved: " in (dirs[3] / "log").read_text()
    train_log = (dirs[1] / "log").read_bytes()
    assert train_log.count(b"] Train step ") == 4 and b"Train step 50 training loss" in train_log

    # Saved on the data disk with checksums; the whole log also came back to the laptop.
    saved = host.host.user.home / "tpu-grpo/models" / run_name
    for name in os.listdir(FIXTURES / "hf-export"):
        assert sha256(saved / name) == sha256(FIXTURES / "hf-export" / name)
    assert (host.host.state / "logs" / f"{dirs[1].name}.log").read_bytes() == train_log

    # A re-run finds everything done and starts nothing.
    again = host.invoke("pipeline", "--batches", "50", *FAST)
    assert again.returncode == 0, again.stderr
    assert all(f"{step}: done (done before)" in again.stdout for step in ("convert", "train", "export", "save"))
    assert len(host.records()) == 4 and len(job_dirs(host)) == 5  # the export's report among them

    status = json.loads(host.invoke("status", "--json").stdout)
    assert list(status) == ["where", "jobs", "progress", "idle_stop", "tpu", "slice", "compile_cache"]
    assert status["slice"] is None
    assert [(job["step"], job["state"], job["exit_code"]) for job in status["jobs"]] == [
        ("pipeline", "finished", 0),
        ("convert", "finished", 0),
        ("train", "finished", 0),
        ("export", "finished", 0),
        ("save", "finished", 0),
    ]
    assert status["progress"]["step"] == 50 and status["progress"]["run"] == run_name
    # the training started cold, and wrote the compile cache that the stack's next training starts warm from
    startup = status["progress"]["startup"]
    assert startup["cache"]["warm"] is False and startup["to_first_step"] > 0
    assert status["compile_cache"] == {**startup["cache"], "warm": True, "entries": 1, "bytes": 4096}

    # down refuses while the model is only on the VM ...
    cli = PulumiCli(tmp_path / "pulumi")
    with_pulumi = cli.on_path()
    refused = host.invoke("down", env=with_pulumi)
    assert refused.returncode == 1
    assert f"run {run_name}: saved on the data disk only; fix: uv run invoke fetch --run {run_name}" in refused.stderr
    assert refused.stderr.endswith("fetch them first, or pass --force, which deletes them with the VM's disks\n")

    # ... fetch brings it with checksums ...
    target = tmp_path / "model"
    fetched = host.invoke("fetch", "--run", run_name, "--to", str(target), "--json")
    assert fetched.returncode == 0, fetched.stderr
    report = json.loads(fetched.stdout)  # progress went to stderr
    assert report["files"] == sorted(os.listdir(FIXTURES / "hf-export"))
    assert report["bytes_transferred"] == report["bytes_total"] > 0
    for name in os.listdir(FIXTURES / "hf-export"):
        assert sha256(target / name) == sha256(FIXTURES / "hf-export" / name)
    header = (target / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", header[:8])[0]
    assert "model.embed_tokens.weight" in json.loads(header[8 : 8 + size])

    # ... and then down hands over to `pulumi destroy`.
    assert cli.calls() == []
    unasked = host.invoke("down", env=with_pulumi)  # no terminal: Pulumi itself refuses to go on unasked
    assert unasked.returncode == 255 and "--yes or --skip-preview or --preview-only must be passed" in unasked.stderr
    done = host.invoke("down", "--yes", env=with_pulumi)
    assert done.returncode == 0, done.stderr
    assert cli.calls()[-1] == "destroy --stack dev --yes --skip-preview"
    destroys = len([call for call in cli.calls() if call.startswith("destroy")])

    # A local copy damaged, or deleted, since the fetch no longer counts as fetched.
    model = target / "model.safetensors"
    model.write_bytes(b"\0" * model.stat().st_size)
    for damage in ("damaged", "deleted"):
        again_refused = host.invoke("down", "--yes", env=with_pulumi)
        assert again_refused.returncode == 1, damage
        assert f"run {run_name}: saved on the data disk only" in again_refused.stderr, damage
        shutil.rmtree(target, ignore_errors=True)
    assert len([call for call in cli.calls() if call.startswith("destroy")]) == destroys

    metrics = host.invoke("metrics", "--run", run_name, "--out", str(tmp_path / "m.png"))
    assert metrics.returncode == 0, metrics.stderr
    assert f"GRPO run {run_name}: llama3.1-8b-Instruct on openai/gsm8k, loss grpo" in " ".join(metrics.stdout.split())
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    scan_for_token(
        out,
        result.stderr,
        again.stdout,
        refused.stderr,
        fetched.stdout,
        folders=(host.host.user.home / "tpu-grpo", host.host.state),
    )


def test_a_second_tpu_job_is_refused_and_cancel_leaves_nothing_behind(workload_host):
    host = workload_host
    assert host.invoke("convert").returncode == 0
    host.control(hold_s=120)
    started = host.invoke("train", "--batches", "4", "--detach")
    assert started.returncode == 0, started.stderr
    job = started.stdout.split("started train job ")[1].split()[0]
    wait_for(lambda: len(host.records()) == 2, what="the training to start")
    # While MaxText runs, no process on the host has the token on its command line.
    cmdlines = command_lines()
    assert any(b"maxtext.trainers.post_train.rl.train_rl" in line for line in cmdlines)
    assert not [line for line in cmdlines if TEST_TOKEN.encode() in line]

    for args in (("train", "--batches", "4"), ("convert",)):
        refused = host.invoke(*args)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"error: the TPU is busy with job {job}; fix: wait for it "
            "(uv run invoke logs --follow) or stop it (uv run invoke cancel)"
        )
    assert len(host.records()) == 2

    maxtext_pid = host.records()[-1]["pid"]
    asked = time.monotonic()
    cancelled = host.invoke("cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled job {job}" in cancelled.stdout
    # MaxText itself got SIGTERM (not only the job's wrapper) and ended of it within the grace time,
    # and nothing of the job's process group is left.
    assert host.records("signals") == [
        {"module": "maxtext.trainers.post_train.rl.train_rl", "pid": maxtext_pid, "signal": "SIGTERM"}
    ]
    assert time.monotonic() - asked < vm_jobs.CANCEL_GRACE_S
    pgid = host.records()[-1]["pgid"]  # as the host numbers it
    assert host.host.on_host("pgrep", "-g", str(pgid)).stdout == ""
    wait_for(lambda: not [p for p in host.processes() if "maxtext" in p or "run.sh" in p], 10, "no job process")
    status = json.loads(host.invoke("status", "--json").stdout)
    assert status["jobs"][-1]["state"] == "cancelled" and status["jobs"][-1]["exit_code"] == 143

    host.control()  # the lock went with the job: the TPU takes a new one
    again = host.invoke("train", "--batches", "4")
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("task", ["train", "pipeline"])
def test_ctrl_c_detaches_and_the_job_goes_on(workload_host, task):
    host = workload_host
    assert host.invoke("convert").returncode == 0
    host.control(line_delay_s=0.004)  # about 6 s of log
    train = host.popen(task, "--batches", "8", *(("--need-gb", "0.001,0.001") if task == "pipeline" else ()))
    wait_for(lambda: len(host.records()) == 2, what="the training to start")
    time.sleep(0.5)
    train.send_signal(signal.SIGINT)
    out, err = train.communicate(timeout=30)
    assert train.returncode == 130, err
    # a job's words, or a pipeline's when the Ctrl-C comes between its lines
    assert "\ndetached: " in out and "reattach: uv run invoke logs" in out and "error" not in err
    status = json.loads(host.invoke("status", "--json").stdout)
    assert status["jobs"][-1]["state"] == "running"

    follow = host.invoke("logs", "--follow")
    assert follow.returncode == 0, follow.stderr
    assert "train: GRPO step 8/8" in follow.stdout
    log = (job_dirs(host)[-1] / "log").read_bytes()
    job = job_dirs(host)[-1].name
    assert (host.host.state / "logs" / f"{job}.log").read_bytes() == log


def test_a_failed_step_keeps_its_exit_code_and_the_rerun_resumes(workload_host):
    host = workload_host
    host.control(exit_code={"train_rl": 3})
    failed = host.invoke("pipeline", "--batches", "4", *FAST)
    assert failed.returncode == 1
    assert "error: train failed (job " in failed.stderr and ", exit 3); last lines of its log:" in failed.stderr
    assert "Post RL Training" in failed.stderr
    host.control()
    resumed = host.invoke("pipeline", "--batches", "4", "--json", *FAST)
    assert resumed.returncode == 0, resumed.stderr
    assert "convert: done (done before)" in resumed.stderr  # with --json, stdout is the JSON alone
    outcome = json.loads(resumed.stdout)
    assert [(step["name"], step["state"], step["exit_code"]) for step in outcome["steps"]] == [
        ("convert", "done", None),
        ("train", "ran", 0),
        ("export", "ran", 0),
        ("save", "ran", 0),  # a job on the host too
    ]
    assert outcome["saved"] == f"~/tpu-grpo/models/{outcome['run']}"
    assert modules(host.records()) == [
        "to_maxtext",
        "train_rl",
        "train_rl",
        "report",
        "to_huggingface",
    ]


def test_a_pipeline_whose_laptop_goes_away_mid_training_converts_trains_exports_and_saves_by_itself(
    workload_host, tmp_path
):
    """The laptop's invoke killed during training, and with it every SSH connection it had: the host goes on with
    the export and the save by itself; a fetch later brings the model home, and the same pipeline finds it done."""
    host = workload_host
    host.control(line_delay_s=0.004)
    pipeline = host.popen("pipeline", "--batches", "8", *FAST)
    wait_for(lambda: len(host.records()) == 2, what="the training to start")
    pipeline.kill()
    pipeline.communicate()
    sessions = lambda: host.host.on_host("pgrep", "-u", host.host.user.name, "-f", "^sshd").stdout  # noqa: E731
    wait_for(lambda: sessions() == "", what="the laptop's SSH connections to end")
    assert modules(host.records()) == ["to_maxtext", "train_rl"]  # still training as the laptop went

    run_name = next(a for a in host.records()[1]["argv"] if a.startswith("run_name=")).removeprefix("run_name=")
    saved = host.host.user.home / "tpu-grpo/models" / run_name
    wait_for(lambda: (saved / "SHA256SUMS").exists(), 60, "the host to export and save the model by itself")
    wait_for(lambda: not any("chain" in process for process in host.processes()), 10, "the chain to end")
    assert modules(host.records()) == ["to_maxtext", "train_rl", "report", "to_huggingface"]

    fetched = host.invoke("fetch", "--run", run_name, "--to", str(tmp_path / "model"))
    assert fetched.returncode == 0, fetched.stderr
    for name in os.listdir(FIXTURES / "hf-export"):
        assert sha256(tmp_path / "model" / name) == sha256(FIXTURES / "hf-export" / name)
    rerun = host.invoke("pipeline", "--batches", "8", *FAST)
    assert rerun.returncode == 0, rerun.stderr
    assert all(f"{step}: done (done before)" in rerun.stdout for step in ("convert", "train", "export", "save"))
    assert len(host.records()) == 4


def test_status_logs_and_cancel_see_a_pipeline_and_its_current_step(workload_host):
    """A pipeline left by its laptop: status lists it running beside its training; `logs --follow` follows it, each
    step as it comes, to its end; and on a second one, cancel stops the pipeline and its step together, leaving the
    TPU free and no step after it."""
    host = workload_host
    host.control(line_delay_s=0.004)
    laptop = host.popen("pipeline", "--run-name", "watched", "--batches", "8", *FAST)
    wait_for(lambda: len(host.records()) == 2, what="the training to start")
    laptop.kill()
    laptop.communicate()
    status = json.loads(host.invoke("status", "--json").stdout)
    assert [(job["step"], job["state"]) for job in status["jobs"]] == [
        ("pipeline", "running"),
        ("convert", "finished"),
        ("train", "running"),
    ]
    followed = host.invoke("logs", "--follow")
    assert followed.returncode == 0, followed.stderr
    assert "train: GRPO step 8/8" in followed.stdout and "save: model copied to ~/tpu-grpo/models/watched" in (
        followed.stdout
    )
    assert re.search(r"^convert: job \S+-convert ended before this follow, exit 0$", followed.stdout, re.M)
    assert "convert: compile cache" not in followed.stdout  # said, not replayed
    assert modules(host.records()) == ["to_maxtext", "train_rl", "report", "to_huggingface"]

    host.control(hold_s=120)
    laptop = host.popen("pipeline", "--run-name", "stopped", "--batches", "8", *FAST)
    wait_for(lambda: len(host.records()) == 5, what="the second training to start")
    laptop.kill()
    laptop.communicate()
    cancelled = host.invoke("cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("cancelled the pipeline of run stopped (job ") and "and its train (job " in (
        cancelled.stdout
    )
    wait_for(lambda: not [p for p in host.processes() if "maxtext" in p or "run.sh" in p or "chain" in p], 10, "none")
    jobs = json.loads(host.invoke("status", "--json").stdout)["jobs"]
    assert [(job["step"], job["state"]) for job in jobs[-2:]] == [("pipeline", "cancelled"), ("train", "cancelled")]
    assert len(host.records()) == 5  # no export after it
    host.control()
    assert host.invoke("train", "--run-name", "after", "--batches", "2").returncode == 0  # the TPU is free


def test_export_of_a_missing_step_lists_the_steps_that_exist(workload_host, tmp_path):
    host = workload_host
    chained = host.chain(("convert",), ("train", "--batches", "4"))  # a finished step lets the next one run
    assert chained.returncode == 0, chained.stderr
    assert modules(host.records()) == ["to_maxtext", "train_rl"]
    missing = host.invoke("export", "--step", "3")
    assert missing.returncode == 2  # bad input: nothing started
    # rl.yml's checkpoint_period 50: Orbax saved the first step and the last
    assert "has no checkpoint at step 3 in /dev/shm/llama3.1-8b-Instruct/post-train//" in missing.stderr
    assert missing.stderr.strip().endswith("/checkpoints/actor; it has: 1, 4; fix: --step 4")
    assert len(host.records()) == 2 and len(job_dirs(host)) == 2
    earlier = host.invoke("export", "--step", "1")
    assert earlier.returncode == 0, earlier.stderr
    assert host.records()[-1]["env"]["POST_TRAIN_PATH"].endswith("/checkpoints/actor/1/model_params")

    # The trained model is only in /dev/shm: down refuses and names the command that saves it,
    # which finishes this run (no second training) when run as given.
    run_name = host.records()[1]["env"]["RUN_NAME"]
    cli = PulumiCli(tmp_path / "pulumi")  # there, as `down` needs it; never reached here
    refused = host.invoke("down", env=cli.on_path())
    assert refused.returncode == 1
    fix = (
        f"run {run_name}: trained, not saved (in /dev/shm, if its store is shm); fix: uv run invoke pipeline "
        f"--run-name {run_name} --batches 4 (exports and saves it), then uv run invoke fetch --run {run_name}"
    )
    assert fix in refused.stderr
    unsaved = host.invoke("fetch", "--run", run_name, "--to", str(tmp_path / "never"))  # nothing saved to fetch
    assert unsaved.returncode != 0 and unsaved.stderr.startswith("error: ") and not (tmp_path / "never").exists()
    finished = host.invoke(*fix.split("fix: uv run invoke ")[1].split(" (")[0].split(), *FAST)
    assert finished.returncode == 0, finished.stderr
    assert "train: done (done before)" in finished.stdout
    assert modules(host.records()) == [
        "to_maxtext",
        "train_rl",
        "report",
        "to_huggingface",
        "report",
        "to_huggingface",
    ]
    assert (host.host.user.home / "tpu-grpo/models" / run_name / "SHA256SUMS").is_file()


def test_preflight_names_what_is_missing_and_starts_nothing(workload_host):
    host = workload_host
    (host.host.user.home / ".cache/huggingface/token").unlink()
    host.control(device_count=4)
    result = host.invoke("pipeline", "--batches", "4", "--need-gb", "100000,0.001")
    assert result.returncode == 1
    message = result.stderr.strip()
    assert message.startswith("error: preflight failed: no Hugging Face token on the host; fix: HF_TOKEN=... ")
    assert "/dev/shm has " in message and "a run needs 100000" in message
    assert "JAX sees 4 TPU chips, ct6e-standard-8t has 8" in message
    assert host.records() == [] and job_dirs(host) == []


def test_fetch_to_an_unwritable_folder_connects_to_nothing(workload_host, tmp_path):
    host = workload_host
    blocker = tmp_path / "file"
    blocker.write_text("")
    accepted = host.host.vm.accepted(host.host.user.name)
    result = host.invoke("fetch", "--to", str(blocker / "model"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "fix: --to somewhere you can write" in result.stderr
    assert host.host.vm.accepted(host.host.user.name) == accepted


def test_a_cut_link_mid_training_loses_no_line_and_keeps_the_exit_code(namespaced_workload_host):
    bridge, host = namespaced_workload_host
    assert host.invoke("convert").returncode == 0
    host.control(line_delay_s=0.01, exit_code={"train_rl": 5})  # about 15 s of log
    train = host.popen("train", "--batches", "8")
    try:
        wait_for(lambda: len(host.records()) == 2, what="the training to start")
        time.sleep(2)
        bridge.cut("a")
        job = job_dirs(host)[-1]
        size_at_cut = (job / "log").stat().st_size
        time.sleep(8)  # the follow notices the dead link (keepalive, TCP_USER_TIMEOUT) meanwhile
        assert train.poll() is None, "the follow gave up instead of reconnecting"
        grown = (job / "log").stat().st_size
        assert grown > size_at_cut  # the job went on without its SSH connection
        bridge.mend("a")
        out, err = train.communicate(timeout=120)
    finally:
        if train.poll() is None:
            train.kill()
    assert train.returncode == 5, err
    assert "connection lost; reconnecting to resume at byte " in out
    assert "train: GRPO step 8/8" in out
    log = (job / "log").read_bytes()
    assert (host.host.state / "logs" / f"{job.name}.log").read_bytes() == log  # no gap, no duplicate
    assert log.count(b"Starting RL training...") == 1


def test_save_keeps_events_and_checkpoint_so_metrics_outlive_dev_shm(workload_host, tmp_path):
    host = workload_host
    result = host.invoke("pipeline", "--batches", "4", "--keep-checkpoint", *FAST)
    assert result.returncode == 0, result.stderr
    run_name = host.records()[1]["env"]["RUN_NAME"]
    archive = host.host.user.home / "tpu-grpo/runs" / run_name
    checkpoint = archive / "checkpoints/actor/4"
    assert (checkpoint / "SHA256SUMS").is_file() and (checkpoint / "model_params").is_dir()
    check = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=checkpoint, capture_output=True)
    assert check.returncode == 0, check.stdout

    host.restart_empties_shm()
    metrics = host.invoke("metrics", "--run", run_name, "--json", "--out", str(tmp_path / "m.png"))
    assert metrics.returncode == 0, metrics.stderr
    found = json.loads(metrics.stdout)
    assert found["run"] == run_name and found["rows"][0]["step"] == 1
    assert (found["model"], found["dataset"], found["dataset_config"], found["loss"], found["tokenizer"]) == (
        "llama3.1-8b-Instruct",
        "openai/gsm8k",
        "main",
        "grpo",
        "meta-llama/Llama-3.1-8B-Instruct",
    )
    assert [e["stage"] for e in found["evals"]] == ["pre", "intermediate", "intermediate", "post"]  # from the log
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_step_without_its_input_is_refused_and_starts_nothing(workload_host):
    host = workload_host
    train = host.invoke("train", "--batches", "4")
    assert train.returncode == 1
    assert train.stderr.strip() == (
        "error: no converted checkpoint at /dev/shm/llama3.1-8b-Instruct/mt-format//0/items; "
        "fix: uv run invoke convert (or uv run invoke pipeline, which converts first)"
    )
    export = host.invoke("export")
    assert export.returncode == 1  # the host lacks a trained run: nothing started
    assert export.stderr.strip().startswith("error: no finished training for any run on this host; fix: ")
    assert host.records() == [] and job_dirs(host) == []


# ---------------------------------------------------------------- a run name names one training


def test_a_saved_run_name_given_again_with_other_batches_is_refused(workload_host):
    """It was reported done and trained nothing: the user believed they had a 100-batch model."""
    host = workload_host
    first = host.invoke("pipeline", "--run-name", "x", "--batches", "4", *FAST)
    assert first.returncode == 0, first.stderr
    ran = host.records()
    again = host.invoke("pipeline", "--run-name", "x", "--batches", "8", *FAST)
    assert again.returncode == 2
    assert again.stderr == (
        "error: run 'x' was trained with batches=4 (this command: 8); a run name names one "
        "training; fix: pick a new run name (e.g. --run-name x-2), or give the earlier flags "
        "to continue that run\n"
    )
    assert host.records() == ran
    same = host.invoke("pipeline", "--run-name", "x", "--batches", "4", *FAST)
    assert same.returncode == 0, same.stderr
    assert "save: done (done before)" in same.stdout and host.records() == ran


def test_a_trained_run_name_is_not_trained_again_under_other_inputs(workload_host):
    """MaxText would resume its own newest checkpoint (step 8) under a different num_batches."""
    host = workload_host
    assert host.invoke("convert").returncode == 0
    assert host.invoke("train", "--run-name", "x", "--batches", "8").returncode == 0
    ran = host.records()
    for args in (
        ("pipeline", "--run-name", "x", "--batches", "4", *FAST),
        ("train", "--run-name", "x", "--batches", "4"),
        ("train", "--run-name", "x", "--batches", "8", "--set", "rl.num_generations=4"),
    ):
        refused = host.invoke(*args)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("error: run 'x' was trained with "), refused.stderr
        assert "pick a new run name (e.g. --run-name x-2)" in refused.stderr
    assert "train_set={} (this command: {'rl.num_generations': '4'})" in refused.stderr
    assert host.records() == ran and len(job_dirs(host)) == 2
    finished = host.invoke("pipeline", "--run-name", "x", "--batches", "8", *FAST)
    assert finished.returncode == 0, finished.stderr
    assert modules(host.records()) == ["to_maxtext", "train_rl", "report", "to_huggingface"]


def test_export_of_another_run_is_never_saved_as_this_runs_model(workload_host):
    host = workload_host
    assert host.invoke("convert").returncode == 0
    for name, batches in (("a", "4"), ("b", "8")):
        assert host.invoke("train", "--run-name", name, "--batches", batches).returncode == 0
    for name in ("a", "b"):
        assert host.invoke("export", "--run-name", name).returncode == 0
    result = host.invoke("pipeline", "--run-name", "a", "--batches", "4", "--json", *FAST)
    assert result.returncode == 0, result.stderr
    steps = {step["name"]: step["state"] for step in json.loads(result.stdout)["steps"]}
    assert steps == {"convert": "done", "train": "done", "export": "ran", "save": "ran"}
    last_export = [r for r in host.records() if r["module"].endswith("to_huggingface")][-1]
    assert "/post-train//a/checkpoints/actor/4/" in last_export["env"]["POST_TRAIN_PATH"]
    saved_with = json.loads((host.host.user.home / "tpu-grpo/runs/a/saved-with.json").read_text())
    assert (saved_with["batches"], saved_with["step"]) == (4, 4)


def test_an_export_named_no_run_converts_the_newest_trained_one_and_one_with_no_checkpoint_left_is_refused(
    workload_host,
):
    """`invoke export` with no run name exports the newest finished training's run (not the first); after a restart
    emptied /dev/shm, the export is refused on the laptop with what happened and the fix, and nothing starts."""
    host = workload_host
    assert host.invoke("convert").returncode == 0
    for name in ("older", "newer", "newest"):
        assert host.invoke("train", "--run-name", name, "--batches", "4").returncode == 0
    exported = host.invoke("export")
    assert exported.returncode == 0, exported.stderr
    [export] = [r for r in host.records() if r["module"].endswith("to_huggingface")]
    assert "/post-train//newest/checkpoints/actor/4/" in export["env"]["POST_TRAIN_PATH"]
    before = (len(host.records()), len(job_dirs(host)))
    host.restart_empties_shm()
    refused = host.invoke("export")
    assert refused.returncode == 2, refused.stderr
    assert (
        refused.stderr.strip().endswith("it has: none (was /dev/shm cleared by a restart?); fix: --step N")
        and "run newest has no checkpoint at step 4" in refused.stderr
    )
    assert (len(host.records()), len(job_dirs(host))) == before  # nothing started on the host


def test_an_export_is_made_of_the_run_its_training_ran_not_of_the_stack_as_it_is_now(workload_host, stack_dir):
    """The stack's tokenizer changed after the training: the export still writes the one the run trained with into
    the model (from the training job's record), as a slice's does (tests/unit/test_slice_jobs.py)."""
    host = workload_host
    assert host.invoke("convert", project=stack_dir).returncode == 0
    assert host.invoke("train", "--run-name", "a", "--batches", "4", project=stack_dir).returncode == 0
    stack = stack_dir / "Pulumi.dev.yaml"
    config = yaml.safe_load(stack.read_text())["config"]
    stack.write_text(
        yaml.safe_dump({"config": {**config, "tpu-grpo:tokenizer": "someone/other-tokenizer", "tpu-grpo:batches": "9"}})
    )
    exported = host.invoke("export", "--run-name", "a", project=stack_dir)
    assert exported.returncode == 0, exported.stderr
    assert host.records("tokenizers") == [{"from_pretrained": "meta-llama/Llama-3.1-8B-Instruct"}]
    [export] = [r for r in host.records() if r["module"].endswith("to_huggingface")]
    assert "/a/checkpoints/actor/4/" in export["env"]["POST_TRAIN_PATH"]


@pytest.fixture
def disk_store(stack_dir) -> Path:
    """A project whose stack keeps checkpoints and runs on the data disk, every 2 steps, the newest 2."""
    stack = stack_dir / "Pulumi.dev.yaml"
    config = yaml.safe_load(stack.read_text())["config"]
    config.update(
        {"tpu-grpo:checkpointStore": "disk", "tpu-grpo:checkpointPeriod": "2", "tpu-grpo:checkpointsToKeep": "2"}
    )
    stack.write_text(yaml.safe_dump({"config": config}))
    return stack_dir


def test_the_pipeline_exports_the_best_scored_checkpoint_and_a_rerun_keeps_it(workload_host, disk_store, tmp_path):
    """Checkpoints every 2 steps, the newest 2 kept: 2 and 4. The intermediate evaluations after batches 2 and 4
    score 50% and 25%, so 2 is the best: the pipeline exports checkpoint 2, says so, saves it, and a second run of the
    same pipeline finds it done; `export --last` converts 4, and `export` with no step the best again."""
    host = workload_host
    host.control(eval_accuracy={"2": 50.0, "4": 25.0})
    done = host.invoke("pipeline", "--run-name", "peak", "--batches", "4", *FAST, project=disk_store)
    assert done.returncode == 0, done.stderr
    assert "export: exports checkpoint 2, the best scored of those in the store" in done.stdout
    [export] = [r for r in host.records() if r["module"].endswith("to_huggingface")]
    assert export["env"]["POST_TRAIN_PATH"].endswith("/peak/checkpoints/actor/2/model_params")
    saved_with = host.host.user.home / "tpu-grpo/runs/peak/saved-with.json"
    assert json.loads(saved_with.read_text())["step"] == 2
    again = host.invoke("pipeline", "--run-name", "peak", "--batches", "4", *FAST, project=disk_store)
    assert again.returncode == 0, again.stderr
    assert "export: done (done before)" in again.stdout and "save: done (done before)" in again.stdout
    fetched = host.invoke("fetch", "--run", "peak", "--to", str(tmp_path / "models"), project=disk_store)
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "models" / "peak" / "config.json").is_file()
    last = host.invoke("export", "--run-name", "peak", "--last", project=disk_store)
    assert last.returncode == 0, last.stderr
    assert host.records()[-1]["env"]["POST_TRAIN_PATH"].endswith("/peak/checkpoints/actor/4/model_params")
    assert "exports checkpoint 4, the last, as --last asked" in last.stdout
    best = host.invoke("export", "--run-name", "peak", project=disk_store)
    assert best.returncode == 0, best.stderr
    assert host.records()[-1]["env"]["POST_TRAIN_PATH"].endswith("/peak/checkpoints/actor/2/model_params")
    assert "exports checkpoint 2, the best scored of those in the store" in best.stdout


def train_steps(log: bytes) -> list[int]:
    return [int(step) for step in re.findall(rb"\] Train step (\d+) ", log)]


# ---------------------------------------------------------------- checkpoints that outlive the VM


def test_a_run_on_the_disk_store_survives_losing_the_vm_and_resumes_from_its_checkpoint(workload_host, disk_store):
    """The VM goes mid-training (every process, and /dev/shm): started again, the same pipeline skips
    the conversion kept on the disk and resumes training after the newest checkpoint, redoing at most
    checkpointPeriod steps."""
    host = workload_host
    host.control(line_delay_s=0.01)
    store = host.host.user.home / "tpu-grpo/maxtext/llama3.1-8b-Instruct"
    actor = store / "post-train/durable/checkpoints/actor"
    first = host.popen("pipeline", "--run-name", "durable", "--batches", "8", *FAST, project=disk_store)
    try:
        wait_for(lambda: (actor / "4").is_dir(), what="checkpoint 4")
        host.host.vm.lose()
    finally:
        first.kill()  # the laptop's view of a lost VM is the next issue's (--recover)
        first.communicate()
    [lost_job] = [job for job in job_dirs(host) if job.name.endswith("-train")]
    seen_before_loss = train_steps((lost_job / "log").read_bytes())
    assert (store / "mt-format/0/items").is_dir()  # the conversion is on the disk, not in /dev/shm

    host.host.vm.boot()
    assert host.host.on_host("ls", "/dev/shm").stdout == ""  # what a restart leaves there
    resumed = host.invoke("pipeline", "--run-name", "durable", "--batches", "8", *FAST, project=disk_store)
    assert resumed.returncode == 0, resumed.stderr
    assert "convert: done (done before)" in resumed.stdout and "train: GRPO step 8/8" in resumed.stdout
    assert re.search(r"train: resumes after checkpoint \d of 8 \(MaxText restores it\)", resumed.stdout)
    assert modules(host.records()) == [
        "to_maxtext",
        "train_rl",
        "train_rl",
        "report",
        "to_huggingface",
    ]
    again = [job for job in job_dirs(host) if job.name.endswith("-train") and job != lost_job]
    log = (again[0] / "log").read_bytes()
    restored = int(re.search(rb"restored checkpoint (\d+) from ", log).group(1))
    assert restored >= 4 and train_steps(log) == [step for step in (2, 4, 6, 8) if step > restored]
    assert max(seen_before_loss) - restored <= 2  # at most checkpointPeriod steps redone
    assert sorted(int(p.name) for p in actor.iterdir()) == [6, 8]  # checkpointsToKeep
    status = json.loads(host.invoke("status", "--json", project=disk_store).stdout)
    assert status["progress"]["resumed_from"] == restored and status["progress"]["step"] == 8
    train = host.records()[2]
    assert (
        train["env"]["BASE_OUTPUT_DIRECTORY"]
        == f"/home/{host.host.user.name}/tpu-grpo/maxtext/llama3.1-8b-Instruct/post-train/"
    )
    assert "checkpoint_period=2" in train["argv"] and "max_num_checkpoints_to_keep=2" in train["argv"]
    saved = host.host.user.home / "tpu-grpo/models/durable"
    assert (saved / "SHA256SUMS").is_file()


@pytest.fixture
def bucket_store(stack_dir, bucket) -> Path:
    """A project whose stack keeps checkpoints and runs in a bucket (the emulator's), every 2 steps."""
    stack = stack_dir / "Pulumi.dev.yaml"
    config = yaml.safe_load(stack.read_text())["config"]
    config.update(
        {
            "tpu-grpo:checkpointStore": f"gs://{bucket}/runs",
            "tpu-grpo:checkpointPeriod": "2",
            "tpu-grpo:checkpointsToKeep": "2",
        }
    )
    stack.write_text(yaml.safe_dump({"config": config}))
    return stack_dir


def test_a_run_in_a_bucket_survives_losing_the_vm_and_its_metrics_are_read_from_the_bucket(
    make_workload_host, bucket_store, bucket, storage_emulator, storage_client, tmp_path
):
    """MaxText writes the converted checkpoint, the checkpoints and the events to gs:// (here a local
    emulator, which the host's jobs and this laptop both reach); the host reads the bucket (with the client MaxText's
    venv has) to know what is done, and the laptop where training stands and what the run's metrics are."""
    from google.cloud import storage

    host = make_workload_host(env={"STORAGE_EMULATOR_HOST": storage_emulator})
    host.give_client(storage_client)
    host.control(line_delay_s=0.01)
    laptop = {"STORAGE_EMULATOR_HOST": storage_emulator}
    store = "runs/llama3.1-8b-Instruct"
    names = lambda: {blob.name for blob in storage.Client().list_blobs(bucket)}  # noqa: E731
    first = host.popen("pipeline", "--run-name", "cloud", "--batches", "8", *FAST, project=bucket_store)
    try:
        wait_for(
            lambda: any(name.startswith(f"{store}/post-train/cloud/checkpoints/actor/4/") for name in names()),
            what="checkpoint 4 in the bucket",
        )
        host.host.vm.lose()
    finally:
        first.kill()
        first.communicate()
    assert any(name.startswith(f"{store}/mt-format/0/items/") for name in names())

    host.host.vm.boot()
    resumed = host.invoke("pipeline", "--run-name", "cloud", "--batches", "8", *FAST, project=bucket_store, env=laptop)
    assert resumed.returncode == 0, resumed.stderr
    assert "convert: done (done before)" in resumed.stdout and "train: GRPO step 8/8" in resumed.stdout
    assert modules(host.records()) == [
        "to_maxtext",
        "train_rl",
        "train_rl",
        "report",
        "to_huggingface",
    ]
    trained = host.records()[2]
    assert trained["env"]["BASE_OUTPUT_DIRECTORY"] == f"gs://{bucket}/runs/llama3.1-8b-Instruct/post-train/"
    resumed_training = [job for job in job_dirs(host) if job.name.endswith("-train")][-1]
    assert re.search(rb"restored checkpoint \d from gs://", (resumed_training / "log").read_bytes())
    steps = {name.split("/")[6] for name in names() if name.startswith(f"{store}/post-train/cloud/checkpoints/actor/")}
    assert steps == {"6", "8"}  # checkpointsToKeep
    saved = host.host.user.home / "tpu-grpo/models/cloud"
    assert (saved / "SHA256SUMS").is_file()

    host.restart_empties_shm()
    metrics = host.invoke(
        "metrics", "--run", "cloud", "--json", "--out", str(tmp_path / "m.png"), project=bucket_store, env=laptop
    )
    assert metrics.returncode == 0, metrics.stderr
    found = json.loads(metrics.stdout)
    assert found["run"] == "cloud" and found["rows"][0]["step"] == 1
    exported = host.invoke("export", "--run-name", "cloud", "--step", "6", project=bucket_store, env=laptop)
    assert exported.returncode == 0, exported.stderr
    assert host.records()[-1]["env"]["POST_TRAIN_PATH"] == (
        f"gs://{bucket}/runs/llama3.1-8b-Instruct/post-train//cloud/checkpoints/actor/6/model_params"
    )

    # A step is done only while its output is in the bucket: the converted checkpoint deleted there, the next
    # run converts again (the host's record of the conversion notwithstanding) before it trains.
    for blob in list(storage.Client().list_blobs(bucket, prefix=f"{store}/mt-format/")):
        blob.delete()
    before = len(host.records())
    again = host.invoke("pipeline", "--run-name", "cloud2", "--batches", "2", *FAST, project=bucket_store, env=laptop)
    assert again.returncode == 0, again.stderr
    assert modules(host.records()[before:]) == [
        "to_maxtext",
        "train_rl",
        "report",
        "to_huggingface",
    ]
    assert any(name.startswith(f"{store}/mt-format/0/items/") for name in names())

    # With the VM gone, `invoke runs` still lists both runs and their steps, from the bucket.
    host.host.vm.lose()
    table = json.loads(host.invoke("runs", "--json", project=bucket_store, env=laptop).stdout)
    assert table["sources"]["host"].startswith("no answer: ") and table["sources"]["bucket"] == "answered"
    assert sorted((row["run"], row["steps"]) for row in table["runs"]) == [("cloud", 8), ("cloud2", 2)]


# ---------------------------------------------------------------- TensorBoard on the laptop


def test_tensorboard_syncs_only_new_event_bytes_and_serves_the_runs_scalars(workload_host, tmp_path):
    """An events file only grows while a run trains: each sync copies the bytes not here yet; the
    TensorBoard it serves answers its HTTP API with the run's scalars; Ctrl-C stops it, and the
    events stay on the laptop."""
    import signal as signals
    import urllib.request

    from tensorboard.backend.event_processing import event_accumulator

    from tests.host.sshd import free_port

    host = workload_host
    assert host.invoke("pipeline", "--run-name", "tb", "--batches", "4", *FAST).returncode == 0
    [remote] = list(host.host.vm.path("/dev/shm/llama3.1-8b-Instruct/post-train/tb/tensorboard").iterdir())
    whole = remote.read_bytes()
    remote.write_bytes(whole[: len(whole) // 2])  # the run so far

    def sync() -> int:
        result = host.invoke("tensorboard", "--run", "tb", "--once", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["runs"]["tb"]["bytes_copied"]

    local = host.host.state / "runs/tb/tensorboard" / remote.name
    assert sync() == len(whole) // 2 and local.read_bytes() == whole[: len(whole) // 2]
    with remote.open("ab") as grown:
        grown.write(whole[len(whole) // 2 :])
    assert sync() == len(whole) - len(whole) // 2 and local.read_bytes() == whole
    assert sync() == 0
    # --run is that run only, and a run the host never trained is refused
    assert host.invoke("train", "--run-name", "other", "--batches", "4").returncode == 0
    only = host.invoke("tensorboard", "--run", "tb", "--once", "--json")
    assert list(json.loads(only.stdout)["runs"]) == ["tb"] and not (host.host.state / "runs/other").exists()
    missing = host.invoke("tensorboard", "--run", "nosuch", "--once")
    assert (missing.returncode, missing.stderr) == (
        2,
        "error: no training of run 'nosuch' on this host; fix: name a run from uv run invoke status\n",
    )

    port = free_port()
    served = host.popen("tensorboard", "--run", "tb", "--port", str(port), "--every", "1")
    try:
        line = served.stdout.readline()
        assert line.startswith(f"TensorBoard: http://127.0.0.1:{port}/ (runs: tb); syncing every 1 s"), line
        recorded = event_accumulator.EventAccumulator(str(FIXTURES / "tensorboard"))
        recorded.Reload()
        expected = [(event.step, pytest.approx(event.value)) for event in recorded.Scalars("actor/train/loss")]
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?tag=actor/train/loss&run=tb/tensorboard"

        def scalars():
            try:
                return [(step, value) for _, step, value in json.load(urllib.request.urlopen(url, timeout=5))]
            except OSError:
                return []

        wait_for(lambda: scalars() == expected, what="TensorBoard to serve the run's loss")
        # and its evaluations, from its log (the stand-in's 0%): before (0), after batches 2 and 4, after training
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?tag=eval/accuracy&run=tb/tensorboard"
        wait_for(lambda: sorted(scalars()) == [(0, 0.0), (2, 0.0), (4, 0.0), (4, 0.0)], what="the evaluations")
        served.send_signal(signals.SIGINT)
        _, err = served.communicate(timeout=30)
    finally:
        served.kill()
    assert served.returncode == 130, err
    assert local.read_bytes() == whole


def test_a_conversion_kept_on_the_data_disk_is_restored_after_a_reboot_not_converted_again(workload_host):
    host = workload_host
    assert host.invoke("convert").returncode == 0
    folder, inputs, version = sorted((host.host.user.home / "tpu-grpo/converted").iterdir())
    assert re.fullmatch(r"llama3\.1-8b-Instruct-[0-9a-f]{12}", folder.name)
    assert (inputs.name, version.name) == (folder.name + ".inputs", folder.name + ".maxtext")
    assert json.loads(inputs.read_text())["model"] == "llama3.1-8b-Instruct" and version.read_text() == "0.2.3\n"
    assert (folder / "SHA256SUMS").is_file()
    shm = host.host.vm.path("/dev/shm/llama3.1-8b-Instruct/mt-format")
    converted = {path.relative_to(shm): path.read_bytes() for path in shm.rglob("*") if path.is_file()}
    conversions = len(host.records())

    host.restart_empties_shm()
    again = host.invoke("convert")
    assert again.returncode == 0, again.stderr
    assert "converted checkpoint restored from" in again.stdout and len(host.records()) == conversions
    restored = {path.relative_to(shm): path.read_bytes() for path in shm.rglob("*") if path.is_file()}
    assert {name: data for name, data in restored.items() if str(name) != "SHA256SUMS"} == converted

    # a copy that does not match its sums, or one of another MaxText version, is converted again
    for spoil in (
        lambda: next(p for p in folder.rglob("*") if p.is_file() and p.name != "SHA256SUMS").write_bytes(b"x"),
        lambda: version.write_text("0.2.2\n"),
    ):
        spoil()
        host.restart_empties_shm()
        result = host.invoke("convert")
        assert result.returncode == 0, result.stderr
        assert "restored" not in result.stdout and len(host.records()) == conversions + 1
        assert "converted checkpoint kept in" in result.stdout
        conversions += 1


def test_the_conversion_reads_the_model_that_provisioning_downloaded(workload_host):
    host = workload_host
    folder = host.host.user.home / "tpu-grpo/base-models/meta-llama/Llama-3.1-8B-Instruct"
    folder.mkdir(parents=True)
    folder.with_name(folder.name + ".complete").write_text("2026-12-04T09:00:00Z\n")
    host.host.own(host.host.user.home / "tpu-grpo")
    assert host.invoke("convert").returncode == 0
    inside = f"/home/{host.host.user.name}/tpu-grpo/base-models/meta-llama/Llama-3.1-8B-Instruct"
    assert host.records()[-1]["argv"][-1] == f"--hf_model_path={inside}"

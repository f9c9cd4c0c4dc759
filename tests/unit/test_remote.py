"""The host's programs take data, not bash: whatever a value holds (quotes, `$(...)`, spaces, newlines, a leading
`~`) reaches the program or script as it is, run here by bash as the host runs it, and runs nothing of its own."""

from __future__ import annotations

import shlex
import subprocess
import sys

from tpu_grpo.host import remote
from tpu_grpo.jobs import vm_jobs

HOSTILE = 'it\'s "a" $(touch pwned) `touch pwned` ; rm -rf x\n$HOME * ~'


def test_a_program_gets_its_data_as_it_was_given_and_nothing_on_its_command_line(tmp_path):
    named = f"m/{HOSTILE}"
    script = remote.run(
        "compile_cache", {"root": str(tmp_path / "caches"), "named": named, "mode": "make"}, python=sys.executable
    )
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.endswith(f"/{named}\n") and (tmp_path / "caches").is_dir()
    assert not (tmp_path / "pwned").exists()
    assert script.split(" <<", 1)[0].endswith(f"' {sys.executable} -")  # the data before, nothing after
    assert done.stdout.count(named) == 1


def test_a_script_gets_its_inputs_as_they_were_given_and_a_path_keeps_its_home(tmp_path):
    """jobs.sh lists a job in a folder whose name holds everything bash would act on; `~/` is the home."""
    home = tmp_path / "home"
    jobs = home / HOSTILE.replace("/", "|")
    (jobs / "20261206-a-train").mkdir(parents=True)
    for name, text in (("job.json", '{"step": "train", "run": "r"}'), ("command.sh", "true"), ("exit_code", "0")):
        (jobs / "20261206-a-train" / name).write_text(text)
    script = remote.shell("jobs", JOBS=f"~/{jobs.name}", TPU_LOCK="~/tpu.lock")
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    from tpu_grpo.host import facts

    (job,) = vm_jobs.Jobs.parse(facts.Answer(done.stdout))
    assert (job.id, job.state, job.exit_code) == ("20261206-a-train", "finished", 0)
    assert not (tmp_path / "pwned").exists() and not (home / "pwned").exists()


def test_a_job_starts_with_its_script_and_record_as_given(tmp_path):
    """start_job.sh writes the job's script byte for byte (quotes, `$(...)`, a trailing newline kept) and, once it
    succeeds, its step record under the name given; nothing in them runs on the way."""
    import time

    home = tmp_path / "home"
    home.mkdir()
    command = f"printf '%s' {shlex.quote(HOSTILE)}\n"
    script = remote.shell(
        "start_job",
        JOBS="~/jobs",
        ROOT="~",
        TPU_LOCK="~/tpu.lock",
        DONE="~/done",
        JOB_ID="20261206-a-train",
        COMMAND=command,
        META='{"step": "train"}',
        WRAPPER=remote.text("job_wrapper", ".sh"),
        RECORD="train-r1",
        CLAIM_PATH="",
        CLAIM="",
        BUSY_EXIT=75,
        CLAIMED_EXIT=76,
    )
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip().isdigit()
    job = home / "jobs" / "20261206-a-train"
    assert (job / "command.sh").read_text() == command
    deadline = time.monotonic() + 10
    while not (job / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (job / "log").read_text() == HOSTILE
    assert (job / "exit_code").read_text() == "0\n" and (home / "done" / "train-r1").read_text() == '{"step": "train"}'
    assert not (tmp_path / "pwned").exists() and not (home / "pwned").exists()

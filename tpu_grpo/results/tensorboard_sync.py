"""TensorBoard on the laptop (`invoke tensorboard`): the runs' events, synced from the host every
few seconds while they train (only the new bytes, tpu_grpo/results/retrieval.py), served from
`.tpu-grpo/runs/RUN/tensorboard`, where they stay after the VM is gone."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tpu_grpo.config import laptop_paths, values
from tpu_grpo.host import hosts
from tpu_grpo.jobs import maxtext, vm_jobs
from tpu_grpo.results import retrieval


def check_flags(run: str | None, port: str | None, every: str | None) -> tuple[int, float]:
    """`invoke tensorboard`'s flags: the run's name, a TCP port (default 6006), seconds between syncs (0.5 to 3600,
    default 5)."""
    if run is not None:
        maxtext.check_run_name(run, "--run")
    number = values.flag("--port", port, values.whole(1, 65535, ", a TCP port"), "6006") if port is not None else 6006
    seconds = values.flag("--every", every, values.decimal(0.5, 3600, " seconds"), "5") if every is not None else 5.0
    return number, seconds


def trained_runs(connection, run: str | None) -> list[vm_jobs.Job]:
    """The newest training job of each run on the host (of `run` only, when given)."""
    newest: dict[str, vm_jobs.Job] = {}
    for job in vm_jobs.list_jobs(connection):
        if job.step == "train" and (run is None or job.run == run):
            newest[job.run] = job
    if not newest:
        which = f"run {run!r}" if run else "any run"
        raise vm_jobs.JobError(f"no training of {which} on this host; fix: name a run from uv run invoke status")
    return list(newest.values())


def sync(session: vm_jobs.Session, run: str | None) -> dict[str, int]:
    """One round: run -> bytes copied."""
    connection = session.connection
    return {job.run: retrieval.sync_events(connection, job) for job in trained_runs(connection, run)}


def serve(runs: list[str], port: int) -> str:
    """Start TensorBoard (in this process, in the background) on the runs' local events; each run
    shows as RUN/tensorboard. Returns its URL."""
    from tensorboard import program

    board = program.TensorBoard()
    spec = ",".join(f"{run}:{laptop_paths.events(run).parent}" for run in runs)
    board.configure(
        argv=[None, "--logdir_spec", spec, "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "2"]
    )
    return board.launch()


def keep_in_sync(session: vm_jobs.Session, run: str | None, every_s: float, say: Callable[[str], None]) -> None:
    """Sync every `every_s` seconds until interrupted; a host that stops answering (the VM stopped or
    gone) is said once, and what is on the laptop stays served."""
    unreachable = False
    while True:
        time.sleep(every_s)
        try:
            copied = sync(session, run)
        except (hosts.HostError, OSError, EOFError) as error:
            session.close()
            if not unreachable:
                say(f"the host does not answer ({error}); serving the events already here, retrying")
            unreachable = True
            continue
        if unreachable:
            say("the host answers again; syncing")
        unreachable = False
        for name, count in copied.items():
            if count:
                say(f"{name}: {count} new bytes of events")


def local_runs(run: str | None, state: Path) -> list[str]:
    """The runs whose events are on the laptop already (to serve when the host is gone)."""
    found = sorted(path.parent.name for path in laptop_paths.runs(state).glob("*/tensorboard") if any(path.iterdir()))
    return [name for name in found if run is None or name == run]

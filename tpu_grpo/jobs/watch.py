"""Following a job in the terminal: a progress bar fed by MaxText's own log lines, the
lines a person wants (evals, errors) printed above it, and the whole log kept on the laptop.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tpu_grpo.config import host_paths, keys, laptop_paths
from tpu_grpo.config.errors import INTERRUPTED
from tpu_grpo.config.printing import styled
from tpu_grpo.host import facts, remote
from tpu_grpo.jobs import job_records, maxtext, vm_jobs
from tpu_grpo.jobs.job_records import JobRecord
from tpu_grpo.jobs.progress import (
    EVAL_LINES,
    RESUMES,
    STARTUP_LINES,
    Completed,
    Eval,
    EvalFailed,
    Resumed,
    Started,
    Tracker,
    TrainStep,
    absl_seconds,
    compile_cache,
    duration,
    startup,
    startup_text,
)

#: Lines worth showing as they come, besides progress: a Python failure, or the TPU out of memory.
SHOWN = re.compile(r"^(Traceback|[A-Za-z_.]*(Error|Exception)\b|Killed)|RESOURCE_EXHAUSTED")


def local_log(job_id: str) -> Path:
    path = laptop_paths.job_log(job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA …"
    minutes, secs = divmod(int(seconds), 60)
    return f"ETA {minutes}m{secs:02d}s"


class LogView:
    """A followed job's log bytes as lines: each kept in the local copy and handed to `_line`, which
    prints above a progress bar or moves it."""

    def __init__(self, console: Console, job_id: str, progress: Progress):
        self.console, self.progress = console, progress
        self.partial = b""
        self.path = local_log(job_id)
        self.file = self.path.open("wb")

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.partial:
            self._line(self.partial.decode(errors="replace"))
        self.progress.stop()
        self.file.close()

    def feed(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        *complete, self.partial = (self.partial + data).split(b"\n")
        for raw in complete:
            self._line(raw.decode(errors="replace"))

    def note(self, message: str) -> None:
        self.progress.console.print(styled("[yellow]{}[/]", message))

    def _line(self, line: str) -> None:
        raise NotImplementedError


class JobView(LogView):
    """A MaxText job's log: progress (GRPO step N of the total, eval accuracy, elapsed, ETA) and the
    lines a person wants (evals, errors)."""

    def __init__(self, console: Console, job_id: str, step: str, total_steps: int | None, verbose: bool = False):
        self.job_id, self.step, self.verbose = job_id, step, verbose
        self.tracker = Tracker(total_steps or 0)
        self.lines = 0
        super().__init__(
            console,
            job_id,
            Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}  {task.fields[accuracy]}"),
                console=console,
                transient=False,
            ),
        )
        self.task = self.progress.add_task(f"{step} {job_id}", total=total_steps or None, eta="", accuracy="")

    def _line(self, line: str) -> None:
        self.lines += 1
        event = self.tracker.feed(line)
        now = time.monotonic()
        if isinstance(event, TrainStep):
            eta = _eta(self.tracker.eta_seconds(now))
            self.progress.update(self.task, completed=event.step, eta=eta)
            if not self.console.is_terminal:
                self.console.print(
                    f"{self.step}: GRPO step {event.step}/{self.tracker.total_steps} loss {event.loss:g} {eta}"
                )
        elif isinstance(event, Resumed):
            self.progress.update(self.task, completed=event.step)
            self.progress.console.print(
                f"{self.step}: resumes after checkpoint {event.step} of "
                f"{self.tracker.total_steps} (MaxText restores it)"
            )
        elif isinstance(event, Eval):
            where = f" (step {event.step})" if event.step is not None else ""
            self.progress.update(self.task, accuracy=f"eval {event.accuracy:g}%")
            self.progress.console.print(
                f"{self.step}: {event.stage} eval{where}: accuracy {event.accuracy:g}% "
                f"({event.correct}/{event.total}), format {event.format_accuracy:g}%"
            )
        elif isinstance(event, EvalFailed):
            self.progress.console.print(
                f"{self.step}: intermediate eval (step {event.step}) failed, training goes on: {event.error}",
                markup=False,
            )
        elif isinstance(event, (Started, Completed)):
            self.progress.console.print(f"{self.step}: {line.split('] ', 1)[-1].strip()}")
        elif line.startswith("tpu-grpo: "):
            self.progress.console.print(f"{self.step}: {line.removeprefix('tpu-grpo: ')}")
        elif self.verbose or SHOWN.search(line):
            self.progress.console.print(line, markup=False, highlight=False)


def follow(
    session: vm_jobs.Session,
    job: str,
    step: str,
    console: Console,
    total_steps: int | None = None,
    verbose: bool = False,
) -> int:
    """Follow the job to its end with a progress view; returns its exit code. Ctrl-C detaches (the job goes on)
    and says how to come back."""
    try:
        with JobView(console, job, step, total_steps, verbose) as view:
            code = vm_jobs.follow(session, job, view.feed, on_reconnect=view.note)
    except KeyboardInterrupt:
        console.print(
            f"\ndetached: job {job} keeps running on {session.host.name}; reattach: uv run invoke logs "
            f"--job {job} --follow; stop it: uv run invoke cancel --job {job}"
        )
        return INTERRUPTED
    verdict = "[green]finished[/]" if code == 0 else f"[red]failed (exit {code})[/]"
    console.print(styled("{} " + verdict + ": job {}, {} log lines (saved in {})", step, job, view.lines, view.path))
    return code


PROGRESS_LINES = f"{EVAL_LINES}|Completed Successfully|{RESUMES}|{STARTUP_LINES}"


def log_progress(lines: list[str], total_steps: int, year: int) -> dict:
    """Where a training stands, from its log's lines fed at their own times (absl's lines name no year), so the rate
    is the training's and the ETA counts from its last logged step; and how its start went. A VM's status and a
    slice's read it alike."""
    tracker, at = Tracker(total_steps), 0.0
    for line in lines:
        at = absl_seconds(line, year) or at
        tracker.feed(line, now=at)
    return {**tracker.summary(now=at), "startup": startup(lines, year)}


def _progress(answer: facts.Answer, job_id: str, total_steps: int) -> dict:
    return log_progress(answer.stdout.splitlines(), total_steps, int(job_id[:4]))  # the job id begins with its year


class TrainingProgress(facts.Fact):
    """Where a training job stands (job id, its total steps), from its log's progress lines."""

    script = staticmethod(lambda job_id, total_steps: f"grep -aE '{PROGRESS_LINES}' {vm_jobs.JOBS}/{job_id}/log")
    parse = staticmethod(_progress)


def progress_of(connection, found: list[vm_jobs.Job]) -> dict | None:
    """Where the running (else newest) training stands."""
    trains = [job for job in found if job.step == "train"]
    if not trains:
        return None
    job = next((job for job in reversed(trains) if job.state == "running"), trains[-1])
    progress = TrainingProgress.read(connection, job.id, job.meta.get("total_steps") or 0)
    return {"job": job.id, "run": job.run, **progress}


class NextStart(facts.Fact):
    """The compile cache a training of these settings would start with now (the caches' root, the folder its
    settings name): the venv's versions are the host's to say."""

    script = staticmethod(
        lambda root, named: (
            f"source {host_paths.VENV}/bin/activate 2>/dev/null; "
            f"{remote.run('compile_cache', {'root': root, 'named': named, 'mode': 'look'}, then=' 2>&1 >/dev/null')}"
        )
    )
    parse = staticmethod(
        lambda answer, root, named: next(filter(None, map(compile_cache, answer.stdout.splitlines())), None)
    )


def next_start(connection, run: maxtext.Run) -> dict | None:
    """Whether the next training of `run`'s settings on this VM starts warm: its compile cache's entries."""
    return NextStart.read(connection, host_paths.COMPILE_CACHES, maxtext.compile_cache_name(run, "train"))


def _idle_stop(answer: facts.Answer) -> dict | None:
    values = dict(line.split("=", 1) for line in answer.stdout.splitlines() if "=" in line and line[0] != "#")
    minutes = int(values.get("IDLE_MINUTES") or 0)
    if not minutes:
        return None
    return {"idle_minutes": minutes, "stops_at_earliest": int(values["NOW"]) + minutes * 60}


class IdleStop(facts.Fact):
    """When the VM powers itself off (its idle-stop timer), or None when it never does. This very session counts
    as activity, so the earliest is the idle time from now."""

    script = staticmethod(lambda: f"cat {host_paths.IDLE_CONF} 2>/dev/null; echo NOW=$(date +%s)")
    parse = staticmethod(_idle_stop)


def idle_stop(connection, after_stop: str | None = None) -> dict | None:
    """The idle stop, and what a stop means for the VM's capacity (`after_stop`)."""
    found = IdleStop.read(connection)
    return found and {**found, "after_stop": after_stop}


def show_next_start(console: Console, next_cache: dict | None) -> None:
    """Whether the stack's next training starts warm, and from which compile cache (VM or slice)."""
    if next_cache is None:
        return
    size = f"{next_cache['entries']} compiled programs, {next_cache['bytes'] / 1e6:,.1f} MB"
    console.print(
        styled("next training of the stack's settings: starts warm ({}) from {}", size, next_cache["folder"])
        if next_cache["warm"]
        else styled(
            "next training of the stack's settings: starts cold (its compile cache {} is empty: this "
            "start compiles, the next ones reuse it)",
            next_cache["folder"],
        )
    )


def print_status(
    console: Console,
    host: str,
    found: list[JobRecord],
    progress: dict | None,
    idle: dict | None = None,
    next_cache: dict | None = None,
) -> None:
    if idle:
        at = time.strftime("%Y-%m-%d %H:%M", time.gmtime(idle["stops_at_earliest"]))
        console.print(
            f"idle stop: {host} powers itself off {idle['idle_minutes']} minutes after its last job ends "
            f"and its last terminal session closes: at {at} UTC at the earliest"
            + (f"; then {idle['after_stop']}" if idle.get("after_stop") else "")
        )
    else:
        console.print(f"idle stop: off, {host} runs until stopped (tpu-grpo:idleStopMinutes)")
    show_next_start(console, next_cache)
    job_records.show(console, host, found)
    if not found:
        return
    if progress:
        resumed, best = progress.get("resumed_from"), progress.get("best")
        console.print(
            f"training {progress['run']}: step {progress.get('step', 0)}/{progress.get('total_steps')}"
            + (f" (resumed after checkpoint {resumed})" if resumed else "")
            + (f"; best so far: batch {best['step']}, {best['accuracy']:g}%" if best else "")
        )
        for each in progress.get("evals", []):  # the curve so far
            where = "before training" if each["stage"] == "pre" else "after training"
            where = f"after batch {each['step']}" if each["step"] is not None else where
            console.print(
                f"  {where}: accuracy {each['accuracy']:g}% ({each['correct']}/{each['total']}), format "
                f"{each['format_accuracy']:g}%, reward {each['mean_reward']:g}" + ("  <- best" if each == best else "")
            )
        for each in progress.get("failed_evals", []):
            console.print(f"  after batch {each['step']}: the evaluation failed ({each['error']}); never chosen")
        spent, training = progress.get("eval_seconds"), progress.get("training_seconds")
        if spent and training:
            console.print(
                f"evaluation: {duration(spent)} of the training's {duration(training)} so far ({spent / training:.0%}; "
                f"{keys.PROJECT}:testBatches, checkpointPeriod and --set train:eval_batch_size trade it)"
            )
        if said := startup_text(progress.get("startup")):
            console.print(f"start-up: {said}")

"""`invoke runs`: every run the stack knows, one row a run: what it was given, how far it got and how it scored, how
long its jobs ran and what those chip-hours cost, and where its model is. Each source answers in one round trip or
says why not: the host (its jobs, their logs' step and evaluation lines, its saved models) and this laptop (its
fetched copies), so the table outlives the VM for what was fetched."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.catalog.stores import COMMIT_FILE
from tpu_grpo.config import keys, laptop_paths
from tpu_grpo.config.errors import UserError
from tpu_grpo.host import facts
from tpu_grpo.jobs import maxtext, pipeline, progress, vm_jobs
from tpu_grpo.jobs.progress import Eval, Tracker, duration, startup


@dataclass
class RunRow:
    run: str
    model: str = ""
    dataset: str = ""
    loss: str = ""
    batches: int | None = None
    sets: dict = field(default_factory=dict)  # step -> the --set overrides it was given
    state: str = ""  # converted, training, trained, failed, lost, exported, saved, fetched, published
    steps: int | None = None  # GRPO steps done, of total_steps
    total_steps: int | None = None
    accuracy_before: float | None = None  # MaxText's own evaluations, %
    accuracy_after: float | None = None  # of the last weights
    best_batch: int | None = None  # the intermediate evaluation scored best, the earlier on a tie
    best_accuracy: float | None = None  # on the test examples every evaluation of the training scores
    report: progress.Report | None = None  # the exported checkpoint's score on the examples after those
    curve: list[Eval] = field(default_factory=list)  # each intermediate evaluation, its `step` the batch
    job_hours: float = 0.0  # the wall time of the run's jobs on the host
    chips: int | None = None
    capacity: str = ""
    chip_hours: float = 0.0
    cost_usd: float | None = None  # chip-hours at the capacity's price (tpu_grpo/catalog/capacity.py)
    started: float | None = None
    where: list[str] = field(default_factory=list)
    startup: dict | None = None  # its newest training's start (tpu_grpo.jobs.progress.startup)

    def to_json(self) -> dict:
        return asdict(self)


def _script() -> str:
    return (
        f"( {vm_jobs.Jobs.script()} ) | sed 's/^/job\t/'\n"
        f"for log in {vm_jobs.JOBS}/*-train/log {vm_jobs.JOBS}/*-export/log; do "
        '[ -f "$log" ] || continue; job=${log%/log}; '
        f'grep -aE \'{progress.RUN_LOG_LINES}\' "$log" | sed "s|^|line ${{job##*/}} |"; done\n'
        f"ls -1 {pipeline.MODELS} 2>/dev/null | grep -v '[.]partial$' | sed 's/^/saved /'\ntrue"
    )


def _host_runs(answer: facts.Answer) -> list[RunRow]:
    job_lines: list[str] = []
    logs: dict[str, list[str]] = {}
    saved: set[str] = set()
    for line in answer.stdout.splitlines():
        kind, _, rest = line.partition("\t" if line.startswith("job\t") else " ")
        if kind == "job":
            job_lines.append(rest)
        elif kind == "line":
            job_id, _, text = rest.partition(" ")
            logs.setdefault(job_id, []).append(text)
        elif kind == "saved":
            saved.add(rest)
    found = vm_jobs.parse_jobs(facts.Answer("\n".join(job_lines)))
    rows: dict[str, RunRow] = {}
    for job in found:
        row = rows.setdefault(job.run, RunRow(job.run, started=job.started, where=[]))
        _add_job(row, job, logs.get(job.id, []))
    for name, row in rows.items():
        if name in saved:
            row.state = "saved"
            row.where.append(f"host: {pipeline.saved_dir(name)}")
    return list(rows.values())


class HostRuns(facts.Fact):
    """Each run on the host (one round trip): its jobs, what their logs say, whether its model is saved."""

    script = staticmethod(_script)
    parse = staticmethod(_host_runs)


def add_training_log(row: RunRow, log: list[str]) -> None:
    """Fold a training's log into its run's row: the steps done and the evaluations (before, each checkpoint's, the
    best of them, after); a resumed run's trainings come in order. A VM's runs and a slice's read it alike."""
    tracker = Tracker(row.total_steps or 0)
    for line in log:
        tracker.feed(line, now=0.0)
    if tracker.step:  # else what the store holds says them (add_bucket)
        row.steps = max(row.steps or 0, tracker.step)
    pre = [e.accuracy for e in tracker.evals if e.stage == "pre"]
    post = [e.accuracy for e in tracker.evals if e.stage == "post"]
    if row.accuracy_before is None and pre:
        row.accuracy_before = pre[0]
    row.accuracy_after = post[-1] if post else row.accuracy_after
    row.curve += [e for e in tracker.evals if e.stage == "intermediate"]
    best = progress.best(row.curve, [e.step or 0 for e in row.curve])
    row.best_batch, row.best_accuracy = (best.step, best.accuracy) if best else (None, None)


def _add_job(row: RunRow, job: vm_jobs.Job, log: list[str]) -> None:
    """Fold one job of the run into its row: the training's inputs, steps and evaluations; every job's hours."""
    ended = job.finished or (time.time() if job.state == "running" else job.started)
    hours = max(0.0, ended - job.started) / 3600
    inputs = job.meta.get("inputs", {})
    machine = MACHINES.get(inputs.get("machine", ""))
    row.job_hours += hours
    row.capacity = job.meta.get("capacity", row.capacity)
    row.chips = machine.chips if machine else row.chips  # the VM's, held by every job of the run
    price = CAPACITIES.get(row.capacity)
    row.chip_hours = row.job_hours * (row.chips or 0)
    row.cost_usd = price.cost_usd(row.chip_hours) if price and row.chips else None
    if job.step == "train":
        given = maxtext.trained_on(inputs)
        row.model, row.dataset, row.loss = given["model"], given["dataset"], given["loss"]
        row.batches = inputs.get("batches")
        row.sets = {
            step: values
            for step, values in (("convert", inputs.get("convert_set", {})), ("train", inputs.get("train_set", {})))
            if values
        }
        row.total_steps = job.meta.get("total_steps")
        add_training_log(row, log)
        row.startup = startup(log, time.gmtime(job.started).tm_year)
        failed = job.state == "finished" and job.exit_code != 0
        done = "failed" if failed else "trained"
        row.state = {"running": "training", "lost": "lost", "cancelled": "failed"}.get(job.state, done)
    elif job.step == "export" and job.state == "finished" and job.exit_code == 0:
        row.report = progress.report(log) or row.report
        row.state = "exported" if row.state == "trained" else row.state
    elif job.step == "convert" and not row.state:
        row.state = "converted" if job.state == "finished" and job.exit_code == 0 else "failed"


def laptop_runs(state: Path) -> dict[str, str]:
    """The runs fetched to this laptop whose copy is still there: run -> its folder."""
    found = {}
    for record in laptop_paths.records("fetched", state):
        if folder := laptop_paths.recorded_folder(laptop_paths.read_record(record)):
            found[record.stem] = str(folder)
    return found


def published_runs(state: Path) -> dict[str, str]:
    """The runs this laptop published (`invoke publish` records each): run -> the Hub repository's URL."""
    records = laptop_paths.records("published", state)
    urls = {record.stem: laptop_paths.read_record(record).get("url") for record in records}
    return {run: str(url) for run, url in urls.items() if url}


def add_laptops(rows: dict[str, RunRow], state: Path) -> None:
    """The laptop's fetched copies and the repositories it published to, onto the rows (new rows where the other
    sources did not know the run)."""
    for run, folder in laptop_runs(state).items():
        row = rows.setdefault(run, RunRow(run))
        row.state, row.where = "fetched", [*row.where, f"laptop: {folder}"]
    for run, url in published_runs(state).items():
        row = rows.setdefault(run, RunRow(run))
        row.state, row.where = "published", [*row.where, f"hub: {url}"]


def bucket_runs(folder: str) -> list[RunRow]:
    """The runs in a gs:// store's post-train folder (one listing): each run's checkpoints (the newest step Orbax
    finished writing) and its export, where a slice's export writes it (RUN/hf-trained)."""
    from tpu_grpo.host import gcs

    rows: dict[str, RunRow] = {}
    for name in gcs.names(folder):
        run, _, rest = name.partition("/")
        row = rows.setdefault(run, RunRow(run, state="trained"))
        if step := re.fullmatch(rf"checkpoints/actor/([0-9]+)/{re.escape(COMMIT_FILE)}", rest):  # a whole save
            row.steps = max(row.steps or 0, int(step[1]))
        elif rest.startswith(f"{maxtext.EXPORT_FOLDER}/") and row.state != "exported":
            row.state, row.where = "exported", [f"bucket: {folder.rstrip('/')}/{run}/{maxtext.EXPORT_FOLDER}"]
    return list(rows.values())


def add_bucket(rows: dict[str, RunRow], folder: str, sources: dict[str, str]) -> None:
    """The store's runs onto the rows: their steps where no host said them, their export; the bucket outlives the
    VM and the cluster."""
    try:
        found = bucket_runs(folder)
    except UserError as error:
        sources["bucket"] = f"no answer: {error}"
        return
    sources["bucket"] = "answered"
    for bucket_row in found:
        row = rows.setdefault(bucket_row.run, bucket_row)
        if row is not bucket_row:
            row.steps = row.steps if row.steps is not None else bucket_row.steps
            if bucket_row.state == "exported" and row.state in ("", "trained", "training"):
                row.state = "exported"
            row.where += [where for where in bucket_row.where if where not in row.where]


def gather(connect, state: Path, bucket: str | None = None) -> tuple[list[RunRow], dict[str, str]]:
    """Every run the sources know, newest first, and what each source answered ("answered" or why not). `connect()`
    gives the host's connection: finding the host (the stack's outputs) or reaching it may fail, and the store's
    bucket (`bucket`: its post-train folder, for a gs:// store) and the laptop's copies still answer."""
    from tpu_grpo.host import hosts

    sources, rows = {}, {}
    try:
        for row in HostRuns.read(connect()):
            rows[row.run] = row
        sources["host"] = "answered"
    except (hosts.HostError, vm_jobs.JobError) as error:
        sources["host"] = f"no answer: {error}"
    if bucket:
        add_bucket(rows, bucket, sources)
    add_laptops(rows, state)
    sources["laptop"] = "answered"
    return newest_first(rows.values()), sources


def newest_first(rows) -> list[RunRow]:
    """The rows by their run's start, the newest first; runs of no known start (a laptop's or a bucket's) last."""
    return sorted(rows, key=lambda row: (row.started or 0, row.run), reverse=True)


def scores(row: RunRow) -> str:
    """` (58% after batch 20; test 61.5% at step 20)`: the best intermediate evaluation, and the exported checkpoint's
    score on the report examples, those it has."""
    said = [] if row.best_accuracy is None else [f"{row.best_accuracy:g}% after batch {row.best_batch}"]
    if row.report and row.report.score:
        said.append(f"test {row.report.score.accuracy:g}% at step {row.report.step}")
    return f" ({'; '.join(said)})" if said else ""


def show(console: Console, rows: list[RunRow], sources: dict[str, str]) -> None:
    from rich.table import Table

    def percent(value):
        return "" if value is None else f"{value:g}%"

    def started(found: dict | None) -> str:
        """Its time to the first step, and whether its compile cache was warm: `4m10s warm`."""
        if not found:
            return ""
        cache = found.get("cache")
        ready = "" if found.get("to_first_step") is None else duration(found["to_first_step"])
        return " ".join(filter(None, (ready, cache and ("warm" if cache["warm"] else "cold"))))

    if not rows:  # thirteen empty columns say nothing
        silent = [source for source, said in sources.items() if said != "answered"]
        console.print(
            f"no runs known to {', '.join(source for source in sources if source not in silent)}; "
            f"{' and '.join(silent)} did not answer (below)"
            if silent
            else "no runs yet; make one: uv run invoke pipeline --batches 50 (docs/training.md)"
        )
        for source, said in sources.items():
            console.print(f"{source}: {said}")
        return
    table = Table(title="runs, newest first", title_justify="left")
    for column in (
        "run",
        "model",
        "dataset",
        "loss",
        "batches",
        "state",
        "steps",
        "start-up",
        "accuracy before -> after (best; test)",
        "job hours",
        "chip-hours",
        "cost",
        "model is",
    ):
        table.add_column(column)
    for row in rows:
        steps = f"{row.steps}/{row.total_steps}" if row.steps is not None else ""
        table.add_row(
            row.run,
            row.model,
            row.dataset,
            row.loss,
            "" if row.batches is None else str(row.batches),
            row.state,
            steps,
            started(row.startup),
            f"{percent(row.accuracy_before)} -> {percent(row.accuracy_after)}{scores(row)}"
            if row.accuracy_before is not None or row.accuracy_after is not None
            else "",
            f"{row.job_hours:.2f}",
            f"{row.chip_hours:.2f}",
            "" if row.cost_usd is None else f"${row.cost_usd:,.2f}",
            "; ".join(row.where),
        )
    console.print(table)
    for source, said in sources.items():
        console.print(f"{source}: {said}")
    console.print(
        "accuracy: MaxText's evaluations of the training, on the test examples that choose the checkpoint exported; "
        f"test: that checkpoint's on the {keys.PROJECT}:reportBatches examples after them (docs/training.md, Two sets)"
    )
    console.print(
        f"cost: chip-hours of the run's jobs at its capacity's price ({keys.PROJECT}:capacity; "
        "docs/capacity.md); start-up: its newest training's time to its first step, and whether its "
        "compile cache was warm"
    )

"""What a target holds of its runs, behind one interface: the VM's disks over SSH, or a slice's bucket and its
cluster's JobSets. A task asks `of` for its target's source, then never which kind it has
(tpu_grpo/jobs/targets.py is the jobs' side). Each method says what it promises and returns a record the task
renders; a fetch draws its progress bar on the Console a task hands it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

from rich.console import Console

from tpu_grpo.config import laptop_paths
from tpu_grpo.config.errors import UserError
from tpu_grpo.host.artifacts import FetchResult
from tpu_grpo.jobs import job_records
from tpu_grpo.jobs.targets import SliceTarget, Target, VmTarget
from tpu_grpo.results.metrics import Metrics
from tpu_grpo.results.runs import RunRow


class Source(Protocol):
    def unsaved(self) -> list[str]:
        """A line for each run whose model would go with the target's disks (`down`'s guard), with the command
        that saves it; none where nothing the destroy deletes holds a run."""
        ...

    def fetch(self, run: str | None, destination: Path, console: Console) -> FetchResult:
        """A run's model (default: the newest saved, or exported) to `destination` on this laptop, resumable and
        checked against its checksums, recorded as fetched."""
        ...

    def metrics(self, run: str | None, out: Path | None) -> tuple[Metrics, Path]:
        """A run's metrics (default: the newest trained) from its TensorBoard events and training log, and the
        path of its plot (`out`, else the state folder's)."""
        ...

    def runs(self) -> tuple[list[RunRow], dict[str, str]]:
        """Every run of the target and of this laptop's fetched copies, newest first, and what each source said
        (`answered`, or why not)."""
        ...


class VmSource:
    """The VM's runs: its data disk, /dev/shm and job folders (tpu_grpo/results/retrieval.py)."""

    def __init__(self, target: VmTarget):
        self.target = target

    def unsaved(self) -> list[str]:
        from tpu_grpo.results import retrieval

        return retrieval.unfetched(self.target.session)

    def fetch(self, run: str | None, destination: Path, console: Console) -> FetchResult:
        from tpu_grpo.results import retrieval

        return retrieval.fetch_run(self.target.session, run, destination, console)

    def metrics(self, run: str | None, out: Path | None) -> tuple[Metrics, Path]:
        from tpu_grpo.results import retrieval

        return retrieval.metrics_of(self.target.session, run, out)

    def runs(self) -> tuple[list[RunRow], dict[str, str]]:
        from tpu_grpo.jobs import maxtext
        from tpu_grpo.results import runs

        chosen = self.target.stack_settings()
        store = maxtext.runs_folder(chosen.store, chosen.model) if chosen.store.name == "gs" else None
        return runs.gather(lambda: self.target.session.connection, laptop_paths.state(), store)


class SliceSource:
    """A slice's runs: their folders in the bucket (which the destroy keeps) and the cluster's JobSets."""

    def __init__(self, target: SliceTarget):
        self.target, self.settings = target, target.settings

    def _newest(self, run: str | None, step: str) -> str:
        """The run named, else the run of the newest finished `step` on the cluster."""
        from tpu_grpo.jobs import slice_jobs

        return run or slice_jobs.newest_run(self.target.cluster, step, self.settings.capacity)

    def _paths(self, run: str) -> dict[str, str]:
        """A run's paths in the bucket: its folder (checkpoints, TensorBoard events) and its export."""
        from tpu_grpo.jobs import maxtext, pipeline

        return maxtext.paths(pipeline.build_run(self.settings, run_name=run))

    def unsaved(self) -> list[str]:
        return []

    def fetch(self, run: str | None, destination: Path, console: Console) -> FetchResult:
        from tpu_grpo.results import retrieval

        run = self._newest(run, "export")
        return retrieval.fetch_from_bucket(self._paths(run)["run_export"], run, destination, console)

    def metrics(self, run: str | None, out: Path | None) -> tuple[Metrics, Path]:
        from tpu_grpo.jobs import maxtext, slice_jobs
        from tpu_grpo.results import retrieval

        run = self._newest(run, "train")
        log = slice_jobs.train_log(self.target.cluster, run)
        trained = slice_jobs.trained(self.target.cluster, run, self.settings.capacity)
        iterations = maxtext.iterations(trained.sets.get("train", {})) if trained else 1
        return retrieval.metrics_from_bucket(self._paths(run)["run"], run, log, iterations, out)

    def runs(self) -> tuple[list[RunRow], dict[str, str]]:
        """One row a run of the cluster's JobSets, with its training's evaluations (a slice's jobs record no hours
        yet, and its export no report score)."""
        from tpu_grpo.jobs import maxtext, slice_jobs
        from tpu_grpo.results import runs

        settings, rows = self.settings, dict[str, RunRow]()
        # a run's steps in their order, so that its export's state is said after its training's
        records = sorted(
            (job for job in slice_jobs.status(self.target.cluster, settings.capacity) if job.step in maxtext.STEPS),
            key=lambda record: maxtext.STEPS.index(record.step),
        )
        for record in records:
            row = rows.setdefault(
                record.run, RunRow(record.run, model=settings.model, chips=settings.chips, capacity=settings.capacity)
            )
            if record.started:
                row.started = min(row.started or math.inf, job_records.seconds(record.started))
            if record.step == "train":
                training = {"finished": "trained", "pending": "training", "running": "training"}
                row.state = training.get(record.state, record.state)
                row.total_steps = record.total_steps
                if record.state != "pending":  # a pod that has not started has no log
                    log = slice_jobs.train_log(self.target.cluster, record.run)
                    runs.add_training_log(row, log.decode(errors="replace").splitlines())
            elif record.step == "export" and record.state == "finished":
                row.state, row.where = "exported", [f"bucket: {self._paths(record.run)['run_export']}"]
        sources = {"cluster": "answered"}
        runs.add_bucket(rows, maxtext.runs_folder(settings.store, settings.model), sources)
        for record in records:
            if record.step == "export" and record.state != "finished":  # what it wrote so far is no whole export
                rows[record.run].state, rows[record.run].where = "trained", []
        runs.add_laptops(rows, laptop_paths.state())
        return runs.newest_first(rows.values()), {**sources, "laptop": "answered"}


class DataDiskAtRisk(UserError):
    """A change that deletes the VM's data disk, refused while runs exist only there or nobody can tell."""

    exit_code = 1


def keep_what_only_the_data_disk_holds(
    source: Source, stack: str, doing: str, loses: str, fix_unknown: str, fix_unsaved: str
) -> None:
    """`down`'s and `up`'s one guard: refuse to `doing` (update, destroy) `stack`, which deletes the VM's data disk,
    while a run's results exist only there (nothing saved elsewhere), or while the VM does not answer, so that
    what only it holds is unknown; each refusal with its fix. `loses`: what says the disk goes ("" when the
    doing says it). A slice's source holds nothing the destroy deletes."""
    from tpu_grpo.host.hosts import ConnectError

    refusing = f"refusing to {doing} stack '{stack}': {loses}"
    try:
        unsaved = source.unsaved()
    except ConnectError as error:
        raise DataDiskAtRisk(
            f"{refusing}the VM does not answer, so what only its data disk holds is unknown ({error}); "
            f"fix: {fix_unknown}"
        ) from None
    if unsaved:
        lines = "\n".join(f"  - {line}" for line in unsaved)
        raise DataDiskAtRisk(f"{refusing}these results exist only on the VM's data disk:\n{lines}\nfix: {fix_unsaved}")


def of(target: Target) -> Source:
    """The source of a target's runs."""
    if isinstance(target, SliceTarget):
        return SliceSource(target)
    assert isinstance(target, VmTarget)
    return VmSource(target)

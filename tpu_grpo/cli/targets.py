"""Where a stack's jobs run, behind one interface: the one VM over SSH (tpu_grpo/jobs/vm_jobs.py) or a multi-host
slice's cluster through the Kubernetes API (tpu_grpo/jobs/slice_jobs.py). A task asks `pick` for the target and
then never which kind it has, in the spirit of SkyPilot's per-cloud backends and xpk's `core/`.

Each target launches a step's job (or shows its script), reads, follows and cancels jobs, says the status,
runs the whole pipeline (the VM's with its recovery from lost VMs), fetches a run's model and reads its metrics.
Nothing connects before it is used: a target of a dry run asks neither the host nor the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import IO, Protocol

from rich.console import Console

from tpu_grpo.config import laptop_paths
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.printing import styled
from tpu_grpo.host.hosts import HostFlags
from tpu_grpo.jobs import job_records
from tpu_grpo.jobs.job_records import JobRecord
from tpu_grpo.jobs.maxtext import Run


@dataclass(frozen=True)
class Where:
    """Where a task's jobs run, from its host flags, checked once before anything connects: --host's VM, else the
    stack's VM or slice, whose settings are read once here (none with --host, unless the task needs the stack)."""

    flags: HostFlags
    settings: settings_module.Settings | None = None


@dataclass(frozen=True)
class PipelineOptions:
    """What `invoke pipeline` asks of a target beyond the run: each target takes what applies to it (a slice's JobSets
    restart their own pods, keep their runs in the bucket and need no space check on a VM's disks)."""

    need_gb: dict
    keep_checkpoint: bool = False
    verbose: bool = False
    recover: int = 0  # lost VMs to bring back (a VM's)
    provisioning: dict | None = None  # the playbook values a VM brought back is provisioned with
    pulumi_out: IO[str] | None = None  # where `pulumi up`'s own output goes (stderr with --json)


class Target(Protocol):
    """What a task asks of where its jobs run; VmTarget and SliceTarget implement it, and a task never asks which."""

    where: str

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]: ...
    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> tuple[int, dict]: ...
    def script(self, run: Run, step: str) -> str: ...
    def launch(self, run: Run, step: str, console: Console, detach: bool, verbose: bool) -> int: ...
    def read_log(self, job: str | None) -> Iterable[bytes]: ...
    def follow(self, job: str | None, console: Console, verbose: bool) -> int: ...
    def cancel(self, job: str | None) -> str: ...
    def status(self) -> dict: ...
    def show_status(self, console: Console, status: dict) -> None: ...
    def check_recovery(self) -> None: ...
    def unsaved(self) -> list[str]: ...
    def fetch(self, run: str | None, destination, console: Console): ...
    def metrics(self, run: str | None, out): ...
    def runs(self) -> tuple[list, dict]: ...


class VmTarget:
    """The one VM (the stack's, or `--host`): its jobs are detached processes with a folder each."""

    where = "on the host"

    def __init__(self, flags: HostFlags, settings: settings_module.Settings | None):
        self.flags, self.settings = flags, settings  # the stack's, for its VM (what an idle stop means, recovery)

    @cached_property
    def session(self):
        """The host's session (its address from the stack's outputs, or --host), which connects on first use."""
        from tpu_grpo.jobs import vm_jobs

        return vm_jobs.session(self.flags, self.settings)

    def fresh_session(self):
        """A new session: the VM may be another since the last one (brought back at another address)."""
        self.__dict__.pop("session", None)
        return self.session

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]:
        """Each step's script and what save does: as data, and as text (a run not named: as a new one's, since
        which earlier pipeline it continues is known once the host is asked)."""
        from tpu_grpo.jobs import maxtext, pipeline

        run = run.named(maxtext.timestamp_run_name())
        save = (
            f"copy {maxtext.paths(run)['hf_export']} to {pipeline.saved_dir(run.name)} on the data disk, "
            f"with SHA256SUMS; the run's TensorBoard events{' and last checkpoint' if keep_checkpoint else ''} to "
            f"{pipeline.run_archive(run.name)}"
        )
        scripts = [{"step": step, "script": maxtext.script(run, step)} for step in maxtext.STEPS]
        return (
            {"run": run.name, "steps": [*scripts, {"step": "save", "description": save}]},
            "".join(f"{entry['script']}\n" for entry in scripts) + f"# save: {save}\n",
        )

    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> tuple[int, dict]:
        """Preflight, then convert -> train -> export -> save (steps done are skipped), following each job. With
        `recover` N, up to N lost VMs are brought back (`invoke up`, provisioning with `provisioning`, the same
        pipeline again: tpu_grpo/jobs/recovery.py), and a dropped link asks the cloud whether the VM is gone."""
        from tpu_grpo.config import errors
        from tpu_grpo.jobs import maxtext, pipeline, recovery, watch

        chosen = self.settings if options.recover else None
        verbose = options.verbose
        new_name = maxtext.timestamp_run_name()  # a new run's, if it is not named and continues no earlier pipeline
        total = pipeline.job_meta(run.named(new_name), "train").get("total_steps")

        def report(step):
            if step.state in ("done", "skipped"):
                console.print(f"{step.name}: {step.state} ({step.detail})")
            elif step.name == "save":
                console.print(f"save: model copied to {step.detail} on the data disk")

        def attempt():
            nonlocal run
            session = self.fresh_session()
            run = pipeline.named_pipeline(session.connection, run, new_name)  # each attempt after, the same run
            if chosen:  # a dropped link asks the cloud whether the VM is gone
                session.vm_gone = lambda: recovery.gone(chosen)

            def follow(job, step):
                code = watch.follow(session, job, step, console, total if step == "train" else None, verbose)
                if code == errors.INTERRUPTED:
                    raise errors.Detached()
                return code

            return pipeline.run_pipeline(
                session,
                run,
                need_gb=options.need_gb,
                follow=follow,
                on_step=report,
                keep_checkpoint=options.keep_checkpoint,
            )

        def bring_back():
            assert chosen, "recovery is of the stack's VM"
            recovery.bring_back(
                chosen, lambda: self.flags.hosts(chosen), options.provisioning, console.print, stdout=options.pulumi_out
            )
            return recovery.where_training_stands(self.fresh_session().connection, run.named(new_name))

        outcome = (
            attempt()
            if chosen is None
            else recovery.keep_going(
                attempt,
                chosen,
                bring_back,
                options.recover,
                lambda: recovery.RecoveryLog.of(run.run_name or new_name),
                console.print,
            )
        )
        console.print(
            styled(
                "[green]run {} is complete[/]: model saved in {} on {}; get it with: uv run invoke fetch --run {}",
                outcome.run,
                outcome.saved or "an earlier run",
                outcome.host,
                outcome.run,
            )
        )
        return 0, outcome.to_json()

    def script(self, run: Run, step: str) -> str:
        from tpu_grpo.jobs import maxtext

        return maxtext.script(run, step)

    def launch(self, run: Run, step: str, console: Console, detach: bool, verbose: bool) -> int:
        """Start the step as a detached job (export: of the run named, else the newest trained) and follow it to
        its exit code, or return at once with `detach`."""
        from tpu_grpo.jobs import pipeline, watch

        connection = self.session.connection
        if step == "export":
            run = pipeline.for_export(connection, run)
        job = pipeline.start_checked(connection, run, step)
        console.print(f"started {step} job {job} (run {run.name}) on {self.session.host.name}")
        if detach:
            console.print(f"follow it: uv run invoke logs --job {job} --follow")
            return 0
        total = pipeline.job_meta(run, step).get("total_steps")
        return watch.follow(self.session, job, step, console, total, verbose)

    def _job(self, job: str | None):
        from tpu_grpo.jobs import vm_jobs

        return vm_jobs.find(vm_jobs.list_jobs(self.session.connection), job)

    def read_log(self, job: str | None) -> Iterable[bytes]:
        from tpu_grpo.jobs import vm_jobs

        return [vm_jobs.read_log(self.session.connection, self._job(job).id)]

    def follow(self, job: str | None, console: Console, verbose: bool) -> int:
        from tpu_grpo.jobs import watch

        found = self._job(job)
        return watch.follow(self.session, found.id, found.step, console, found.meta.get("total_steps"), verbose)

    def cancel(self, job: str | None) -> str:
        from tpu_grpo.jobs import vm_jobs

        found = self._job(job)
        if found.state != "running":
            return f"job {found.id} is not running ({found.state}); nothing to cancel"
        vm_jobs.cancel(self.session.connection, found)
        return f"cancelled job {found.id} ({found.step} of run {found.run}); the TPU is free"

    def stack_settings(self) -> settings_module.Settings:
        """The stack's settings, read now when the task was given --host (its run and store are still the stack's)."""
        return self.settings or settings_module.load(self.flags.stack, lenient=True)

    def status(self) -> dict:
        from tpu_grpo.host import chips
        from tpu_grpo.jobs import vm_jobs, watch

        connection = self.session.connection
        found = vm_jobs.list_jobs(connection)
        after_stop = self.settings.obtained.after_stop if self.settings else None  # unknown for a VM of no stack
        chosen = self.stack_settings()
        return status(
            self.session.host.name,
            [job.record() for job in found],
            progress=watch.progress_of(connection, found),
            idle_stop=watch.idle_stop(connection, after_stop),
            tpu=chips.Chips.read(connection),
            compile_cache=watch.next_start(connection, Run.of(chosen.training)),
        )

    def check_recovery(self) -> None:
        """--recover brings this VM back when it is lost."""

    def unsaved(self) -> list[str]:
        """A line for each run whose model would go with the VM's disks, with the command that saves it."""
        from tpu_grpo.results import retrieval

        return retrieval.unfetched(self.session)

    def fetch(self, run: str | None, destination, console: Console):
        """A run's saved model (default: the newest saved) to `destination` on this laptop."""
        from tpu_grpo.results import retrieval

        return retrieval.fetch_run(self.session, run, destination, console)

    def metrics(self, run: str | None, out):
        """A run's metrics (default: the newest trained) from its events and log on the host, and its plot."""
        from tpu_grpo.results import retrieval

        return retrieval.metrics_of(self.session, run, out)

    def runs(self) -> tuple[list, dict]:
        """Every run of this VM and of this laptop's fetched copies (tpu_grpo/results/runs.py), and what each source
        said."""
        from tpu_grpo.jobs import maxtext
        from tpu_grpo.results import runs

        chosen = self.stack_settings()
        store = maxtext.runs_folder(chosen.store, chosen.model) if chosen.store.name == "gs" else None
        return runs.gather(lambda: self.session.connection, laptop_paths.state(), store)

    def show_status(self, console: Console, status: dict) -> None:
        from tpu_grpo.host import chips
        from tpu_grpo.jobs import watch

        watch.print_status(
            console,
            status["where"],
            [JobRecord(**job) for job in status["jobs"]],
            status["progress"],
            status["idle_stop"],
            status["compile_cache"],
        )
        chips.show(console, status["tpu"])


class SliceTarget:
    """A multi-host slice's GKE cluster: its jobs are tpu-grpo's JobSets."""

    where = "on the cluster"

    def __init__(self, settings: settings_module.Settings):
        self.settings = settings

    @cached_property
    def cluster(self):
        from tpu_grpo.cloud.kube import Cluster

        return Cluster.of_stack(self.settings.stack)

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]:
        """Each step's JobSet: as data, and as kubectl takes them."""
        from tpu_grpo.cloud import jobset
        from tpu_grpo.jobs import maxtext, slice_jobs

        run = run.named(maxtext.timestamp_run_name())  # a slice's pipeline not named is a new run
        manifests = [slice_jobs.manifest(self.settings, run, step) for step in maxtext.STEPS]
        return (
            {
                "run": run.name,
                "steps": [{"step": step, "jobset": manifest} for step, manifest in zip(maxtext.STEPS, manifests)],
            },
            jobset.to_yaml(manifests),
        )

    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> tuple[int, dict]:
        """convert -> train -> export as JobSets (a step whose output is in the bucket is skipped), each followed;
        no recovery of its own (a JobSet restarts its own pods, check_recovery refuses --recover), no space check
        (the bucket holds the runs, the CPU pool's disk is sized from the model)."""
        from tpu_grpo.jobs import maxtext, slice_jobs

        return slice_jobs.pipeline(
            self.cluster, self.settings, run.named(maxtext.timestamp_run_name()), console, options.verbose
        )

    def script(self, run: Run, step: str) -> str:
        """The step's JobSet, as kubectl takes it."""
        from tpu_grpo.cloud import jobset
        from tpu_grpo.jobs import slice_jobs

        return jobset.to_yaml([slice_jobs.manifest(self.settings, run, step)])

    def launch(self, run: Run, step: str, console: Console, detach: bool, verbose: bool) -> int:
        """Create the step's JobSet (export: of the run named, else the newest trained) and follow it."""
        from tpu_grpo.jobs import slice_jobs

        if step == "export":
            run = slice_jobs.for_export(self.cluster, run, self.settings.capacity)
        return slice_jobs.launch(self.cluster, self.settings, run, step, console, detach, verbose)

    def _job(self, job: str | None):
        from tpu_grpo.jobs import slice_jobs

        return slice_jobs.find(self.cluster, job, self.settings.capacity)

    def read_log(self, job: str | None) -> Iterable[bytes]:
        from tpu_grpo.jobs import slice_jobs

        return slice_jobs.read_log(self.cluster, self._job(job).name)

    def follow(self, job: str | None, console: Console, verbose: bool) -> int:
        from tpu_grpo.jobs import slice_jobs

        found = self._job(job)
        return slice_jobs.follow(
            self.cluster, found.name, found.step, console, self.settings.capacity, found.total_steps, verbose
        )

    def cancel(self, job: str | None) -> str:
        from tpu_grpo.jobs import slice_jobs

        gone = slice_jobs.cancel(self.cluster, job, self.settings.capacity)
        return (
            f"cancelled {', '.join(gone)}: deleted with their pods"
            if gone
            else "no job is pending or running; nothing to cancel"
        )

    def status(self) -> dict:
        from tpu_grpo.jobs import slice_jobs

        return status(
            self.settings.vm_name,
            slice_jobs.status(self.cluster, self.settings.capacity),
            slice=f"{self.settings.slice} x{self.settings.num_slices}",
            compile_cache=slice_jobs.next_start(self.settings),
        )

    def _newest(self, run: str | None, step: str) -> str:
        """The run named, else the run of the newest finished `step` on the cluster."""
        from tpu_grpo.jobs import slice_jobs

        return run or slice_jobs.newest_run(self.cluster, step, self.settings.capacity)

    def _paths(self, run: str) -> dict[str, str]:
        """A run's paths in the bucket: its folder (checkpoints, TensorBoard events) and its export."""
        from tpu_grpo.jobs import maxtext, pipeline

        return maxtext.paths(pipeline.build_run(self.settings, run_name=run))

    def check_recovery(self) -> None:
        raise UserError(
            "--recover brings a lost VM back; a slice's JobSet restarts its own pods (its failure policy); "
            "fix: run without --recover"
        )

    def unsaved(self) -> list[str]:
        """None: a slice's runs are in its bucket, which the destroy keeps."""
        return []

    def fetch(self, run: str | None, destination, console: Console):
        """A run's export (default: the newest exported) from its folder in the bucket, where the export writes."""
        from tpu_grpo.results import retrieval

        run = self._newest(run, "export")
        return retrieval.fetch_from_bucket(self._paths(run)["run_export"], run, destination, console)

    def metrics(self, run: str | None, out):
        """A run's metrics (default: the newest trained) from its events in the bucket and its training log."""
        from tpu_grpo.jobs import slice_jobs
        from tpu_grpo.results import retrieval

        run = self._newest(run, "train")
        return retrieval.metrics_from_bucket(self._paths(run)["run"], run, slice_jobs.train_log(self.cluster, run), out)

    def runs(self) -> tuple[list, dict]:
        """Every run of the cluster's JobSets, one row a run (a slice's jobs record no hours or evaluations yet), and
        this laptop's fetched copies."""
        from tpu_grpo.jobs import maxtext, slice_jobs
        from tpu_grpo.results import runs

        rows: dict = {}
        # a run's steps in their order, so that its export's state is said after its training's
        records = sorted(
            slice_jobs.status(self.cluster, self.settings.capacity), key=lambda record: maxtext.STEPS.index(record.step)
        )
        for record in records:
            row = rows.setdefault(
                record.run,
                runs.RunRow(
                    record.run, model=self.settings.model, chips=self.settings.chips, capacity=self.settings.capacity
                ),
            )
            if record.started:
                row.started = min(row.started or math.inf, job_records.seconds(record.started))
            if record.step == "train":
                row.state = {"finished": "trained", "pending": "training", "running": "training"}.get(
                    record.state, record.state
                )
            elif record.step == "export" and record.state == "finished":
                row.state, row.where = "exported", [f"bucket: {self._paths(record.run)['run_export']}"]
        sources = {"cluster": "answered"}
        runs.add_bucket(rows, maxtext.runs_folder(self.settings.store, self.settings.model), sources)
        for record in records:
            if record.step == "export" and record.state != "finished":  # what it wrote so far is no whole export
                rows[record.run].state, rows[record.run].where = "trained", []
        runs.add_laptops(rows, laptop_paths.state())
        return runs.newest_first(rows.values()), {**sources, "laptop": "answered"}

    def show_status(self, console: Console, status: dict) -> None:
        from tpu_grpo.jobs import watch

        settings = self.settings
        watch.show_next_start(console, status["compile_cache"])
        job_records.show(
            console,
            f"cluster {settings.vm_name} (slice {settings.slice} x{settings.num_slices}, {settings.capacity})",
            [JobRecord(**job) for job in status["jobs"]],
        )


def status(
    where: str,
    records: list[JobRecord],
    *,
    progress: dict | None = None,
    idle_stop: dict | None = None,
    tpu: dict | None = None,
    slice: str | None = None,
    compile_cache: dict | None = None,
) -> dict:
    """`status --json`, one shape on both targets: where (the VM or the cluster), its jobs, and what is known of
    the training's progress and start-up, the idle stop, the TPU chips (the VM's), the slice (the cluster's) and
    the compile cache the stack's next training would start with (the VM's); null if not."""
    return {
        "where": where,
        "jobs": [record.to_json() for record in records],
        "progress": progress,
        "idle_stop": idle_stop,
        "tpu": tpu,
        "slice": slice,
        "compile_cache": compile_cache,
    }


def pick(where: Where) -> Target:
    """The target of a task's host flags: `--host`'s VM, else the stack's slice or VM."""
    if where.flags.given or where.settings is None:
        return VmTarget(where.flags, where.settings)
    if where.settings.tpu_slice:
        return SliceTarget(where.settings)
    return VmTarget(where.flags, where.settings)

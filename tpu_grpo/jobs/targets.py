"""Where a stack's jobs run, behind one interface: the one VM over SSH (tpu_grpo/jobs/vm_jobs.py) or a multi-host
slice's cluster through the Kubernetes API (tpu_grpo/jobs/slice_jobs.py). A task asks `pick` for the target and
then never which kind it has, in the spirit of SkyPilot's sky/provision/__init__.py, whose every operation says
what it promises and returns typed records: a target returns frozen records the tasks render, and writes only
what streams while a job runs (its log, its progress bar) to the Console a task hands it. What a target holds of
its runs (models, metrics, the runs themselves) is tpu_grpo/results/sources.py's.

Nothing connects before it is used: a target of a dry run asks neither the host nor the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import IO, Any, Protocol

from rich.console import Console

from tpu_grpo.config.errors import UserError
from tpu_grpo.config.settings import Settings, load
from tpu_grpo.host.hosts import HostFlags
from tpu_grpo.jobs.job_records import JobRecord
from tpu_grpo.jobs.maxtext import Run


@dataclass(frozen=True)
class Where:
    """Where a task's jobs run, from its host flags, checked once before anything connects: --host's VM, else the
    stack's VM or slice, whose settings are read once here (none with --host, unless the task needs the stack)."""

    flags: HostFlags
    settings: Settings | None = None

    def stack_settings(self) -> Settings:
        """The stack's settings, for a task whose check read them (OnHost.where's with_stack)."""
        assert self.settings is not None, "the task's check reads the stack (with_stack=True)"
        return self.settings


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


@dataclass(frozen=True)
class Started:
    """A step's job, created and running (or pending) on its target."""

    job: str
    step: str
    run: str
    where: str  # the VM's name, or the slice's part and cluster


@dataclass(frozen=True)
class Finished:
    """A pipeline's end: its exit code (0: the model is saved), the run, and what happened step by step as
    `pipeline --json` prints it."""

    code: int
    run: str
    model: str | None  # where the model is now (the VM's data disk, the bucket), None when not saved
    outcome: dict


@dataclass(frozen=True)
class Status:
    """`status`, one shape on both targets: where (the VM or the cluster), its jobs, and what is known of the
    training's progress and start-up, the idle stop, the TPU chips (the VM's), the slice (the cluster's) and the
    compile cache the stack's next training would start with; None where unknown."""

    where: str
    jobs: tuple[JobRecord, ...]
    progress: dict | None = None
    idle_stop: dict | None = None
    tpu: dict | None = None
    slice: str | None = None
    capacity: str | None = None
    compile_cache: dict | None = None

    def to_json(self) -> dict:
        return {
            "where": self.where,
            "jobs": [record.to_json() for record in self.jobs],
            "progress": self.progress,
            "idle_stop": self.idle_stop,
            "tpu": self.tpu,
            "slice": self.slice,
            "compile_cache": self.compile_cache,
        }


class Target(Protocol):
    """What a task asks of where its jobs run; VmTarget and SliceTarget implement it, and a task never asks which.
    Every method raises UserError (a one-line `what; fix: how`) for what the user can fix, and returns a record."""

    #: How the target's place reads in a sentence: "on the host", "on the cluster".
    where: str

    def script(self, run: Run, step: str) -> str:
        """The step's job as it would run (`--dry-run`): the VM's bash, the slice's JobSet; connects to nothing."""
        ...

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]:
        """Every step of `pipeline` as it would run, as data (`--json`) and as text; connects to nothing."""
        ...

    def start(self, run: Run, step: str) -> Started:
        """Create the step's job (export: of the run named, else the newest trained run) and return at once; refuses
        while another job holds the TPU (the VM's lock, the slice's JobSet of that name)."""
        ...

    def follow(self, job: str | None, console: Console, verbose: bool) -> int:
        """Stream a job (default: the running one, else the newest) to `console` with its progress until it ends,
        over dropped links; its exit code, or errors.INTERRUPTED on Ctrl-C (the job runs on)."""
        ...

    def read_log(self, job: str | None) -> Iterable[bytes]:
        """A job's log as it is now (default: the running job, else the newest), in chunks."""
        ...

    def cancel(self, job: str | None) -> str:
        """Stop a job (default: the running one) and free its chips; a sentence saying what was stopped, or why
        nothing was."""
        ...

    def status(self) -> Status:
        """The jobs and what is known of the running training, its chips and the next start."""
        ...

    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> Finished:
        """convert -> train -> export (-> save, on a VM), steps done skipped, each followed on `console`."""
        ...

    def check_recovery(self) -> None:
        """Refuse `--recover` where the target brings nothing back itself."""
        ...

    def stack_settings(self) -> Settings:
        """The stack's settings (read now when the task was given --host: its runs and store are still the stack's)."""
        ...


class VmTarget:
    """The one VM (the stack's, or `--host`): its jobs are detached processes with a folder each."""

    where = "on the host"

    def __init__(self, flags: HostFlags, settings: Settings | None):
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

    def script(self, run: Run, step: str) -> str:
        from tpu_grpo.jobs import maxtext

        return maxtext.script(run, step)

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]:
        """Each step's script, as the host's chain runs them in order (a run not named is shown as a new one's: which
        earlier pipeline it continues is known once the host is asked); the export's, for the last checkpoint."""
        from tpu_grpo.jobs import maxtext, pipeline

        run = run.named(maxtext.timestamp_run_name())
        steps = [pipeline.chain_step(run, step, keep_checkpoint) for step in pipeline.PIPELINE]
        note = (
            "# the host runs these in order, each a job of its own; the export converts the checkpoint the training's "
            "evaluations scored best, known once it has ended (shown here with its last)\n"
        )
        return (
            {"run": run.name, "steps": [{"step": step["name"], "script": step["script"]} for step in steps]},
            note + "".join(f"{step['script']}\n" for step in steps),
        )

    def start(self, run: Run, step: str) -> Started:
        from tpu_grpo.jobs import pipeline

        connection = self.session.connection
        if step == "export":
            run = pipeline.for_export(connection, run)
        job = pipeline.start_checked(connection, run, step)
        return Started(job, step, run.name, self.session.host.name)

    def _job(self, job: str | None):
        from tpu_grpo.jobs import vm_jobs

        return vm_jobs.find(vm_jobs.list_jobs(self.session.connection), job)

    def follow(self, job: str | None, console: Console, verbose: bool) -> int:
        """The job to its end; a pipeline's chain (named, or the one whose step runs now when none is named) to its
        last step, each step as it starts (a failed step raises its error)."""
        from tpu_grpo.jobs import pipeline, watch

        found = self._job(job)
        chain = None
        if found.step == "pipeline":
            chain = found.id
        elif job is None and found.state == "running":  # the step a chain runs now: the chain, to its end
            chain = found.meta.get("chain")
        if chain is None:
            return watch.follow(self.session, found.id, found.step, console, found.meta.get("total_steps"), verbose)
        with self._detaching(console):
            pipeline.follow_chain(
                self.session, found.run, chain, self._step_follow(console, verbose), print_step(console)
            )
        return 0

    @contextmanager
    def _detaching(self, console: Console):
        """Ctrl-C while a chain is followed between its steps: the chain goes on, and how to come back is said."""
        from tpu_grpo.config import errors

        try:
            yield
        except KeyboardInterrupt:
            console.print(
                f"\ndetached: the pipeline keeps running on {self.session.host.name}; reattach: uv run invoke logs "
                "--follow (or the same pipeline command); stop it: uv run invoke cancel"
            )
            raise errors.Detached() from None

    def _step_follow(self, console: Console, verbose: bool, total: int | None = None):
        """How a chain's step is followed: with its progress view; Ctrl-C detaches from the whole chain."""
        from tpu_grpo.config import errors
        from tpu_grpo.jobs import watch

        def follow(job: str, step: str) -> int:
            steps = total if total is not None else self._job(job).meta.get("total_steps")
            code = watch.follow(self.session, job, step, console, steps if step == "train" else None, verbose)
            if code == errors.INTERRUPTED:
                raise errors.Detached()
            return code

        return follow

    def read_log(self, job: str | None) -> Iterable[bytes]:
        from tpu_grpo.jobs import vm_jobs

        return [vm_jobs.read_log(self.session.connection, self._job(job).id)]

    def cancel(self, job: str | None) -> str:
        from tpu_grpo.jobs import vm_jobs

        found = self._job(job)
        if found.state != "running":
            return f"job {found.id} is not running ({found.state}); nothing to cancel"
        chain = found.id if found.step == "pipeline" else found.meta.get("chain")
        connection = self.session.connection
        if chain is None:
            vm_jobs.cancel(connection, found)
            return f"cancelled job {found.id} ({found.step} of run {found.run}); the TPU is free"
        # the chain first, so that it starts no next step; then the step it runs, listed once the chain is gone
        for each in vm_jobs.list_jobs(connection):
            if each.id == chain and each.state == "running":
                vm_jobs.cancel(connection, each)
        steps = [each for each in vm_jobs.list_jobs(connection) if each.meta.get("chain") == chain]
        running = [step for step in steps if step.state == "running"]
        for step in running:
            vm_jobs.cancel(connection, step)
        said = [f"the pipeline of run {found.run} (job {chain})", *(f"its {s.step} (job {s.id})" for s in running)]
        return f"cancelled {' and '.join(said)}; the TPU is free"

    def status(self) -> Status:
        from tpu_grpo.host import chips
        from tpu_grpo.jobs import vm_jobs, watch

        connection = self.session.connection
        found = vm_jobs.list_jobs(connection)
        after_stop = self.settings.obtained.after_stop if self.settings else None  # unknown for a VM of no stack
        return Status(
            self.session.host.name,
            tuple(job.record() for job in found),
            progress=watch.progress_of(connection, found),
            idle_stop=watch.idle_stop(connection, after_stop),
            tpu=chips.Chips.read(connection),
            compile_cache=watch.next_start(connection, Run.of(self.stack_settings().training)),
        )

    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> Finished:
        """Preflight first. With `recover` N, up to N lost VMs are brought back (`invoke up`, provisioning with
        `provisioning`, the same pipeline again: tpu_grpo/jobs/recovery.py), and a dropped link asks the cloud
        whether the VM is gone."""
        from tpu_grpo.jobs import maxtext, pipeline, recovery

        chosen = self.settings if options.recover else None
        verbose = options.verbose
        new_name = maxtext.timestamp_run_name()  # a new run's, if it is not named and continues no earlier pipeline
        total = pipeline.job_meta(run.named(new_name), "train").get("total_steps")

        def attempt():
            nonlocal run
            session = self.fresh_session()
            run = pipeline.named_pipeline(session.connection, run, new_name)  # each attempt after, the same run
            if chosen:  # a dropped link asks the cloud whether the VM is gone
                session.vm_gone = lambda: recovery.gone(chosen)
            return pipeline.run_pipeline(
                session,
                run,
                need_gb=options.need_gb,
                follow=self._step_follow(console, verbose, total),
                on_step=print_step(console),
                keep_checkpoint=options.keep_checkpoint,
            )

        def bring_back():
            assert chosen, "recovery is of the stack's VM"
            recovery.bring_back(
                chosen,
                lambda: self.flags.hosts(chosen),
                options.provisioning,
                console.print,
                stdout=options.pulumi_out,
            )
            return recovery.where_training_stands(self.fresh_session().connection, run.named(new_name))

        with self._detaching(console):
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
        where = f"{outcome.saved} on {outcome.host}" if outcome.saved else f"an earlier run on {outcome.host}"
        return Finished(0, outcome.run, where, outcome.to_json())

    def check_recovery(self) -> None:
        """--recover brings this VM back when it is lost."""

    def stack_settings(self) -> Settings:
        return self.settings or load(self.flags.stack, lenient=True)


class SliceTarget:
    """A multi-host slice's GKE cluster: its jobs are tpu-grpo's JobSets."""

    where = "on the cluster"

    def __init__(self, settings: Settings):
        self.settings = settings

    @cached_property
    def cluster(self):
        from tpu_grpo.cloud.kube import Cluster

        return Cluster.of_stack(self.settings.stack)

    def script(self, run: Run, step: str) -> str:
        """The step's JobSet, as kubectl takes it."""
        from tpu_grpo.cloud import jobset
        from tpu_grpo.jobs import slice_jobs

        return jobset.to_yaml([slice_jobs.manifest(self.settings, run, step)])

    def pipeline_dry_run(self, run: Run, keep_checkpoint: bool) -> tuple[dict, str]:
        """Each step's JobSet, as the cluster's driver creates them in order (a slice's pipeline not named is a new
        run); the export's, for the last checkpoint."""
        from tpu_grpo.cloud import jobset
        from tpu_grpo.jobs import maxtext, slice_jobs

        run = run.named(maxtext.timestamp_run_name())
        manifests = [slice_jobs.manifest(self.settings, run, step) for step in maxtext.STEPS]
        note = (
            f"# the driver Job {slice_jobs.driver_name(run)} creates these in order, each once the one before has "
            "completed; the export converts the checkpoint the training's evaluations scored best, known once it has "
            "ended (shown here with its last)\n"
        )
        return (
            {
                "run": run.name,
                "steps": [{"step": step, "jobset": manifest} for step, manifest in zip(maxtext.STEPS, manifests)],
            },
            note + jobset.to_yaml(manifests),
        )

    def start(self, run: Run, step: str) -> Started:
        from tpu_grpo.jobs import slice_jobs

        if step == "export":
            run = slice_jobs.for_export(self.cluster, run, self.settings.capacity)
        name = slice_jobs.start(self.cluster, self.settings, run, step)
        part = f"slice {self.settings.slice}" if step == "train" else "the slice's CPU host"
        return Started(name, step, run.name, f"{part} (cluster {self.settings.vm_name})")

    def _job(self, job: str | None):
        from tpu_grpo.jobs import slice_jobs

        return slice_jobs.find(self.cluster, job, self.settings.capacity)

    def follow(self, job: str | None, console: Console, verbose: bool) -> int:
        """The job to its end; a pipeline's driver (named, or the one of the run whose step runs now when none is
        named) to its last step, each step as it starts."""
        from tpu_grpo.jobs import slice_jobs

        found, capacity = self._job(job), self.settings.capacity
        if job is None and found.step != slice_jobs.CHAIN:
            chains = slice_jobs.drivers_on(self.cluster)
            found = next((each for each in chains if each.run == found.run and each.state == "running"), found)
        if found.step == slice_jobs.CHAIN:
            return slice_jobs.follow_chain(self.cluster, found.name, console, capacity, verbose=verbose)[0]
        return slice_jobs.follow(self.cluster, found.name, found.step, console, capacity, found.total_steps, verbose)

    def read_log(self, job: str | None) -> Iterable[bytes]:
        from tpu_grpo.jobs import slice_jobs

        found = self._job(job)
        if found.step == slice_jobs.CHAIN:
            return [slice_jobs.driver_log(self.cluster, found.name)]
        return slice_jobs.read_log(self.cluster, found.name)

    def cancel(self, job: str | None) -> str:
        from tpu_grpo.jobs import slice_jobs

        gone = slice_jobs.cancel(self.cluster, job, self.settings.capacity)
        return (
            f"cancelled {', '.join(gone)}: deleted with their pods"
            if gone
            else "no job is pending or running; nothing to cancel"
        )

    def status(self) -> Status:
        from tpu_grpo.jobs import slice_jobs

        records = slice_jobs.status(self.cluster, self.settings.capacity)
        return Status(
            self.settings.vm_name,
            tuple(records),
            progress=slice_jobs.progress_of(self.cluster, records),
            slice=f"{self.settings.slice} x{self.settings.num_slices}",
            capacity=self.settings.capacity,
            compile_cache=slice_jobs.next_start(self.settings),
        )

    def pipeline(self, run: Run, console: Console, options: PipelineOptions) -> Finished:
        """A driver Job on the cluster runs the steps (slice_jobs.pipeline); a step whose output is in the bucket is
        skipped; no recovery of its own (a JobSet restarts its own pods, check_recovery refuses --recover), no space
        check (the bucket holds the runs, the CPU pool's disk is sized from the model)."""
        from tpu_grpo.jobs import maxtext, slice_jobs

        run = run.named(maxtext.timestamp_run_name())
        code, outcome = slice_jobs.pipeline(self.cluster, self.settings, run, console, options.verbose)
        return Finished(code, run.name, outcome["model"], outcome)

    def check_recovery(self) -> None:
        raise UserError(
            "--recover brings a lost VM back; a slice's JobSet restarts its own pods (its failure policy); "
            "fix: run without --recover"
        )

    def stack_settings(self) -> Settings:
        return self.settings


def print_step(console: Console) -> Callable[[Any], None]:
    """How a pipeline's step that did not run (done, or skipped) or ended before the follow began, or its save, is
    said."""
    from tpu_grpo.jobs import pipeline

    def report(step) -> None:
        if step.state in ("done", "skipped"):
            console.print(f"{step.name}: {step.state} ({step.detail})")
        elif step.detail == pipeline.ENDED_BEFORE:
            console.print(f"{step.name}: job {step.job} {step.detail}, exit {step.exit_code}")
        elif step.name == "save" and step.state == "ran":
            console.print(f"save: model copied to {step.detail} on the data disk")

    return report


def pick(where: Where) -> Target:
    """The target of a task's host flags: `--host`'s VM, else the stack's slice or VM."""
    if where.flags.given or where.settings is None:
        return VmTarget(where.flags, where.settings)
    if where.settings.tpu_slice:
        return SliceTarget(where.settings)
    return VmTarget(where.flags, where.settings)

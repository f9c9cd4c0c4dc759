"""Every task's flags, declared once: a record per task (tpu_grpo/cli/flags.py's Flags), each field a flag with its
default and help, and its `check`, run for the whole command line before the first task acts (flags.CheckingExecutor):
it returns what the task's body needs, checked once (the run, where it runs, the playbook's values), or stops with one
line naming the bad value and its fix. Flags several tasks share are declared once too, in the records they inherit."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tpu_grpo.catalog.models import DEFAULT_MODEL, MODELS
from tpu_grpo.catalog.stores import default_need_text
from tpu_grpo.cli.flags import Flags, flag
from tpu_grpo.config import laptop_paths, secrets, settings, stack_file
from tpu_grpo.config.errors import BadFlag, SettingsError, UserError
from tpu_grpo.config.keys import PROJECT

if TYPE_CHECKING:
    from tpu_grpo.jobs.maxtext import Run
    from tpu_grpo.jobs.targets import PipelineOptions, Where
    from tpu_grpo.provision.playbook import Playbook

STACK_HELP = f"stack to use (default: ${stack_file.STACK_ENV} or '{stack_file.DEFAULT_STACK}')"
SET_HELP = (
    "KEY=VALUE, repeatable: adds or overrides a key on the MaxText command line (in pipeline STEP:KEY=VALUE, STEP one "
    "of convert, train, export; default train)"
)
VAR_HELP = "KEY=VALUE, repeatable: overrides a playbook variable (playbooks/host.yml's vars, docs/provisioning.md)"
PLAYBOOK_HELP = "playbook to apply (default: playbooks/host.yml)"


# ------------------------------------------------------------------ flags several tasks share


@dataclass(frozen=True)
class OnStack(Flags):
    """A task that reads the stack's settings."""

    stack: str | None = flag(STACK_HELP)

    def check(self) -> settings.Settings:
        return settings.load(self.stack, lenient=True)


@dataclass(frozen=True)
class OnHost(Flags):
    """A task that acts on hosts: the stack's VM or cluster, or --host's."""

    host: list[str] | None = flag(
        "USER@ADDRESS[:PORT], repeatable: a host to act on (default: the stack's VM from `invoke up`)", repeatable=True
    )
    identity: str | None = flag(
        "private key for the host (default: your SSH agent and ~/.ssh keys; for the stack's VM, the private half of "
        "sshPublicKeyPath)"
    )
    stack: str | None = flag(STACK_HELP)
    wait: str | None = flag("seconds to keep retrying a VM that refuses SSH because it is still booting (default 0)")

    def where(self, with_stack: bool = False, one_host: bool = True, needs_vm: bool = False) -> Where:
        """Where the task's jobs run (tpu_grpo/jobs/targets.py's Where), before anything connects: the host flags
        (one host, but for provisioning), and the stack's settings when the host is the stack's VM or cluster, or
        --stack names one (or `with_stack`: the task needs them anyway); `needs_vm`: the task logs into a VM, which a
        slice's stack has not."""
        from tpu_grpo.host import hosts
        from tpu_grpo.jobs import targets

        stack_file.stack_name(self.stack)  # a path in --stack or $TPU_GRPO_STACK is refused with --host too
        checked = hosts.check_flags(self.host, self.identity, self.wait, self.stack, one=one_host)
        laptop_paths.writable_state()  # the host's key is recorded there at first contact
        # a stack named beside --host is read (and refused when it does not exist): its settings were asked for
        chosen = settings.load(self.stack, lenient=True) if with_stack or not self.host or self.stack else None
        if needs_vm and chosen and not self.host:
            hosts.require_vm(chosen)
        if self.host and chosen and chosen.tpu_slice:  # a step's script for one VM, made of a slice's settings
            raise hosts.HostError(
                f"--host runs the step on one VM, but stack '{chosen.stack}' is slice {chosen.slice} on GKE, whose "
                "steps run as JobSets; fix: drop --host, or name a one-VM stack with --stack"
            )
        return targets.Where(checked, chosen)


@dataclass(frozen=True)
class HostTask(OnHost):
    """A task whose check is where it acts."""

    def check(self) -> Where:
        return self.where()


@dataclass(frozen=True)
class OnVm(OnHost):
    """A task that logs into the VM, which a slice's stack has not."""

    def check(self) -> Where:
        return self.where(needs_vm=True)


@dataclass(frozen=True)
class Json(Flags):
    json_: bool = flag("print the result as JSON (progress goes to stderr)", False)


@dataclass(frozen=True)
class Verbose(Flags):
    verbose: bool = flag("show every log line, not only progress, evals and errors", False)


@dataclass(frozen=True)
class Batches(Flags):
    batches: str | None = flag("GRPO batches, MaxText's num_batches (default: the stack's tpu-grpo:batches)")
    run_name: str | None = flag("run name (default: the tutorial's timestamp, YYYY-MM-DD-HH-MM-SS in UTC)")


@dataclass(frozen=True)
class Step(OnHost, Verbose):
    """convert, train and export: one MaxText step as a job."""

    STEP: ClassVar[str]
    set_: list[str] | None = flag(SET_HELP, repeatable=True)
    dry_run: bool = flag("print the exact remote script and exit, without connecting", False)
    detach: bool = flag("start the job and return at once (follow it later with `invoke logs --follow`)", False)

    def check(self) -> StepRun:
        return self.step_run()

    def step_run(self, batches: str | None = None, run_name: str | None = None, step: str | None = None) -> StepRun:
        """One step's run from the stack and the flags, all checked before anything connects."""
        from tpu_grpo.jobs import pipeline

        where = self.where(with_stack=True)
        chosen = where.stack_settings()
        run = pipeline.build_run(
            chosen, batches=batches, run_name=run_name, sets=self.set_, default_step=self.STEP, step=step
        )
        sent_token(chosen, self.dry_run)
        return StepRun(run, where)


def sent_token(chosen: settings.Settings, dry_run: bool) -> None:
    """A slice's steps send this laptop's Hugging Face token to the cluster's Secret: one that is no token is refused
    before anything connects."""
    if chosen.tpu_slice and not dry_run:
        secrets.hub_token()


@dataclass(frozen=True)
class StepRun:
    """A step's run and where it runs."""

    run: Run
    where: Where


# ------------------------------------------------------------------ each task's own


@dataclass(frozen=True)
class Plan(OnStack, Json):
    json_: bool = flag("print the plan as JSON", False)
    scripts: bool = flag(
        "show every resource's inputs, the gcloud command, the provisioning steps and the MaxText scripts", False
    )


@dataclass(frozen=True)
class SettingsFlags(OnStack, Json):
    json_: bool = flag("print the settings as JSON", False)


@dataclass(frozen=True)
class Up(OnStack):
    yes: bool = flag("go ahead without Pulumi's preview and question (for scripts)", False)
    move_disk: bool = flag(
        "when chips are found in another zone, move the data disk there (a snapshot, then a disk made from it) "
        "instead of making it anew",
        False,
    )


@dataclass(frozen=True)
class Image(OnStack):
    builder: str = flag(
        "docker (a local Docker), cloud-build (gcloud builds submit) or auto (default: Docker when its daemon "
        "answers, else Cloud Build)",
        "auto",
    )
    dry_run: bool = flag("print the Dockerfile and the commands, and exit", False)

    def check(self) -> settings.Settings:
        """The stack (a slice's) and the builder's name; whether that builder can run here is asked once, in the
        task."""
        from tpu_grpo.provision import image_build

        chosen = super().check()
        if not chosen.tpu_slice:
            raise image_build.UserError(
                f"stack '{chosen.stack}' is one VM, which `invoke provision` installs MaxText on; "
                "fix: pulumi config set tpu-grpo:slice v6e-16 for a multi-host slice"
            )
        image_build.check_builder(self.builder)
        return chosen


@dataclass(frozen=True)
class Down(OnHost):
    force: bool = flag("destroy even if a trained model exists only on the VM: the data disk goes with it", False)
    yes: bool = flag("go ahead without Pulumi's preview and question (for scripts)", False)

    def check(self) -> Where:
        from tpu_grpo.cloud.stack import require_cli

        where = self.where(with_stack=True)
        require_cli()  # before any connection: without it, the destroy cannot happen
        return where


@dataclass(frozen=True)
class Provisioning:
    """The playbook, its variables (the lock's pins with --locked), the tags chosen and the hosts."""

    book: Playbook
    values: dict[str, str]
    tags: list[str]
    where: Where


@dataclass(frozen=True)
class Provision(OnHost, Json):
    var: list[str] | None = flag(VAR_HELP, repeatable=True)
    playbook: str | None = flag(PLAYBOOK_HELP)
    check_: bool = flag("report what would change (and drift from the lock), change nothing", False)
    tags: list[str] | None = flag("TAG[,TAG], repeatable: run only the steps with these tags", repeatable=True)
    locked: bool = flag("install exactly the lock (written by `invoke freeze`) with `uv pip sync`", False)
    lock: str | None = flag("the lock file (default: playbooks/host.lock.txt)")

    def check(self) -> Provisioning:
        from tpu_grpo.provision.lock import LOCK, read_lock
        from tpu_grpo.provision.playbook import load, parse_tags, resolve, selected, stack_values

        book = load(self.playbook)
        chosen = settings.load(self.stack, lenient=True)
        pinned = read_lock(Path(self.lock or LOCK)) if self.locked else None
        values = resolve(book, self.var, pinned, stack_values(chosen))
        tags = parse_tags(self.tags)
        where = self.where(one_host=False, needs_vm=True)
        require_token(book, selected(book, tags), chosen, "uv run invoke provision")
        return Provisioning(book, values, tags, where)


def require_token(book, steps, chosen: settings.Settings, task: str) -> None:
    """The Hugging Face token a gated model needs, found on this laptop before the first task of the command line
    acts (`up provision` would otherwise make a paid VM whose download then fails); a token file that cannot be read
    is said now too, not after the first host connects."""
    from tpu_grpo.provision import engine

    secrets = engine.local_secrets(book)
    row = chosen.model_row
    if row.gated and any(step.secret and secrets.get(step.secret["source"]) is None for step in steps):
        raise SettingsError(
            f"{PROJECT}:model",
            chosen.model,
            f"is gated on the Hugging Face Hub ({row.hf_id}), and "
            "this laptop has no token for it (HF_TOKEN is unset and no token file)",
            "export HF_TOKEN=hf_... (a read token whose account accepted the licence), "
            f"or `uv run hf auth login`, then {task}",
        )


@dataclass(frozen=True)
class Freezing:
    """The playbook, its variables, where the lock goes and the host."""

    book: Playbook
    values: dict[str, str]
    lock: Path
    where: Where


@dataclass(frozen=True)
class Freeze(OnHost):
    var: list[str] | None = flag(VAR_HELP, repeatable=True)
    playbook: str | None = flag(PLAYBOOK_HELP)
    lock: str | None = flag("where to write the lock (default: playbooks/host.lock.txt)")

    def check(self) -> Freezing:
        """The playbook, its variables and where the lock goes (a file this user can write), before anything
        connects."""
        from tpu_grpo.provision.lock import check_lock_path
        from tpu_grpo.provision.playbook import load, resolve

        book = load(self.playbook)
        path = check_lock_path(self.lock)
        return Freezing(book, resolve(book, self.var), path, self.where(needs_vm=True))


@dataclass(frozen=True)
class Ssh(OnVm):
    command: str | None = flag("a command to run on the VM instead of a login shell, e.g. 'df -h ~/tpu-grpo'")

    def check(self) -> Where:
        """An empty --command is refused with the rest of the command line, before any task acts."""
        if self.command is not None and not self.command.strip():
            raise UserError(
                "--command '' is empty; fix: e.g. --command 'df -h ~/tpu-grpo', or no --command for a shell"
            )
        return super().check()


@dataclass(frozen=True)
class Convert(Step):
    STEP = "convert"


@dataclass(frozen=True)
class Train(Step, Batches):
    STEP = "train"

    def check(self) -> StepRun:
        return self.step_run(self.batches, self.run_name)


@dataclass(frozen=True)
class Export(Step):
    STEP = "export"
    run_name: str | None = flag("the trained run to export (default: the newest)")
    step: str | None = flag(
        "checkpoint step to export (default: the best its intermediate evaluations scored, else the last)"
    )
    last: bool = flag("export the training's last checkpoint, not the best scored one", False)

    def check(self) -> StepRun:
        """The export's run (its checkpoint `--step`, the training's last with `--last`, else the best scored) and
        the host."""
        if self.step is not None and self.last:
            raise UserError(f"--step {self.step} and --last both choose the checkpoint; fix: give one of them")
        run, where = (found := self.step_run(run_name=self.run_name, step=self.step)).run, found.where
        period = run.checkpoint_period
        if self.dry_run and run.step is not None and run.step % period and run.step != run.train_steps:
            # connected, the host's own checkpoints say which exist; offline, the stack's period and last step do
            earlier = run.step - run.step % period
            raise UserError(
                f"--step {run.step} is no checkpoint: a run of these settings keeps one every {period} steps "
                f"(tpu-grpo:checkpointPeriod) and its last, {run.train_steps}; fix: --step {earlier or period}, or "
                "--last"
            )
        return StepRun(replace(run, last=self.last), where)


@dataclass(frozen=True)
class PipelineRun:
    """A pipeline's run, where it runs, and what it asks of the target beyond the run."""

    run: Run
    where: Where
    options: PipelineOptions


@dataclass(frozen=True)
class Pipeline(OnHost, Verbose, Batches, Json):
    set_: list[str] | None = flag(SET_HELP, repeatable=True)
    dry_run: bool = flag("print the exact remote script and exit, without connecting", False)
    recover: str | None = flag(
        "N: bring a lost VM back (invoke up, provision) and go on, up to N times; with the disk store, training "
        "resumes after its newest checkpoint (needs the Pulumi CLI)"
    )
    var: list[str] | None = flag(
        "KEY=VALUE, repeatable: a playbook variable for the provisioning --recover runs (as invoke provision's)",
        repeatable=True,
    )
    need_gb: str | None = flag(
        "free GB preflight requires in /dev/shm and on the data disk, as SHM,DATA (default: what the stack's model "
        f"needs with its checkpointStore; the 8B: {default_need_text(MODELS[DEFAULT_MODEL])})"
    )
    keep_checkpoint: bool = flag(
        "save also copies the last training checkpoint to the data disk (~/tpu-grpo/runs/RUN/)", False
    )

    def check(self) -> PipelineRun:
        """The run, the space it needs, how many lost VMs to recover from, and (with --recover) the provisioning
        values a VM brought back gets and the Pulumi CLI that brings it back."""
        from tpu_grpo.cloud.stack import passphrase_missing
        from tpu_grpo.jobs import maxtext, pipeline, targets
        from tpu_grpo.provision import playbook

        where = self.where(with_stack=True)
        chosen = where.stack_settings()
        run = pipeline.build_run(chosen, batches=self.batches, run_name=self.run_name, sets=self.set_)
        need = pipeline.parse_need_gb(self.need_gb, run)
        sent_token(chosen, self.dry_run)
        recover = self.recover
        recoveries = maxtext.check_count("--recover", recover, minimum=0, maximum=100) if recover is not None else 0
        if recoveries:
            targets.pick(where).check_recovery()
        if self.var and not recoveries:
            raise BadFlag(
                f"--var {self.var[0]!r} is for the provisioning that --recover runs; fix: add "
                "--recover N, or provision with uv run invoke provision --var ..."
            )
        options = targets.PipelineOptions(
            need,
            keep_checkpoint=self.keep_checkpoint,
            verbose=self.verbose,
            recover=recoveries,
            pulumi_out=sys.stderr if self.json_ else None,
        )
        if recoveries:
            book = playbook.load()
            require_token(book, book.steps, chosen, f"uv run invoke pipeline --recover {recover}")
            options = replace(
                options, provisioning=playbook.resolve(book, self.var, None, playbook.stack_values(chosen))
            )
            if self.dry_run:  # prints the scripts: no VM is brought back, so no Pulumi CLI is needed yet
                return PipelineRun(run, where, options)
            if not shutil.which("pulumi"):
                raise BadFlag(
                    f"--recover {recover} brings a lost VM back with the Pulumi CLI, and there is "
                    "no pulumi on PATH; fix: install it (pulumi.com/docs/install), or run without "
                    "--recover"
                )
            if passphrase := passphrase_missing(chosen.stack):  # else a recovery waits at Pulumi's prompt
                raise BadFlag(f"--recover {recover} brings a lost VM back with nobody there, and {passphrase}")
        return PipelineRun(run, where, options)


@dataclass(frozen=True)
class Job(HostTask):
    job: str | None = flag("job id (default: the running job)")

    def check(self) -> Where:
        """`--job ID` is a job's id (a name, never a path or empty: an unset $JOB would match any job), and the
        host."""
        from tpu_grpo.config import values

        if self.job is not None:
            values.flag("--job", self.job, values.name, "20261205-101500.123-train (`uv run invoke status` lists them)")
        return super().check()


@dataclass(frozen=True)
class Logs(Job, Verbose):
    job: str | None = flag("job id (default: the running job, else the newest)")
    follow: bool = flag("keep streaming until the job ends (resumes after a dropped link)", False)


@dataclass(frozen=True)
class Status(HostTask, Json):
    pass


@dataclass(frozen=True)
class Runs(HostTask, Json):
    pass


@dataclass(frozen=True)
class Fetching:
    destination: Path
    where: Where


@dataclass(frozen=True)
class Fetch(OnHost, Json):
    run: str | None = flag("the run whose saved model to fetch (default: the newest saved)")
    to: str | None = flag("local folder (default: models/RUN)")

    def check(self) -> Fetching:
        from tpu_grpo.results import retrieval

        return Fetching(retrieval.destination(self.run, self.to), self.where())


@dataclass(frozen=True)
class Publish(OnHost, Json, Verbose):
    repo: str | None = flag("OWNER/NAME: the Hugging Face model repository (created if missing)")
    run: str | None = flag("the run whose saved model to publish (default: the newest saved)")
    public: bool = flag("make a new repository public (default: private)", False)

    def check(self) -> Where:
        from tpu_grpo.jobs import maxtext
        from tpu_grpo.results.publish import check_repo

        if not self.repo:
            raise BadFlag("--repo is missing; fix: --repo OWNER/NAME, e.g. --repo your-name/Llama-3.1-8B-GRPO")
        check_repo(self.repo)
        stack_file.hub_endpoint()
        if self.run is not None:
            maxtext.check_run_name(self.run, "--run")
        return self.where(needs_vm=True)


@dataclass(frozen=True)
class Plotting:
    """Where the plot goes (None: its default), and the host, unless the events are a local folder."""

    path: Path | None
    where: Where | None


@dataclass(frozen=True)
class Metrics(OnHost, Json):
    run: str | None = flag("run name (default: the newest trained run)")
    compare: list[str] | None = flag(
        "RUN, repeatable: overlay two or more runs' reward, KL, completion length and eval accuracy in one PNG "
        "(default --out .tpu-grpo/compare.png), the legend naming the inputs in which they differ",
        repeatable=True,
    )
    out: str | None = flag(
        "PNG to write (default: .tpu-grpo/runs/RUN/metrics.png); an existing file only if tpu-grpo wrote it"
    )
    force: bool = flag("let --out overwrite any existing file", False)
    events: str | None = flag("read a local folder of TensorBoard events instead of the host's")
    log: str | None = flag("with --events: the training's log (train_rl's output), whose evaluations the plot shows")

    def check(self) -> Plotting:
        from tpu_grpo.results import retrieval

        path = retrieval.check_metrics_flags(self.run, self.out, self.events, self.force, self.compare, self.log)
        if self.events is None:
            return Plotting(path, self.where())  # which checks the state folder too
        laptop_paths.writable_state()  # the plot's default place; a local events folder: no host
        return Plotting(path, None)


@dataclass(frozen=True)
class Serving:
    port: int
    every_s: float
    where: Where


@dataclass(frozen=True)
class Tensorboard(OnHost, Json):
    run: str | None = flag("one run to show (default: every run trained on the host, side by side)")
    port: str | None = flag("the port TensorBoard listens on, on 127.0.0.1 (default 6006)")
    every: str | None = flag("seconds between syncs of the events from the host (default 5)")
    once: bool = flag("sync the events once and exit, without serving", False)

    def check(self) -> Serving:
        from tpu_grpo.results import tensorboard_sync

        return Serving(*tensorboard_sync.check_flags(self.run, self.port, self.every), self.where(needs_vm=True))


@dataclass(frozen=True)
class Timeline(OnVm, Json):
    pass

"""Every task's flag check, run for the whole command line before the first task acts (flags.CheckingExecutor):
each returns what its task needs, checked once (the run, where it runs, the playbook's values), or stops with one
line naming the bad value and its fix."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_grpo.config import laptop_paths, settings, stack_file
from tpu_grpo.config.errors import BadFlag, SettingsError, UserError
from tpu_grpo.config.keys import PROJECT

if TYPE_CHECKING:
    from tpu_grpo.jobs.maxtext import Run
    from tpu_grpo.jobs.targets import PipelineOptions, Where
    from tpu_grpo.provision.playbook import Playbook


def check_hosts(
    host=None, identity=None, stack=None, wait=None, with_stack=False, one_host=True, needs_vm=False, **_
) -> Where:
    """Where the task's jobs run (tpu_grpo/jobs/targets.py's Where), before anything connects: the host flags (one
    host, but for provisioning), and the stack's settings when the host is the stack's VM or cluster, or --stack
    names one (or `with_stack`: the task needs them anyway); `needs_vm`: the task logs into a VM, which a slice's
    stack has not."""
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import targets

    stack_file.stack_name(stack)  # a path in --stack or $TPU_GRPO_STACK is refused with --host too
    flags = hosts.check_flags(host, identity, wait, stack, one=one_host)
    laptop_paths.writable_state()  # the host's key is recorded there at first contact
    # a stack named beside --host is read (and refused when it does not exist): its settings were asked for
    chosen = settings.load(stack, lenient=True) if with_stack or not host or stack is not None else None
    if needs_vm and chosen and not host:
        hosts.require_vm(chosen)
    if host and chosen and chosen.tpu_slice:  # a step's script for one VM, made of a slice's settings
        raise hosts.HostError(
            f"--host runs the step on one VM, but stack '{chosen.stack}' is slice {chosen.slice} on GKE, whose "
            "steps run as JobSets; fix: drop --host, or name a one-VM stack with --stack"
        )
    return targets.Where(flags, chosen)


def check_vm(**flags) -> Where:
    """The host flags of a task that logs into the VM (timeline): check_hosts with a VM needed."""
    return check_hosts(needs_vm=True, **flags)


def check_ssh(command=None, **flags) -> Where:
    """`invoke ssh`'s flags: an empty --command is refused with the rest of the command line, before any task acts."""
    if command is not None and not command.strip():
        raise UserError("--command '' is empty; fix: e.g. --command 'df -h ~/tpu-grpo', or no --command for a shell")
    return check_vm(**flags)


def check_settings(stack=None, **_) -> settings.Settings:
    return settings.load(stack, lenient=True)


def check_provision(
    var=None, tags=None, locked=False, lock=None, playbook=None, **flags
) -> tuple[Playbook, dict[str, str], list[str], Where]:
    """The playbook, its variables (and the lock with --locked) and the tags, before anything connects."""
    from tpu_grpo.provision.lock import LOCK, read_lock
    from tpu_grpo.provision.playbook import load, parse_tags, resolve, selected, stack_values

    book = load(playbook)
    chosen = settings.load(flags.get("stack"), lenient=True)
    pinned = read_lock(Path(lock or LOCK)) if locked else None
    values = resolve(book, var, pinned, stack_values(chosen))
    chosen_tags = parse_tags(tags)
    where = check_hosts(one_host=False, needs_vm=True, **flags)
    require_token(book, selected(book, chosen_tags), chosen, "uv run invoke provision")
    return book, values, chosen_tags, where


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


def check_freeze(var=None, playbook=None, lock=None, **flags) -> tuple[Playbook, dict[str, str], Path, Where]:
    """The playbook, its variables and where the lock goes (a file this user can write), before anything connects."""
    from tpu_grpo.provision.lock import check_lock_path
    from tpu_grpo.provision.playbook import load, resolve

    book = load(playbook)
    path = check_lock_path(lock)
    return book, resolve(book, var), path, check_hosts(needs_vm=True, **flags)


def check_job(job=None, **flags) -> Where:
    """`--job ID` is a job's id (a name, never a path or empty: an unset $JOB would match any job), and the host."""
    from tpu_grpo.config import values

    if job is not None:
        values.flag("--job", job, values.name, "20261205-101500.123-train (`uv run invoke status` lists them)")
    return check_hosts(**flags)


def step_run(
    step, stack=None, batches=None, run_name=None, set_=None, export_step=None, host=None, identity=None, wait=None, **_
) -> tuple[Run, Where]:
    """One step's run from the stack and the flags, all checked before anything connects."""
    from tpu_grpo.jobs import pipeline

    where = check_hosts(host=host, identity=identity, stack=stack, wait=wait, with_stack=True)
    run = pipeline.build_run(
        where.stack_settings(), batches=batches, run_name=run_name, sets=set_, default_step=step, step=export_step
    )
    return run, where


def check_export(step=None, last=False, **flags) -> tuple[Run, Where]:
    """The export's run (its checkpoint `--step`, the training's last with `--last`, else the best scored) and the
    host."""
    from dataclasses import replace

    if step is not None and last:
        raise UserError(f"--step {step} and --last both choose the checkpoint; fix: give one of them")
    run, where = step_run("export", export_step=step, **flags)
    period = run.checkpoint_period
    if flags.get("dry_run") and run.step is not None and run.step % period and run.step != run.train_steps:
        # connected, the host's own checkpoints say which exist; offline, the stack's period and last step do
        earlier = run.step - run.step % period
        raise UserError(
            f"--step {run.step} is no checkpoint: a run of these settings keeps one every {period} steps "
            f"(tpu-grpo:checkpointPeriod) and its last, {run.train_steps}; fix: --step {earlier or period}, or --last"
        )
    return replace(run, last=bool(last)), where


def check_pipeline(
    batches=None, run_name=None, set_=None, need_gb=None, stack=None, recover=None, var=None, **flags
) -> tuple[Run, Where, PipelineOptions]:
    """The run, the space it needs, how many lost VMs to recover from, and (with --recover) the
    provisioning values a VM brought back gets and the Pulumi CLI that brings it back."""
    from tpu_grpo.cloud.stack import passphrase_missing
    from tpu_grpo.jobs import maxtext, pipeline, targets
    from tpu_grpo.provision import playbook

    where = check_hosts(stack=stack, with_stack=True, **flags)
    chosen = where.stack_settings()
    run = pipeline.build_run(chosen, batches=batches, run_name=run_name, sets=set_)
    need = pipeline.parse_need_gb(need_gb, run)
    recoveries = maxtext.check_count("--recover", recover, minimum=0, maximum=100) if recover is not None else 0
    if recoveries:
        targets.pick(where).check_recovery()
    if var and not recoveries:
        raise BadFlag(
            f"--var {var[0]!r} is for the provisioning that --recover runs; fix: add "
            "--recover N, or provision with uv run invoke provision --var ..."
        )
    options = targets.PipelineOptions(need, recover=recoveries)
    if recoveries:
        book = playbook.load()
        require_token(book, book.steps, chosen, f"uv run invoke pipeline --recover {recover}")
        options = replace(options, provisioning=playbook.resolve(book, var, None, playbook.stack_values(chosen)))
        if not shutil.which("pulumi"):
            raise BadFlag(
                f"--recover {recover} brings a lost VM back with the Pulumi CLI, and there is "
                "no pulumi on PATH; fix: install it (pulumi.com/docs/install), or run without "
                "--recover"
            )
        if passphrase := passphrase_missing(chosen.stack):  # else a recovery waits at Pulumi's prompt
            raise BadFlag(f"--recover {recover} brings a lost VM back with nobody there, and {passphrase}")
    return run, where, options


def check_fetch(run=None, to=None, **flags) -> tuple[Path, Where]:
    from tpu_grpo.results import retrieval

    return retrieval.destination(run, to), check_hosts(**flags)


def check_publish(repo=None, run=None, **flags) -> Where:
    from tpu_grpo.jobs import maxtext
    from tpu_grpo.results.publish import check_repo

    if not repo:
        raise BadFlag("--repo is missing; fix: --repo OWNER/NAME, e.g. --repo your-name/Llama-3.1-8B-GRPO")
    check_repo(repo)
    stack_file.hub_endpoint()
    if run is not None:
        maxtext.check_run_name(run, "--run")
    return check_hosts(needs_vm=True, **flags)


def check_metrics(
    run=None, out=None, events=None, log=None, force=False, compare=None, **flags
) -> tuple[Path | None, Where | None]:
    from tpu_grpo.results import retrieval

    path = retrieval.check_metrics_flags(run, out, events, force, compare, log)
    if events is None:
        return path, check_hosts(**flags)  # which checks the state folder too
    laptop_paths.writable_state()  # the plot's default place; a local events folder: no host
    return path, None


def check_tensorboard(run=None, port=None, every=None, **flags) -> tuple[int, float, Where]:
    from tpu_grpo.results import tensorboard_sync

    return (*tensorboard_sync.check_flags(run, port, every), check_hosts(needs_vm=True, **flags))


def check_image(stack=None, builder="auto", **_) -> settings.Settings:
    """The stack (a slice's) and the builder's name; whether that builder can run here is asked once, in the task."""
    from tpu_grpo.provision import image_build

    chosen = settings.load(stack, lenient=True)
    if not chosen.tpu_slice:
        raise image_build.UserError(
            f"stack '{chosen.stack}' is one VM, which `invoke provision` installs MaxText on; "
            "fix: pulumi config set tpu-grpo:slice v6e-16 for a multi-host slice"
        )
    image_build.check_builder(builder)
    return chosen


def check_down(**flags) -> Where:
    from tpu_grpo.cloud.stack import require_cli

    where = check_hosts(with_stack=True, **flags)
    require_cli()  # before any connection: without it, the destroy cannot happen
    return where

"""MaxText's tasks: convert, train, export and pipeline, and the jobs' logs, status and cancel."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from functools import partial

from tpu_grpo.catalog.models import DEFAULT_MODEL, MODELS
from tpu_grpo.catalog.stores import default_need_text
from tpu_grpo.cli.checks import check_export, check_hosts, check_job, check_pipeline, step_run
from tpu_grpo.cli.flags import HOST_FLAGS, STEP_FLAGS, checked, exit_on_failure, flag_help, one_line_errors, task
from tpu_grpo.config.printing import terminal


def _launch(step, dry_run, detach, verbose):
    """What convert, train and export share: print the script, or start the job and follow it."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        run, where = checked(check_export if step == "export" else step_run)
        target = targets.pick(where)
        if dry_run:
            if run.run_name is None:  # the newest trained run: known once the host (or cluster) is asked
                run = replace(run, run_name="NEWEST")
                print(f"# run name NEWEST: the newest trained run {target.where}, known once connected")
            if step == "export" and run.step is None and not run.last:
                print(
                    "# the checkpoint its intermediate evaluations scored best, known once connected; shown here "
                    f"with its last, {run.train_steps} (or give --step N, --last)"
                )
            print(target.script(run, step), end="")
            return
        started = target.start(run, step)
        console = terminal()
        console.print(f"started {step} job {started.job} (run {started.run}) on {started.where}")
        if detach:
            console.print(f"follow it: uv run invoke logs --job {started.job} --follow")
            return
        code = target.follow(started.job, console, verbose)
    exit_on_failure(code)


@task(iterable=["host", "set_"], help=flag_help(*STEP_FLAGS), check=partial(step_run, "convert"))
def convert(c, host=None, identity=None, stack=None, set_=None, dry_run=False, detach=False, verbose=False, wait=None):
    """Convert the Hugging Face model to a MaxText checkpoint in the checkpoint store (the tutorial's section 4)."""
    _launch("convert", dry_run, detach, verbose)


@task(
    iterable=["host", "set_"],
    help=flag_help(*STEP_FLAGS, "batches", "run_name"),
    check=partial(step_run, "train"),
)
def train(
    c,
    batches=None,
    run_name=None,
    host=None,
    identity=None,
    stack=None,
    set_=None,
    dry_run=False,
    detach=False,
    verbose=False,
    wait=None,
):
    """Run GRPO training (the tutorial's section 5) as a detached job and follow its progress."""
    _launch("train", dry_run, detach, verbose)


@task(
    iterable=["host", "set_"],
    help=flag_help(
        *STEP_FLAGS,
        run_name="the trained run to export (default: the newest)",
        step="checkpoint step to export (default: the best its intermediate evaluations scored, else the last)",
        last="export the training's last checkpoint, not the best scored one",
    ),
    check=check_export,
)
def export(
    c,
    run_name=None,
    step=None,
    last=False,
    host=None,
    identity=None,
    stack=None,
    set_=None,
    dry_run=False,
    detach=False,
    verbose=False,
    wait=None,
):
    """Convert a trained checkpoint back to Hugging Face format in /dev/shm (the tutorial's section 6).

    By default the checkpoint its intermediate evaluations scored best (the earlier on a tie); --last or --step N
    chooses another."""
    _launch("export", dry_run, detach, verbose)


@task(
    iterable=["host", "set_", "var"],
    check=check_pipeline,
    help=flag_help(
        *HOST_FLAGS,
        "set",
        "dry_run",
        "verbose",
        "batches",
        "run_name",
        "json",
        recover="N: bring a lost VM back (invoke up, provision) and go on, up to N times; with the disk store, "
        "training resumes after its newest checkpoint (needs the Pulumi CLI)",
        var="KEY=VALUE, repeatable: a playbook variable for the provisioning --recover runs (as invoke provision's)",
        need_gb="free GB preflight requires in /dev/shm and on the data disk, as SHM,DATA (default: what the stack's "
        f"model needs with its checkpointStore; the 8B: {default_need_text(MODELS[DEFAULT_MODEL])})",
        keep_checkpoint="save also copies the last training checkpoint to the data disk (~/tpu-grpo/runs/RUN/)",
    ),
)
def pipeline(
    c,
    batches=None,
    run_name=None,
    host=None,
    identity=None,
    stack=None,
    set_=None,
    need_gb=None,
    dry_run=False,
    verbose=False,
    wait=None,
    json_=False,
    keep_checkpoint=False,
    recover=None,
    var=None,
):
    """Preflight, then convert -> train -> export -> save; done steps are skipped, so a re-run resumes."""
    from tpu_grpo.config.printing import styled
    from tpu_grpo.jobs import targets

    with one_line_errors():
        run, where, options = checked(check_pipeline)
        target = targets.pick(where)
        if dry_run:
            data, text = target.pipeline_dry_run(run, keep_checkpoint)
            print(json.dumps(data, indent=2) if json_ else text, end="\n" if json_ else "")
            return
        console = terminal(stderr=json_)
        finished = target.pipeline(
            run,
            console,
            replace(
                options, keep_checkpoint=keep_checkpoint, verbose=verbose, pulumi_out=sys.stderr if json_ else None
            ),
        )
    if finished.code == 0:
        console.print(
            styled(
                "[green]run {} is complete[/]: the model is in {}; get it with: uv run invoke fetch --run {}",
                finished.run,
                finished.model,
                finished.run,
            )
        )
    if json_:
        print(json.dumps(finished.outcome, indent=2))
    exit_on_failure(finished.code)


@task(
    iterable=["host"],
    check=check_job,
    help=flag_help(
        *HOST_FLAGS,
        "verbose",
        job="job id (default: the running job, else the newest)",
        follow="keep streaming until the job ends (resumes after a dropped link)",
    ),
)
def logs(c, job=None, follow=False, host=None, identity=None, stack=None, wait=None, verbose=False):
    """Print a job's log, or follow it with progress (Ctrl-C detaches; the job keeps running)."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        target = targets.pick(checked(check_job))
        if not follow:
            for chunk in target.read_log(job):
                sys.stdout.buffer.write(chunk)
            return
        code = target.follow(job, terminal(), verbose)
    exit_on_failure(code)


@task(iterable=["host"], check=check_hosts, help=flag_help(*HOST_FLAGS, "json"))
def status(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """The jobs (state, exit code, run, duration, progress); on the VM, its TPU chips and its idle stop."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        found = targets.pick(checked(check_hosts)).status()
    if json_:
        print(json.dumps(found.to_json(), indent=2))
    else:
        show_status(terminal(), found)


def show_status(console, found) -> None:
    """A target's status as a person reads it: the VM's idle stop, next start, jobs, training and chips; the
    cluster's next start and jobs."""
    from tpu_grpo.host import chips
    from tpu_grpo.jobs import job_records, watch

    if found.slice is None:
        watch.print_status(console, found.where, list(found.jobs), found.progress, found.idle_stop, found.compile_cache)
        chips.show(console, found.tpu)
        return
    watch.show_next_start(console, found.compile_cache)
    job_records.show(console, f"cluster {found.where} (slice {found.slice}, {found.capacity})", list(found.jobs))


@task(iterable=["host"], check=check_job, help=flag_help(*HOST_FLAGS, job="job id (default: the running job)"))
def cancel(c, job=None, host=None, identity=None, stack=None, wait=None):
    """Stop a job and free the TPU; on a slice, delete its JobSet.

    On the VM: the job's whole process group, then whatever holds /dev/vfio and /tmp/libtpu_lockfile. On a
    slice: the JobSet with its pods."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        said = targets.pick(checked(check_job)).cancel(job)
    print(said)

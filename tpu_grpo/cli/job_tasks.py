"""MaxText's tasks: convert, train, export and pipeline, and the jobs' logs, status and cancel."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from tpu_grpo.cli.checks import check_hosts, check_job, check_pipeline, step_run
from tpu_grpo.cli.flags import HOST_FLAGS, STEP_FLAGS, checked, exit_on_failure, flag_help, one_line_errors, task
from tpu_grpo.config.printing import terminal


def _launch(step, dry_run, detach, verbose):
    """What convert, train and export share: print the script, or start the job and follow it."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        run, where = checked()
        target = targets.pick(where)
        if dry_run:
            if run.run_name is None:  # the newest trained run: known once the host (or cluster) is asked
                run = replace(run, run_name="NEWEST")
                print(f"# run name NEWEST: the newest trained run {target.where}, known once connected")
            print(target.script(run, step), end="")
            return
        code = target.launch(run, step, terminal(), detach, verbose)
    exit_on_failure(code)


@task(iterable=["host", "set_"], help=flag_help(*STEP_FLAGS), check=lambda **flags: step_run("convert", **flags))
def convert(c, host=None, identity=None, stack=None, set_=None, dry_run=False, detach=False, verbose=False, wait=None):
    """Convert the Hugging Face model to a MaxText checkpoint in the checkpoint store (the tutorial's section 4)."""
    _launch("convert", dry_run, detach, verbose)


@task(
    iterable=["host", "set_"],
    help=flag_help(*STEP_FLAGS, "batches", "run_name"),
    check=lambda **flags: step_run("train", **flags),
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
        step="checkpoint step to export (default: the run's last, num_batches)",
    ),
    check=lambda step=None, **flags: step_run("export", export_step=step, **flags),
)
def export(
    c,
    run_name=None,
    step=None,
    host=None,
    identity=None,
    stack=None,
    set_=None,
    dry_run=False,
    detach=False,
    verbose=False,
    wait=None,
):
    """Convert a trained checkpoint back to Hugging Face format in /dev/shm (the tutorial's section 6)."""
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
        need_gb="free GB preflight requires in /dev/shm and on the data disk, as SHM,DATA (default: what the 8B model "
        "needs with the stack's checkpointStore, 120,36 with shm)",
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
    from tpu_grpo.cli import targets

    with one_line_errors():
        run, where, options = checked()
        target = targets.pick(where)
        if dry_run:
            data, text = target.pipeline_dry_run(run, keep_checkpoint)
            print(json.dumps(data, indent=2) if json_ else text, end="\n" if json_ else "")
            return
        code, outcome = target.pipeline(
            run,
            terminal(stderr=json_),
            replace(
                options, keep_checkpoint=keep_checkpoint, verbose=verbose, pulumi_out=sys.stderr if json_ else None
            ),
        )
    if json_:
        print(json.dumps(outcome, indent=2))
    exit_on_failure(code)


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
    from tpu_grpo.cli import targets

    with one_line_errors():
        target = targets.pick(checked())
        if not follow:
            for chunk in target.read_log(job):
                sys.stdout.buffer.write(chunk)
            return
        code = target.follow(job, terminal(), verbose)
    exit_on_failure(code)


@task(iterable=["host"], check=check_hosts, help=flag_help(*HOST_FLAGS, "json"))
def status(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """The jobs (state, exit code, run, duration, progress); on the VM, its TPU chips and its idle stop."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        target = targets.pick(checked())
        found = target.status()
    if json_:
        print(json.dumps(found, indent=2))
    else:
        target.show_status(terminal(), found)


@task(iterable=["host"], check=check_job, help=flag_help(*HOST_FLAGS, job="job id (default: the running job)"))
def cancel(c, job=None, host=None, identity=None, stack=None, wait=None):
    """Stop a job and free the TPU; on a slice, delete its JobSet.

    On the VM: the job's whole process group, then whatever holds /dev/vfio and /tmp/libtpu_lockfile. On a
    slice: the JobSet with its pods."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        said = targets.pick(checked()).cancel(job)
    print(said)

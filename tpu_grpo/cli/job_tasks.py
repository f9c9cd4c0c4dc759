"""MaxText's tasks: convert, train, export and pipeline, and the jobs' logs, status and cancel."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from tpu_grpo.cli.checks import Convert, Export, Job, Logs, Pipeline, PipelineRun, Status, Step, StepRun, Train
from tpu_grpo.cli.flags import exit_on_failure, one_line_errors, task
from tpu_grpo.config.printing import terminal

if TYPE_CHECKING:
    from tpu_grpo.jobs.targets import Where


def _launch(flags: Step, checked: StepRun) -> None:
    """What convert, train and export share: print the script, or start the job and follow it."""
    from tpu_grpo.jobs import targets

    step = flags.STEP
    with one_line_errors():
        run = checked.run
        target = targets.pick(checked.where)
        if flags.dry_run:
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
        if flags.detach:
            console.print(f"follow it: uv run invoke logs --job {started.job} --follow")
            return
        code = target.follow(started.job, console, flags.verbose)
    exit_on_failure(code)


@task(flags=Convert)
def convert(c, flags: Convert, checked: StepRun):
    """Convert the Hugging Face model to a MaxText checkpoint in the checkpoint store (the tutorial's section 4)."""
    _launch(flags, checked)


@task(flags=Train)
def train(c, flags: Train, checked: StepRun):
    """Run GRPO training (the tutorial's section 5) as a detached job and follow its progress."""
    _launch(flags, checked)


@task(flags=Export)
def export(c, flags: Export, checked: StepRun):
    """Convert a trained checkpoint back to Hugging Face format in /dev/shm (the tutorial's section 6).

    By default the checkpoint its intermediate evaluations scored best (the earlier on a tie); --last or --step N
    chooses another."""
    _launch(flags, checked)


@task(flags=Pipeline)
def pipeline(c, flags: Pipeline, checked: PipelineRun):
    """Preflight, then convert -> train -> export -> save; done steps are skipped, so a re-run resumes."""
    from tpu_grpo.config.printing import styled
    from tpu_grpo.jobs import targets

    with one_line_errors():
        target = targets.pick(checked.where)
        if flags.dry_run:
            data, text = target.pipeline_dry_run(checked.run, flags.keep_checkpoint)
            print(json.dumps(data, indent=2) if flags.json_ else text, end="\n" if flags.json_ else "")
            return
        console = terminal(stderr=flags.json_)
        finished = target.pipeline(checked.run, console, checked.options)
    if finished.code == 0:
        console.print(
            styled(
                "[green]run {} is complete[/]: the model is in {}; get it with: uv run invoke fetch --run {}",
                finished.run,
                finished.model,
                finished.run,
            )
        )
    if flags.json_:
        print(json.dumps(finished.outcome, indent=2))
    exit_on_failure(finished.code)


@task(flags=Logs)
def logs(c, flags: Logs, where: Where):
    """Print a job's log, or follow it with progress (Ctrl-C detaches; the job keeps running)."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        target = targets.pick(where)
        if not flags.follow:
            for chunk in target.read_log(flags.job):
                sys.stdout.buffer.write(chunk)
            return
        code = target.follow(flags.job, terminal(), flags.verbose)
    exit_on_failure(code)


@task(flags=Status)
def status(c, flags: Status, where: Where):
    """The jobs (state, exit code, run, duration, progress); on the VM, its TPU chips and its idle stop."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        found = targets.pick(where).status()
    if flags.json_:
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


@task(flags=Job)
def cancel(c, flags: Job, where: Where):
    """Stop a job and free the TPU; on a slice, delete its JobSet.

    On the VM: the job's whole process group, then whatever holds /dev/vfio and /tmp/libtpu_lockfile. On a
    slice: the JobSet with its pods."""
    from tpu_grpo.jobs import targets

    with one_line_errors():
        said = targets.pick(where).cancel(flags.job)
    print(said)

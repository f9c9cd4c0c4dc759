"""tpu-grpo's command line: `invoke --list` shows the tasks, `invoke --help TASK` their flags.

Each task parses its flags, calls one library function and prints the result; the logic
lives in `tpu_grpo/` and `infra/`. Heavy imports (Pulumi, the GCP SDK) happen inside the
tasks that need them, so `invoke --list` stays instant.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
from contextlib import contextmanager
from pathlib import Path

from invoke import Exit, task

# Invoke turns off Python's bytecode cache for whatever its tasks import (see its --write-pyc), so
# Fabric, paramiko and tpu_grpo would be compiled from source on every run. Python's own setting
# (PYTHONDONTWRITEBYTECODE, -B) still decides.
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

# At exit the interpreter garbage-collects every object Invoke, Fabric and paramiko made, most of them
# in reference cycles (modules, classes, functions): 40 to 60 ms of every run, a sixth of a no-op
# `invoke provision`. Frozen objects are left out of those collections and the OS takes their memory
# back at once. Output is still flushed and the exit handlers registered after this one run before it.
atexit.register(gc.freeze)

from tpu_grpo import settings as settings_module  # noqa: E402 - after dont_write_bytecode, so it is cached too

STACK_HELP = f"stack to use (default: ${settings_module.STACK_ENV} or '{settings_module.DEFAULT_STACK}')"


def _console(stderr: bool = False):
    """The terminal; with `--json` the human lines go to stderr, so stdout holds only the JSON."""
    from rich.console import Console

    return Console(highlight=False, stderr=stderr)


def _exit_on_failure(code: int) -> None:
    """A non-zero exit code becomes the task's; zero returns, so that chained tasks go on
    (`invoke up provision pipeline`: Invoke stops the whole chain at any Exit, even Exit(0))."""
    if code:
        raise Exit(code=code)


@contextmanager
def _one_line_errors():
    """Bad input (settings, hosts, playbook, --var) ends the task with one line and exit code 2 (a
    failed pipeline step: 1), no traceback."""
    from tpu_grpo.errors import UserError

    try:
        yield
    except UserError as error:
        raise Exit(f"error: {error}", code=error.exit_code) from None


HOST_HELP = {
    "host": "USER@ADDRESS[:PORT] of a host (repeatable); default: the stack's VM from `invoke up`",
    "identity": "private key for --host (default: your SSH agent and ~/.ssh keys)",
    "stack": STACK_HELP,
    "var": "KEY=VALUE overriding a playbook variable (repeatable); see `invoke plan`",
    "playbook": "playbook to apply (default: playbooks/host.yml)",
    "wait": "seconds to keep retrying a VM that refuses SSH because it is still booting (default 0)",
}


@task(help={"stack": STACK_HELP, "json": "print the plan as JSON"})
def plan(c, stack=None, json_=False):
    """Show what `pulumi up` would create, the same VM as a gcloud command, and its cost (offline)."""
    from tpu_grpo import plan as plan_module

    with _one_line_errors():
        result = plan_module.build(stack)
    if json_:
        print(json.dumps(result.to_json(), indent=2))
    else:
        plan_module.render(result, _console())


@task(help={"stack": STACK_HELP, "json": "print the settings as JSON"})
def settings(c, stack=None, json_=False):
    """List every stack setting with its value and meaning."""
    with _one_line_errors():
        values = settings_module.read_stack_file(stack or settings_module.stack_name(), settings_module.project_root())
    if json_:
        print(json.dumps({key.name: values.get(key.name) for key in settings_module.KEYS}, indent=2))
        return
    from rich.table import Table

    table = Table("setting", "value", "meaning")
    for key in settings_module.KEYS:
        value = values.get(key.name)
        table.add_row(key.name, "(unset)" if value is None else str(value), key.help)
    _console().print(table)


@task(help={"stack": STACK_HELP})
def up(c, stack=None):
    """Create or update the TPU VM with `pulumi up`, after checking everything it needs."""
    from tpu_grpo import stack as stack_module

    with _one_line_errors():
        chosen = settings_module.load(stack, lenient=True)
    missing = stack_module.missing_for_up(chosen)
    if missing:
        lines = "\n".join(f"  - {item}" for item in missing)
        raise Exit(
            f"error: `pulumi up` for stack '{chosen.stack}' cannot start; missing:\n{lines}\n"
            f"See what it would create, offline and with none of these: uv run invoke plan",
            code=2,
        )
    code, explanations = stack_module.up(chosen.stack)
    if explanations:
        raise Exit("\n".join(f"what went wrong: {line}" for line in explanations), code=code)
    _exit_on_failure(code)


@task(iterable=["host", "var", "tags"], help={
    **HOST_HELP, "check": "report what would change (and drift from the lock), change nothing",
    "tags": "run only steps with these tags (repeatable or comma-separated)",
    "locked": "install exactly the lock (written by `invoke freeze`) with `uv pip sync`",
    "lock": "the lock file (default: playbooks/host.lock.txt)", "json": "print the report as JSON"})
def provision(c, host=None, identity=None, stack=None, var=None, tags=None, check=False, locked=False,
              lock=None, playbook=None, wait=None, json_=False):
    """Make the host(s) ready for MaxText: apply playbooks/host.yml over SSH, idempotently, in parallel."""
    from tpu_grpo import hosts, provision as engine

    with _one_line_errors():
        book = engine.load(playbook)
        values = engine.resolve(book, var, Path(lock or engine.LOCK) if locked else None)
        chosen_tags = [tag for item in tags or [] for tag in item.split(",") if tag]
        engine.selected(book, chosen_tags)
        targets = hosts.resolve(host or [], identity, stack)
        wait_s = hosts.wait_seconds(wait)
    if json_:
        report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, wait_s=wait_s)
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = _console()
        verb = "checking" if check else "provisioning"
        console.print(f"{verb} {', '.join(t.name for t in targets)} with {book.path.name}"
                      + (" (locked)" if locked else ""))
        with engine.LiveView(console, check) as view:
            report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, on_event=view,
                                  wait_s=wait_s)
        engine.print_summary(report, console)
    if report.failed:
        raise Exit(code=1)


@task(iterable=["host", "var"], help={**HOST_HELP, "lock": "where to write the lock (default: playbooks/host.lock.txt)"})
def freeze(c, host=None, identity=None, stack=None, var=None, playbook=None, lock=None, wait=None):
    """Record the host's exact environment (Python, uv, every package) in the lock for `provision --locked`."""
    from tpu_grpo import hosts, provision as engine

    with _one_line_errors():
        book = engine.load(playbook)
        values = engine.resolve(book, var)
        targets = hosts.resolve(host or [], identity, stack)
        notices = []
        connection = hosts.connect(targets[0], notices, hosts.wait_seconds(wait))
        try:
            text = engine.freeze(connection, book, values, targets[0].name)
        finally:
            connection.close()
    path = Path(lock or engine.LOCK)
    path.write_text(text)
    packages = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    for notice in notices:
        print(f"note: {notice}")
    print(f"wrote {path}: {packages} packages from {targets[0].name}")


# ------------------------------------------------------------------ workloads on the host

JOB_HELP = {
    "host": HOST_HELP["host"], "identity": HOST_HELP["identity"], "stack": STACK_HELP, "wait": HOST_HELP["wait"],
    "set": "KEY=VALUE added to or overriding the MaxText command line (repeatable; STEP:KEY=VALUE in pipeline)",
    "dry_run": "print the exact remote script and exit, without connecting",
    "detach": "start the job and return at once (follow it later with `invoke logs --follow`)",
    "verbose": "show every log line, not only progress, evals and errors",
    "run_name": "run name (default: the tutorial's timestamp, YYYY-MM-DD-HH-MM-SS in UTC)",
    "batches": "GRPO batches, MaxText's num_batches (default: the stack's tpu-grpo:batches)",
}


def _help(*names: str, **extra: str) -> dict:
    """The help of a task's flags: the shared wording for these names, plus its own."""
    return {**{name: JOB_HELP[name] for name in names}, **extra}


STEP_FLAGS = ("host", "identity", "stack", "wait", "set", "dry_run", "detach", "verbose")


def _session(host, identity, stack, wait):
    from tpu_grpo import hosts, jobs

    targets = hosts.resolve(host or [], identity, stack)
    if len(targets) > 1:  # a v6e-8 is one host; a multi-host slice's jobs would need all workers at once
        raise hosts.HostError(f"MaxText jobs run on one host, got {len(targets)} "
                              f"({', '.join(target.name for target in targets)}); fix: pass one --host")
    return jobs.Session(targets[0], hosts.wait_seconds(wait))


def _launch(run, step, host, identity, stack, wait, dry_run, detach, verbose, run_name_given=True):
    """What convert, train and export share: print the script, or start the job and follow it."""
    from tpu_grpo import maxtext, pipeline

    if dry_run:
        print(maxtext.script(run, step), end="")
        return
    with _one_line_errors():
        session = _session(host, identity, stack, wait)
        connection = session.connection
        if step == "export":
            run = pipeline.for_export(connection, run, run_name_given)
        job = pipeline.start_checked(connection, run, step)
    console = _console()
    console.print(f"started {step} job {job} (run {run.run_name}) on {session.host.name}")
    if detach:
        console.print(f"follow it: uv run invoke logs --job {job} --follow")
        return
    meta = pipeline.job_meta(run, step)
    _exit_on_failure(_follow(session, job, step, meta.get("total_steps"), verbose))


def _follow(session, job, step, total_steps, verbose, console=None) -> int:
    """Follow to the end; Ctrl-C detaches (the job goes on) and says how to come back."""
    from tpu_grpo import watch

    console = console or _console()
    try:
        with _one_line_errors():
            return watch.follow(session, job, step, console, total_steps, verbose)
    except KeyboardInterrupt:
        console.print(f"\ndetached: job {job} keeps running on {session.host.name}; "
                      f"reattach: uv run invoke logs --job {job} --follow; stop it: uv run invoke cancel --job {job}")
        return 130


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS))
def convert(c, host=None, identity=None, stack=None, set_=None, dry_run=False, detach=False, verbose=False, wait=None):
    """Convert the Hugging Face model to a MaxText checkpoint in /dev/shm (the tutorial's section 4)."""
    from tpu_grpo import pipeline

    with _one_line_errors():
        run = pipeline.build_run(stack, sets=set_, default_step="convert")
    _launch(run, "convert", host, identity, stack, wait, dry_run, detach, verbose)


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS, "batches", "run_name"))
def train(c, batches=None, run_name=None, host=None, identity=None, stack=None, set_=None, dry_run=False,
          detach=False, verbose=False, wait=None):
    """Run GRPO training (the tutorial's section 5) as a detached job and follow its progress."""
    from tpu_grpo import pipeline

    with _one_line_errors():
        run = pipeline.build_run(stack, batches=batches, run_name=run_name, sets=set_, default_step="train")
    _launch(run, "train", host, identity, stack, wait, dry_run, detach, verbose)


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS, run_name="the trained run to export (default: the newest)",
                                            step="checkpoint step to export (default: the run's last, num_batches)"))
def export(c, run_name=None, step=None, host=None, identity=None, stack=None, set_=None, dry_run=False,
           detach=False, verbose=False, wait=None):
    """Convert a trained checkpoint back to Hugging Face format in /dev/shm (the tutorial's section 6)."""
    from tpu_grpo import pipeline

    with _one_line_errors():
        run = pipeline.build_run(stack, run_name=run_name, sets=set_, default_step="export", step=step)
    if dry_run and not run_name:
        print("# run name: the newest trained run on the host, known once connected")
    _launch(run, "export", host, identity, stack, wait, dry_run, detach, verbose, run_name_given=run_name is not None)


@task(iterable=["host", "set_"], help=_help(
    "host", "identity", "stack", "wait", "set", "dry_run", "verbose", "batches", "run_name",
    json="print the outcome as JSON",
    need_gb="free GB preflight requires in /dev/shm and on the data disk, as SHM,DATA (default 120,20 for 8B)",
    keep_checkpoint="save also copies the last training checkpoint to the data disk (~/tpu-grpo/runs/RUN/)"))
def pipeline(c, batches=None, run_name=None, host=None, identity=None, stack=None, set_=None, need_gb=None,
             dry_run=False, verbose=False, wait=None, json_=False, keep_checkpoint=False):
    """Preflight, then convert -> train -> export -> save; done steps are skipped, so a re-run resumes."""
    from tpu_grpo import maxtext, pipeline as pipeline_module

    with _one_line_errors():
        run = pipeline_module.build_run(stack, batches=batches, run_name=run_name, sets=set_)
        need = pipeline_module.parse_need_gb(need_gb)
    if dry_run:
        for step in maxtext.STEPS:
            print(maxtext.script(run, step))
        print(f"# save: copy {maxtext.paths(run)['hf_export']} to {pipeline_module.saved_dir(run.run_name)} "
              f"on the data disk, with SHA256SUMS; the run's TensorBoard events"
              f"{' and last checkpoint' if keep_checkpoint else ''} to {pipeline_module.run_archive(run.run_name)}")
        return
    console = _console(stderr=json_)
    with _one_line_errors():
        session = _session(host, identity, stack, wait)
        total = pipeline_module.job_meta(run, "train").get("total_steps")

        def follow(job, step):
            code = _follow(session, job, step, total if step == "train" else None, verbose, console)
            if code == 130:
                raise Exit(code=130)
            return code

        def report(step):
            if step.state in ("done", "skipped"):
                console.print(f"{step.name}: {step.state} ({step.detail})")
            elif step.name == "save":
                console.print(f"save: model copied to {step.detail} on the data disk")

        outcome = pipeline_module.run_pipeline(session, run, run_name_given=run_name is not None, need_gb=need,
                                               follow=follow, on_step=report, keep_checkpoint=keep_checkpoint)
    if json_:
        print(json.dumps(outcome.to_json(), indent=2))
    else:
        console.print(f"[green]run {outcome.run} is complete[/]: model saved in {outcome.saved or 'an earlier run'} "
                      f"on {outcome.host}; get it with: uv run invoke fetch --run {outcome.run}")


@task(iterable=["host"], help={"job": "job id (default: the running job, else the newest)",
                               "follow": "keep streaming until the job ends (resumes after a dropped link)",
                               "host": HOST_HELP["host"], "identity": HOST_HELP["identity"], "stack": STACK_HELP,
                               "wait": HOST_HELP["wait"], "verbose": JOB_HELP["verbose"]})
def logs(c, job=None, follow=False, host=None, identity=None, stack=None, wait=None, verbose=False):
    """Print a job's log, or follow it with progress (Ctrl-C detaches; the job keeps running)."""
    import sys

    from tpu_grpo import jobs

    with _one_line_errors():
        session = _session(host, identity, stack, wait)
        chosen = jobs.find(jobs.list_jobs(session.connection), job)
        if not follow:
            sys.stdout.buffer.write(jobs.read_log(session.connection, chosen.id))
            return
    _exit_on_failure(_follow(session, chosen.id, chosen.step, chosen.meta.get("total_steps"), verbose))


@task(iterable=["host"], help={"json": "print the jobs as JSON", "host": HOST_HELP["host"],
                               "identity": HOST_HELP["identity"], "stack": STACK_HELP, "wait": HOST_HELP["wait"]})
def status(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """List the host's jobs: state, exit code, run, duration, and the progress of a running one."""
    from tpu_grpo import jobs, watch

    with _one_line_errors():
        session = _session(host, identity, stack, wait)
        found = jobs.list_jobs(session.connection)
        progress = watch.progress_of(session.connection, found)
    if json_:
        print(json.dumps({"host": session.host.name, "jobs": [job.to_json() for job in found],
                          "progress": progress}, indent=2))
        return
    watch.print_status(_console(), session.host.name, found, progress)


@task(iterable=["host"], help={"job": "job id (default: the running job)", "host": HOST_HELP["host"],
                               "identity": HOST_HELP["identity"], "stack": STACK_HELP, "wait": HOST_HELP["wait"]})
def cancel(c, job=None, host=None, identity=None, stack=None, wait=None):
    """Stop a job: its whole process group, then free the TPU (/dev/vfio holders, /tmp/libtpu_lockfile)."""
    from tpu_grpo import jobs

    with _one_line_errors():
        session = _session(host, identity, stack, wait)
        chosen = jobs.find(jobs.list_jobs(session.connection), job)
        if chosen.state != "running":
            print(f"job {chosen.id} is not running ({chosen.state}); nothing to cancel")
            return
        jobs.cancel(session.connection, chosen)
    print(f"cancelled job {chosen.id} ({chosen.step} of run {chosen.run}); the TPU is free")


@task(iterable=["host"], help={"run": "the run whose saved model to fetch (default: the newest saved)",
                               "to": "local folder (default: models/RUN)", "json": "print the result as JSON",
                               "host": HOST_HELP["host"], "identity": HOST_HELP["identity"], "stack": STACK_HELP,
                               "wait": HOST_HELP["wait"]})
def fetch(c, run=None, to=None, host=None, identity=None, stack=None, wait=None, json_=False):
    """Download a run's exported model to this laptop: with progress, resumable, checksums verified."""
    from tpu_grpo import results

    with _one_line_errors():
        destination = results.destination(run, to)
        session = _session(host, identity, stack, wait)
        result = results.fetch_run(session, run, destination, _console(stderr=json_))
    if json_:
        print(json.dumps(result.to_json(), indent=2))


@task(iterable=["host"], help={"run": "run name (default: the newest trained run)", "out": "PNG to write "
                               "(default: .tpu-grpo/runs/RUN/metrics.png)", "events": "read a local folder of "
                               "TensorBoard events instead of the host's", "json": "print the metrics as JSON",
                               "host": HOST_HELP["host"], "identity": HOST_HELP["identity"], "stack": STACK_HELP,
                               "wait": HOST_HELP["wait"]})
def metrics(c, run=None, out=None, events=None, host=None, identity=None, stack=None, wait=None, json_=False):
    """Reward, loss, KL and completion length per step (TensorBoard) and eval accuracy (log): table and PNG."""
    from tpu_grpo import results

    with _one_line_errors():
        session = None if events else _session(host, identity, stack, wait)
        found, path = results.metrics_of(session, run, Path(events) if events else None, Path(out) if out else None)
    if json_:
        print(json.dumps({**found.to_json(), "plot": str(path)}, indent=2))
        return
    from tpu_grpo import metrics as metrics_module

    console = _console()
    console.print(metrics_module.table(found))
    console.print(f"plot: {path}")


@task(iterable=["host"], help={"force": "destroy even if a trained model exists only on the VM", "stack": STACK_HELP,
                               "host": HOST_HELP["host"], "identity": HOST_HELP["identity"], "wait": HOST_HELP["wait"]})
def down(c, force=False, stack=None, host=None, identity=None, wait=None):
    """`pulumi destroy` the VM and its disks, refused while a trained model is not yet on this laptop."""
    from tpu_grpo import results, stack as stack_module

    with _one_line_errors():
        chosen = settings_module.load(stack, lenient=True)
        if not force:
            unsaved = results.unfetched(_session(host, identity, stack, wait))
            if unsaved:
                lines = "\n".join(f"  - {line}" for line in unsaved)
                raise Exit(f"error: refusing to destroy stack '{chosen.stack}': these results exist only on the VM, "
                           f"whose disks the destroy deletes:\n{lines}\nfetch them first, or pass --force", code=1)
    if not stack_module.shutil.which("pulumi"):
        raise Exit("error: no pulumi CLI on PATH; fix: install it (pulumi.com/docs/install)", code=2)
    _exit_on_failure(stack_module.destroy(chosen.stack))

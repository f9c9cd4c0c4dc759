"""tpu-grpo's command line: `invoke --list` shows the tasks, `invoke --help TASK` their flags.

Each task parses its flags, calls one library function and prints the result; the logic
lives in `tpu_grpo/` and `infra/`. Heavy imports (Pulumi, the GCP SDK) happen inside the
tasks that need them, so `invoke --list` stays instant.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Exit

# Invoke turns off Python's bytecode cache for whatever its tasks import (see its --write-pyc), so
# Fabric, paramiko and tpu_grpo would be compiled from source on every run. Python's own setting
# (PYTHONDONTWRITEBYTECODE, -B) still decides.
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

from tpu_grpo.config import keys, laptop_paths, settings as settings_module, stack_file  # noqa: E402 - after dont_write_bytecode, so it is cached too
from tpu_grpo.cli.flags import checked, one_line_errors, task  # noqa: E402
from tpu_grpo.config.errors import INTERRUPTED  # noqa: E402

if TYPE_CHECKING:
    from tpu_grpo.cli.targets import Where

STACK_HELP = f"stack to use (default: ${stack_file.STACK_ENV} or '{stack_file.DEFAULT_STACK}')"


def _console(stderr: bool = False):
    """The terminal; with `--json` the human lines go to stderr, so stdout holds only the JSON."""
    from rich.console import Console

    return Console(highlight=False, stderr=stderr)


def _exit_on_failure(code: int) -> None:
    """A non-zero exit code becomes the task's; zero returns, so that chained tasks go on
    (`invoke up provision pipeline`: Invoke stops the whole chain at any Exit, even Exit(0))."""
    if code:
        raise Exit(code=code)


#: The help of the flags several tasks share, written once. Invoke shows no value for a repeatable
#: flag, so its help begins with the value's form.
HELP = {
    "host": "USER@ADDRESS[:PORT], repeatable: a host to act on (default: the stack's VM from `invoke up`)",
    "identity": "private key for the host (default: your SSH agent and ~/.ssh keys; for the stack's VM, "
                "the private half of sshPublicKeyPath)",
    "stack": STACK_HELP,
    "wait": "seconds to keep retrying a VM that refuses SSH because it is still booting (default 0)",
    "var": "KEY=VALUE, repeatable: overrides a playbook variable; see `invoke plan`",
    "playbook": "playbook to apply (default: playbooks/host.yml)",
    "json": "print the result as JSON (progress goes to stderr)",
    "set": "KEY=VALUE, repeatable: adds or overrides a key on the MaxText command line "
           "(in pipeline STEP:KEY=VALUE, STEP one of convert, train, export; default train)",
    "dry_run": "print the exact remote script and exit, without connecting",
    "detach": "start the job and return at once (follow it later with `invoke logs --follow`)",
    "verbose": "show every log line, not only progress, evals and errors",
    "run_name": "run name (default: the tutorial's timestamp, YYYY-MM-DD-HH-MM-SS in UTC)",
    "batches": "GRPO batches, MaxText's num_batches (default: the stack's tpu-grpo:batches)",
}
HOST_FLAGS = ("host", "identity", "stack", "wait")


def _help(*names: str, **extra: str) -> dict:
    """The help of a task's flags: the shared wording for these names, plus its own."""
    return {**{name: HELP[name] for name in names}, **extra}


def _check_hosts(host=None, identity=None, stack=None, wait=None, with_stack=False, **_) -> Where:
    """Where the task's jobs run (tpu_grpo/cli/targets.py's Where), before anything connects: the host flags, and the
    stack's settings when the host is the stack's VM or cluster (or `with_stack`: the task needs them anyway)."""
    from tpu_grpo.cli import targets
    from tpu_grpo.host import hosts

    flags = hosts.check_flags(host, identity, wait, stack)
    return targets.Where(flags, settings_module.load(stack, lenient=True) if with_stack or not host else None)


def _check_settings(stack=None, **_) -> settings_module.Settings:
    return settings_module.load(stack, lenient=True)


@task(help=_help("stack", json="print the plan as JSON"), check=_check_settings)
def plan(c, stack=None, json_=False):
    """Show what `pulumi up` would create, the same VM as a gcloud command, and its cost (offline)."""
    from tpu_grpo.cli import plan as plan_module

    with one_line_errors():
        result = plan_module.build(stack)
    if json_:
        print(json.dumps(result.to_json(), indent=2))
    else:
        plan_module.render(result, _console())


@task(help=_help("stack", json="print the settings as JSON"), check=_check_settings)
def settings(c, stack=None, json_=False):
    """List every stack setting with its value and meaning, after validating them all."""
    chosen = checked()
    with one_line_errors():
        values = stack_file.read_stack_file(chosen.stack, stack_file.project_root())
    if json_:
        print(json.dumps({key.name: values.get(key.name) for key in keys.KEYS}, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table("setting", "value", "meaning")
    table.columns[0].no_wrap = True
    for key in keys.KEYS:  # shown as written: `[/PREFIX]` or a value in brackets is no markup
        value = values.get(key.name)
        table.add_row(key.name, escape(str(value) if value is not None else chosen.default_shown(key)),
                      escape(key.help))
    console = _console()
    console.print(table)
    for pending in chosen.pending:
        console.print(escape(f"still to set before `pulumi up`: {pending}"))
    for warning in chosen.warnings:
        console.print(escape(f"warning: {warning}"))


@task(help=_help("stack", yes="go ahead without Pulumi's preview and question (for scripts)"),
      check=_check_settings)
def up(c, stack=None, yes=False):
    """Create or update the TPU VM (or a slice's cluster) with `pulumi up`, after checking everything it needs.

    Refused while a change would delete the data disk (a new gcp:zone or vmName) with runs not yet fetched."""
    from tpu_grpo.cli import targets
    from tpu_grpo.cloud import stack as stack_module

    chosen = checked()
    missing = stack_module.missing_for_up(chosen)
    if missing:
        lines = "\n".join(f"  - {item}" for item in missing)
        raise Exit(
            f"error: `pulumi up` for stack '{chosen.stack}' cannot start; missing:\n{lines}\n"
            f"See what it would create, offline and with none of these: uv run invoke plan",
            code=2,
        )
    console = _console()
    for warning in chosen.warnings:
        console.print(f"warning: {warning}", markup=False)
    _exit_on_failure(stack_module.select_and_refresh(chosen))
    changes = stack_module.preview(chosen)
    for change in changes:
        console.print(f"replaces: {stack_module.describe(change)}", markup=False, soft_wrap=True)
    if stack_module.data_disk_lost(changes):
        from tpu_grpo.host.hosts import ConnectError

        try:
            unsaved = targets.pick(_check_hosts(stack=stack)).unsaved()
        except ConnectError as error:
            raise Exit(f"error: refusing to update stack '{chosen.stack}': the update deletes the data disk, and "
                       f"the VM does not answer, so what only it holds is unknown ({error}); fix: undo the change "
                       "to the stack file, `uv run invoke up` to bring the VM back, fetch the runs, then change "
                       "it again", code=1) from None
        if unsaved:
            lines = "\n".join(f"  - {line}" for line in unsaved)
            raise Exit(f"error: refusing to update stack '{chosen.stack}': the update deletes the data disk, and "
                       f"these results exist only there:\n{lines}\nfetch them first, or undo the change to the "
                       "stack file", code=1)
    code, explanations = stack_module.up(chosen, yes=yes, say=console.print)
    if explanations:
        raise Exit("\n".join(f"what went wrong: {line}" for line in explanations), code=code)
    _exit_on_failure(code)


def _check_provision(var=None, tags=None, locked=False, lock=None, playbook=None, **flags):
    """The playbook, its variables (and the lock with --locked) and the tags, before anything connects."""
    from tpu_grpo.provision import lock as lock_module, playbook as playbook_module

    book = playbook_module.load(playbook)
    stack_values = playbook_module.stack_values(settings_module.load(flags.get("stack"), lenient=True))
    pinned = lock_module.read_lock(Path(lock or lock_module.LOCK)) if locked else None
    values = playbook_module.resolve(book, var, pinned, stack_values)
    chosen_tags = playbook_module.parse_tags(tags)
    playbook_module.selected(book, chosen_tags)
    return book, values, chosen_tags, _check_hosts(**flags)


@task(iterable=["host", "var", "tags"], check=_check_provision, help=_help(
    *HOST_FLAGS, "var", "playbook", "json", check="report what would change (and drift from the lock), change nothing",
    tags="TAG[,TAG], repeatable: run only the steps with these tags",
    locked="install exactly the lock (written by `invoke freeze`) with `uv pip sync`",
    lock="the lock file (default: playbooks/host.lock.txt)"))
def provision(c, host=None, identity=None, stack=None, var=None, tags=None, check=False, locked=False,
              lock=None, playbook=None, wait=None, json_=False):
    """Make the host(s) ready for MaxText: apply playbooks/host.yml over SSH, idempotently, in parallel."""
    from tpu_grpo.provision import engine, report as report_module

    with one_line_errors():
        book, values, chosen_tags, where = checked()
        targets = where.flags.hosts(where.settings)
        wait_s = where.flags.wait_s
    if json_:
        report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, wait_s=wait_s)
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = _console()
        verb = "checking" if check else "provisioning"
        console.print(f"{verb} {', '.join(t.name for t in targets)} with {book.path.name}"
                      + (" (locked)" if locked else ""))
        with report_module.LiveView(console, check) as view:
            report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, on_event=view,
                                  wait_s=wait_s)
        report_module.print_summary(report, console)
    if report.failed:
        raise Exit(code=1)


def _check_freeze(var=None, playbook=None, **flags):
    from tpu_grpo.provision import playbook as playbook_module

    book = playbook_module.load(playbook)
    return book, playbook_module.resolve(book, var), _check_hosts(**flags)


@task(iterable=["host", "var"], check=_check_freeze, help=_help(
    *HOST_FLAGS, "var", "playbook", lock="where to write the lock (default: playbooks/host.lock.txt)"))
def freeze(c, host=None, identity=None, stack=None, var=None, playbook=None, lock=None, wait=None):
    """Record the host's exact environment (Python, uv, every package) in the lock for `provision --locked`."""
    from tpu_grpo.host import hosts
    from tpu_grpo.provision import lock as lock_module

    with one_line_errors():
        book, values, where = checked()
        targets = where.flags.hosts(where.settings)
        notices: list[str] = []
        connection = hosts.connect(targets[0], notices, where.flags.wait_s)
        try:
            text = lock_module.freeze(connection, book, values, targets[0].name)
        finally:
            connection.close()
    path, packages = lock_module.write_lock(Path(lock or lock_module.LOCK), text)
    for notice in notices:
        print(f"note: {notice}")
    print(f"wrote {path}: {packages} packages from {targets[0].name}")


# ------------------------------------------------------------------ workloads on the host

STEP_FLAGS = (*HOST_FLAGS, "set", "dry_run", "detach", "verbose")


def _launch(step, dry_run, detach, verbose, run_name_given=True):
    """What convert, train and export share: print the script, or start the job and follow it."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        run, where = checked()
        target = targets.pick(where)
        if dry_run:
            if step == "export" and not run_name_given:  # which run is known once the host (or cluster) is asked
                run = replace(run, run_name="NEWEST")
                print(f"# run name NEWEST: the newest trained run {target.where}, known once connected")
            print(target.script(run, step), end="")
            return
        code = target.launch(run, step, _console(), detach, verbose, run_name_given)
    _exit_on_failure(code)


def _step_run(step, stack=None, batches=None, run_name=None, set_=None, export_step=None, host=None, identity=None,
              wait=None, **_):
    """One step's run from the stack and the flags, all checked before anything connects."""
    from tpu_grpo.jobs import pipeline

    where = _check_hosts(host=host, identity=identity, stack=stack, wait=wait, with_stack=True)
    run = pipeline.build_run(where.settings, batches=batches, run_name=run_name, sets=set_, default_step=step,
                             step=export_step)
    return run, where


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS), check=lambda **flags: _step_run("convert", **flags))
def convert(c, host=None, identity=None, stack=None, set_=None, dry_run=False, detach=False, verbose=False, wait=None):
    """Convert the Hugging Face model to a MaxText checkpoint in the checkpoint store (the tutorial's section 4)."""
    _launch("convert", dry_run, detach, verbose)


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS, "batches", "run_name"),
      check=lambda **flags: _step_run("train", **flags))
def train(c, batches=None, run_name=None, host=None, identity=None, stack=None, set_=None, dry_run=False,
          detach=False, verbose=False, wait=None):
    """Run GRPO training (the tutorial's section 5) as a detached job and follow its progress."""
    _launch("train", dry_run, detach, verbose)


@task(iterable=["host", "set_"], help=_help(*STEP_FLAGS, run_name="the trained run to export (default: the newest)",
                                            step="checkpoint step to export (default: the run's last, num_batches)"),
      check=lambda step=None, **flags: _step_run("export", export_step=step, **flags))
def export(c, run_name=None, step=None, host=None, identity=None, stack=None, set_=None, dry_run=False,
           detach=False, verbose=False, wait=None):
    """Convert a trained checkpoint back to Hugging Face format in /dev/shm (the tutorial's section 6)."""
    _launch("export", dry_run, detach, verbose, run_name_given=run_name is not None)


def _check_pipeline(batches=None, run_name=None, set_=None, need_gb=None, stack=None, recover=None, var=None,
                    **flags):
    """The run, the space it needs, how many lost VMs to recover from, and (with --recover) the
    provisioning values a VM brought back gets and the Pulumi CLI that brings it back."""
    from tpu_grpo.cli import targets
    from tpu_grpo.jobs import maxtext, pipeline
    from tpu_grpo.provision import playbook

    where = _check_hosts(stack=stack, with_stack=True, **flags)
    chosen = where.settings
    run = pipeline.build_run(chosen, batches=batches, run_name=run_name, sets=set_)
    need = pipeline.parse_need_gb(need_gb, run)
    recoveries = maxtext.check_count("--recover", recover, minimum=0, maximum=100) if recover is not None else 0
    if recoveries:
        targets.pick(where).check_recovery()
    if var and not recoveries:
        raise maxtext.CommandError(f"--var {var[0]!r} is for the provisioning that --recover runs; fix: add "
                                   "--recover N, or provision with uv run invoke provision --var ...")
    options = targets.PipelineOptions(need, recover=recoveries)
    if recoveries:
        options = replace(options, provisioning=playbook.resolve(playbook.load(), var, None,
                                                                 playbook.stack_values(chosen)))
        if not shutil.which("pulumi"):
            raise maxtext.CommandError(f"--recover {recover} brings a lost VM back with the Pulumi CLI, and there is "
                                       "no pulumi on PATH; fix: install it (pulumi.com/docs/install), or run without "
                                       "--recover")
    return run, where, options


@task(iterable=["host", "set_", "var"], check=_check_pipeline, help=_help(
    *HOST_FLAGS, "set", "dry_run", "verbose", "batches", "run_name", "json",
    recover="N: bring a lost VM back (invoke up, provision) and go on, up to N times; with the disk store, "
            "training resumes after its newest checkpoint (needs the Pulumi CLI)",
    var="KEY=VALUE, repeatable: a playbook variable for the provisioning --recover runs (as invoke provision's)",
    need_gb="free GB preflight requires in /dev/shm and on the data disk, as SHM,DATA (default: what the 8B model "
            "needs with the stack's checkpointStore, 120,36 with shm)",
    keep_checkpoint="save also copies the last training checkpoint to the data disk (~/tpu-grpo/runs/RUN/)"))
def pipeline(c, batches=None, run_name=None, host=None, identity=None, stack=None, set_=None, need_gb=None,
             dry_run=False, verbose=False, wait=None, json_=False, keep_checkpoint=False, recover=None, var=None):
    """Preflight, then convert -> train -> export -> save; done steps are skipped, so a re-run resumes."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        run, where, options = checked()
        target = targets.pick(where)
        if dry_run:
            data, text = target.pipeline_dry_run(run, keep_checkpoint)
            print(json.dumps(data, indent=2) if json_ else text, end="\n" if json_ else "")
            return
        code, outcome = target.pipeline(run, _console(stderr=json_), run_name is not None, replace(
            options, keep_checkpoint=keep_checkpoint, verbose=verbose, pulumi_out=sys.stderr if json_ else None))
    if json_:
        print(json.dumps(outcome, indent=2))
    _exit_on_failure(code)


@task(iterable=["host"], check=_check_hosts, help=_help(
    *HOST_FLAGS, "verbose", job="job id (default: the running job, else the newest)",
    follow="keep streaming until the job ends (resumes after a dropped link)"))
def logs(c, job=None, follow=False, host=None, identity=None, stack=None, wait=None, verbose=False):
    """Print a job's log, or follow it with progress (Ctrl-C detaches; the job keeps running)."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        target = targets.pick(checked())
        if not follow:
            for chunk in target.read_log(job):
                sys.stdout.buffer.write(chunk)
            return
        code = target.follow(job, _console(), verbose)
    _exit_on_failure(code)


@task(iterable=["host"], check=_check_hosts, help=_help(*HOST_FLAGS, "json"))
def status(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """The jobs (state, exit code, run, duration, progress); on the VM, its TPU chips and its idle stop."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        target = targets.pick(checked())
        found = target.status()
    if json_:
        print(json.dumps(found, indent=2))
    else:
        target.show_status(_console(), found)


@task(iterable=["host"], check=_check_hosts, help=_help(*HOST_FLAGS, "json"))
def runs(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """Every run in one table, newest first: what it was given, how it scored, what it cost, where its model is.

    From the host and this laptop's fetched copies, whichever answer (--json says which did)."""
    from tpu_grpo.cli import targets
    from tpu_grpo.results import runs as runs_module

    with one_line_errors():
        found, sources = targets.pick(checked()).runs()
    if json_:
        print(json.dumps({"sources": sources, "runs": [row.to_json() for row in found]}, indent=2))
        return
    runs_module.show(_console(), found, sources)


@task(iterable=["host"], check=_check_hosts, help=_help(*HOST_FLAGS, job="job id (default: the running job)"))
def cancel(c, job=None, host=None, identity=None, stack=None, wait=None):
    """Stop a job and free the TPU; on a slice, delete its JobSet.

    On the VM: the job's whole process group, then whatever holds /dev/vfio and /tmp/libtpu_lockfile. On a
    slice: the JobSet with its pods."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        said = targets.pick(checked()).cancel(job)
    print(said)


def _check_fetch(run=None, to=None, **flags):
    from tpu_grpo.results import retrieval

    return retrieval.destination(run, to), _check_hosts(**flags)


@task(iterable=["host"], check=_check_fetch, help=_help(
    *HOST_FLAGS, "json", run="the run whose saved model to fetch (default: the newest saved)",
    to="local folder (default: models/RUN)"))
def fetch(c, run=None, to=None, host=None, identity=None, stack=None, wait=None, json_=False):
    """Download a run's exported model to this laptop: with progress, resumable, checksums verified."""
    from tpu_grpo.cli import targets

    with one_line_errors():
        destination, where = checked()
        result = targets.pick(where).fetch(run, destination, _console(stderr=json_))
    if json_:
        print(json.dumps(result.to_json(), indent=2))


def _check_publish(repo=None, run=None, **flags):
    from tpu_grpo.jobs import maxtext
    from tpu_grpo.results import publish as publish_module

    if not repo:
        raise maxtext.CommandError("--repo is missing; fix: --repo OWNER/NAME, e.g. --repo your-name/Llama-3.1-8B-GRPO")
    publish_module.check_repo(repo)
    stack_file.hub_endpoint()
    if run is not None:
        maxtext.check_run_name(run, "--run")
    return _check_hosts(**flags)


@task(iterable=["host"], check=_check_publish, help=_help(
    *HOST_FLAGS, "json", "verbose", repo="OWNER/NAME: the Hugging Face model repository (created if missing)",
    run="the run whose saved model to publish (default: the newest saved)",
    public="make a new repository public (default: private)"))
def publish(c, repo=None, run=None, public=False, host=None, identity=None, stack=None, wait=None, json_=False,
            verbose=False):
    """Upload a run's saved model to the Hugging Face Hub from the host, with a model card; re-runs send nothing twice."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results import publish as publish_module

    console = _console(stderr=json_)
    with one_line_errors():
        where = checked()
        session = vm_jobs.session(where.flags, where.settings)
        try:
            outcome = publish_module.publish(session, run, repo, not public, console, verbose)
        except KeyboardInterrupt:
            console.print("\ndetached: the upload goes on on the host; reattach: uv run invoke logs --follow")
            raise Exit(code=INTERRUPTED) from None
    if json_:
        print(json.dumps(outcome.to_json(), indent=2))
        return
    sent = (f"{len(outcome.uploaded)} files ({outcome.bytes_uploaded} bytes) uploaded in commit {outcome.commit}"
            if outcome.uploaded else "nothing uploaded: the Hub already holds every file")
    console.print(f"[green]published[/] run {outcome.run} at {outcome.url}: {sent}; "
                  f"{outcome.already_there} already there; card: {outcome.card}")


def _check_metrics(run=None, out=None, events=None, force=False, compare=None, **flags):
    from tpu_grpo.results import retrieval

    path = retrieval.check_metrics_flags(run, out, events, force, compare)
    return path, None if events is not None else _check_hosts(**flags)  # a local events folder: no host


@task(iterable=["host", "compare"], check=_check_metrics, help=_help(
    *HOST_FLAGS, "json", run="run name (default: the newest trained run)",
    compare="RUN, repeatable: overlay two or more runs' reward, KL, completion length and eval accuracy in one PNG "
            "(default --out .tpu-grpo/compare.png), the legend naming the inputs in which they differ",
    out="PNG to write (default: .tpu-grpo/runs/RUN/metrics.png); an existing file only if tpu-grpo wrote it",
    force="let --out overwrite any existing file",
    events="read a local folder of TensorBoard events instead of the host's"))
def metrics(c, run=None, out=None, events=None, force=False, host=None, identity=None, stack=None, wait=None,
            json_=False, compare=None):
    """Reward, loss, KL and completion length per step (TensorBoard) and eval accuracy (log): table and PNG."""
    from tpu_grpo.cli import targets
    from tpu_grpo.results import metrics as metrics_module, retrieval

    with one_line_errors():
        path, where = checked()
        if compare:  # the runs of the host (or cluster), one plot
            target = targets.pick(where)
            found = [target.metrics(name, None)[0] for name in compare]
            path = metrics_module.plot(found, path or laptop_paths.state() / laptop_paths.COMPARE_PLOT)
        elif events:  # a folder here: no host, no cluster
            found, path = retrieval.metrics_of_events(run, events, path)
        else:
            found, path = targets.pick(where).metrics(run, path)
    if json_:
        data = {"runs": [one.to_json() for one in found]} if compare else found.to_json()
        print(json.dumps({**data, "plot": str(path)}, indent=2))
        return
    console = _console()
    for one in found if compare else [found]:
        console.print(metrics_module.table(one))
    console.print(f"plot: {path}")


def _check_tensorboard(run=None, port=None, every=None, **flags) -> tuple[int, float, Where]:
    from tpu_grpo.results import tensorboard_sync

    return (*tensorboard_sync.check_flags(run, port, every), _check_hosts(**flags))


@task(iterable=["host"], check=_check_tensorboard, help=_help(
    *HOST_FLAGS, "json", run="one run to show (default: every run trained on the host, side by side)",
    port="the port TensorBoard listens on, on 127.0.0.1 (default 6006)",
    every="seconds between syncs of the events from the host (default 5)",
    once="sync the events once and exit, without serving"))
def tensorboard(c, run=None, port=None, every=None, once=False, host=None, identity=None, stack=None, wait=None,
                json_=False):
    """TensorBoard on this laptop over the runs' events, synced from the host while they train; Ctrl-C stops it."""
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results import tensorboard_sync

    console = _console(stderr=json_)
    with one_line_errors():
        port_number, every_s, where = checked()
        session = vm_jobs.session(where.flags, where.settings)
        try:
            copied = tensorboard_sync.sync(session, run)
        except hosts.ConnectError as error:
            copied = dict.fromkeys(tensorboard_sync.local_runs(run, laptop_paths.state()), 0)
            if once or not copied:
                raise
            console.print(f"the host does not answer ({error}); serving the events already here")
    if once:
        if json_:
            print(json.dumps({"runs": {name: {"bytes_copied": count, "events": str(laptop_paths.events(name))}
                                       for name, count in copied.items()}}, indent=2))
        for name, count in copied.items():
            console.print(f"{name}: {count} new bytes of events in {laptop_paths.events(name)}")
        return
    try:
        url = tensorboard_sync.serve(sorted(copied), port_number)
    except Exception as error:  # noqa: BLE001 - TensorBoard's own errors (a port in use): one line
        raise Exit(f"error: TensorBoard did not start ({error}); fix: --port another port", code=1) from None
    console.print(f"TensorBoard: {url} (runs: {', '.join(sorted(copied))}); syncing every {every_s:g} s; "
                  f"Ctrl-C stops it, the events stay in {laptop_paths.runs()}", soft_wrap=True)
    try:
        tensorboard_sync.keep_in_sync(session, run, every_s, console.print)
    except KeyboardInterrupt:
        console.print("stopped")
        raise Exit(code=INTERRUPTED) from None


@task(iterable=["host"], check=_check_hosts, help=_help(*HOST_FLAGS, "json"))
def timeline(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """Where the VM's hours went since it booted: a table and a chart.

    Each phase (provisioning, download, jobs, training steps, evals, saves, fetches, idle), the paid time and
    its training share; the chart is .tpu-grpo/timeline.png."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results import timeline as timeline_module

    with one_line_errors():
        where = checked()
        session = vm_jobs.session(where.flags, where.settings)
        found = timeline_module.gather(session.connection)
    built = timeline_module.build(session.host.name, found, timeline_module.fetches())
    png = timeline_module.plot(built, laptop_paths.state() / laptop_paths.TIMELINE_PLOT)
    if json_:
        print(json.dumps({**built.to_json(), "chart": str(png)}, indent=2))
        return
    timeline_module.show(_console(), built, png)


def _check_image(stack=None, builder="auto", **_):
    """The stack (a slice's) and the builder's name; whether that builder can run here is asked once, in the task."""
    from tpu_grpo.provision import image_build

    chosen = settings_module.load(stack, lenient=True)
    if not chosen.tpu_slice:
        raise image_build.UserError(f"stack '{chosen.stack}' is one VM, which `invoke provision` installs MaxText on; "
                                    "fix: pulumi config set tpu-grpo:slice v6e-16 for a multi-host slice")
    image_build.check_builder(builder)
    return chosen


@task(check=_check_image, help=_help(
    "stack", builder="docker (a local Docker), cloud-build (gcloud builds submit) or auto (default: Docker when "
                     "its daemon answers, else Cloud Build)",
    dry_run="print the Dockerfile and the commands, and exit"))
def image(c, stack=None, builder="auto", dry_run=False):
    """Build and push a slice's post-training image (MaxText and its post-training extra), tagged by MaxText version."""
    from tpu_grpo.cli import targets
    from tpu_grpo.provision import image_build

    with one_line_errors():
        chosen = checked()
        if dry_run:
            print(image_build.dockerfile())
            for command in image_build.commands(chosen, builder, "CONTEXT"):
                print("$ " + " ".join(command))
            return
        pushed = image_build.build(chosen, image_build.choose(builder))
        targets.SliceTarget(chosen).cluster.record_image(pushed)
    print(f"pushed {pushed}; the slice's jobs run it")


def _check_down(**flags):
    from tpu_grpo.cloud import stack as stack_module

    where = _check_hosts(with_stack=True, **flags)
    stack_module.require_cli()  # before any connection: without it, the destroy cannot happen
    return where


@task(iterable=["host"], check=_check_down, help=_help(
    *HOST_FLAGS, force="destroy even if a trained model exists only on the VM: the data disk goes with it",
    yes="go ahead without Pulumi's preview and question (for scripts)"))
def down(c, force=False, stack=None, host=None, identity=None, wait=None, yes=False):
    """`pulumi destroy` the stack, refused while a trained model is not yet on this laptop.

    The VM and its disks go; a slice's runs are in its bucket, which the destroy keeps."""
    from tpu_grpo.cli import targets
    from tpu_grpo.cloud import stack as stack_module

    with one_line_errors():
        where = checked()
        chosen = where.settings
        unsaved = [] if force else targets.pick(where).unsaved()
    if unsaved:
        lines = "\n".join(f"  - {line}" for line in unsaved)
        raise Exit(f"error: refusing to destroy stack '{chosen.stack}': these results exist only on the VM, "
                   f"whose disks the destroy deletes:\n{lines}\nfetch them first, or pass --force", code=1)
    _exit_on_failure(stack_module.destroy(chosen.stack, yes=yes))

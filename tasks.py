"""tpu-grpo's command line: `invoke --list` shows the tasks, `invoke --help TASK` their flags.

Each task parses its flags, calls one library function and prints the result; the logic
lives in `tpu_grpo/` and `infra/`. Heavy imports (Pulumi, the GCP SDK) happen inside the
tasks that need them, so `invoke --list` stays instant.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from invoke import Exit, task

from tpu_grpo import settings as settings_module

STACK_HELP = f"stack to use (default: ${settings_module.STACK_ENV} or '{settings_module.DEFAULT_STACK}')"


def _console():
    from rich.console import Console

    return Console(highlight=False)


@contextmanager
def _one_line_errors():
    """Bad input (settings, hosts, playbook, --var) ends the task with one line and exit code 2, no traceback."""
    from tpu_grpo.hosts import HostError
    from tpu_grpo.provision import PlaybookError

    try:
        yield
    except (settings_module.SettingsError, HostError, PlaybookError) as error:
        raise Exit(f"error: {error}", code=2) from None


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
    raise Exit(code=code)


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

"""tpu-grpo's command line: `invoke --list` shows the tasks, `invoke --help TASK` their flags.

Each task parses its flags, calls one library function and prints the result; the logic
lives in `tpu_grpo/` and `infra/`. Heavy imports (Pulumi, the GCP SDK) happen inside the
tasks that need them, so `invoke --list` stays instant.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

from invoke import Exit, task

from tpu_grpo import settings as settings_module

STACK_HELP = f"stack to use (default: ${settings_module.STACK_ENV} or '{settings_module.DEFAULT_STACK}')"


def _console():
    from rich.console import Console

    return Console(highlight=False)


@contextmanager
def _one_line_errors():
    """A bad setting ends the task with its one-line message and exit code 2, no traceback."""
    try:
        yield
    except settings_module.SettingsError as error:
        raise Exit(f"error: {error}", code=2) from None


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

"""What every task of the command line shares: flags, exit codes, and checking a whole command
line before any task of it acts.

`invoke up provision pipeline --batches 0` runs three tasks in a row; without a look ahead the
first two would create and provision a VM before the third refused its flag. Invoke parses every
task's flags first, then hands them to an executor: ours (named in `invoke.yaml`) runs each task's
`check` over the flags it was given, all of them, before the first task runs.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable

from invoke import Executor, Exit, Task
from invoke import task as invoke_task

from tpu_grpo.errors import UserError


#: The only short flags, each with one meaning in every task. Invoke's own `-h` (help) must win,
#: so no task flag takes `-h`, nor any other letter of Invoke's core flags (-c -d -D -e -f -F -l -p
#: -r -R -T -V -w).
SHORT_FLAGS = {"json_": "j", "verbose": "v", "batches": "b", "stack": "s"}


class FlagTask(Task):
    """An Invoke task with the project's short flags (no automatic ones) and a `check` of its flags
    that runs, for every task of the command line, before the first of them acts."""

    def __init__(self, body: Callable, check: Callable[..., Any] | None = None, **kwargs: Any):
        super().__init__(body, auto_shortflags=False, **kwargs)
        self.check = check

    def arg_opts(self, name: str, default: Any, taken_names: set) -> dict:
        options = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            options["names"].append(SHORT_FLAGS[name])
        return options


task = functools.partial(invoke_task, klass=FlagTask)


@contextmanager
def one_line_errors(keep: tuple[type, ...] = ()):
    """Bad input ends the task with one line and its exit code (2; a failure on the host: 1), no traceback.
    Errors of the `keep` types go on up, to a caller that handles them (a lost VM, with --recover)."""
    try:
        yield
    except keep:
        raise
    except UserError as error:
        raise Exit(f"error: {error}", code=error.exit_code) from None


class CheckingExecutor(Executor):
    """Checks the flags of every task on the command line before running the first one."""

    def execute(self, *tasks):
        for call in self.normalize(tasks):
            check = getattr(call.task, "check", None)
            if check is not None:
                with one_line_errors():
                    check(**call.kwargs)
        return super().execute(*tasks)

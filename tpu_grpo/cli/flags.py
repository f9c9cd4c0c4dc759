"""What every task of the command line shares: flags, exit codes, and checking a whole command
line before any task of it acts.

`invoke up provision pipeline --batches 0` runs three tasks in a row; without a look ahead the
first two would create and provision a VM before the third refused its flag. Invoke parses every
task's flags first, then hands them to an executor: ours (named in `invoke.yaml`) runs each task's
`check` over the flags it was given, all of them, before the first task runs.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import io
import os
import re
import shlex
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import field, fields
from typing import Any

from invoke import Executor, Exit, ParseError, Program, Task
from invoke import task as invoke_task

from tpu_grpo.config.errors import BROKEN_PIPE, UserError
from tpu_grpo.config.printing import without_token
from tpu_grpo.config.secrets import MAX_SAID, conceal, masked_token

#: The only short flags, each with one meaning in every task. Invoke's own `-h` (help) must win,
#: so no task flag takes `-h`, nor any other letter of Invoke's core flags (-c -d -D -e -f -F -l -p
#: -r -R -T -V -w).
SHORT_FLAGS = {"json_": "j", "verbose": "v", "batches": "b", "stack": "s"}


class Flags:
    """A task's flags, declared once: a frozen dataclass whose every field is one flag (its name, its default, its
    help through `flag`), and whose `check` turns them into what the task's body receives beside them. The checks of
    every task of the command line run before the first task acts (CheckingExecutor)."""

    def check(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} declares no check")


def flag(help: str, default: Any = None, repeatable: bool = False) -> Any:
    """One flag of a Flags record: its help (a repeatable flag's begins with the value's form, which Invoke does not
    show) and its default."""
    return field(default=default, metadata={"help": help, "repeatable": repeatable})


class FlagTask(Task):
    """An Invoke task whose flags are a Flags record (Invoke reads a task's flags from `argspec`, which this returns
    from the record), with the project's short flags and none made up. Its body is called as body(context, flags,
    checked): the record and what its check returned before any task of the command line ran."""

    def __init__(self, body: Callable, flags: type[Flags], **kwargs: Any):
        self.flags = flags
        repeatable = [each.name for each in fields(flags) if each.metadata["repeatable"]]  # type: ignore[arg-type]
        super().__init__(body, auto_shortflags=False, iterable=repeatable, **kwargs)
        self.checked_values: list[Any] = []  # one per call of this task on the command line, in order

    def argspec(self, body: Callable) -> inspect.Signature:
        keyword = inspect.Parameter.KEYWORD_ONLY
        return inspect.Signature(
            [inspect.Parameter(each.name, keyword, default=each.default) for each in fields(self.flags)]  # type: ignore[arg-type]
        )

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list:
        # Invoke's arg_opts pops each help text it reads: given anew, a second --help in one process still has them
        self.help = {each.name: each.metadata["help"] for each in fields(self.flags)}  # type: ignore[arg-type]
        return super().get_arguments(ignore_unknown_help)

    def arg_opts(self, name: str, default: Any, taken_names: set) -> dict:
        options = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            options["names"].append(SHORT_FLAGS[name])
        return options

    def check(self, given: dict[str, Any]) -> Any:
        """What the task's check returns for the flags `given`, or its one-line refusal."""
        with one_line_errors():
            return self.flags(**given).check()

    def __call__(self, context: Any, **given: Any) -> Any:
        # called without the executor (another task's body, a test): its check runs now
        checked = self.checked_values.pop(0) if self.checked_values else self.check(given)
        self.times_called += 1
        return self.body(context, self.flags(**given), checked)


task = functools.partial(invoke_task, klass=FlagTask)


@contextmanager
def one_line_errors(keep: tuple[type[BaseException], ...] = ()):
    """Bad input ends the task with one line and its exit code (2; a failure on the host: 1), no traceback.
    Errors of the `keep` types go on up, to a caller that handles them (a lost VM, with --recover)."""
    try:
        yield
    except keep:
        raise
    except UserError as error:
        raise Exit(f"error: {conceal(str(error))}" if str(error) else None, code=error.exit_code) from None


def typed_words(context, leave_out: tuple[str, ...] = ()) -> list[str]:
    """One task of the command line as typed, to print: its name and the flags it was given (but those in
    `leave_out`), each value without a secret's and on one line (concealed before it is shell-quoted, which would
    hide a secret's key from `conceal`)."""
    words = [context.name]
    for argument in context.args.values():
        if not argument.got_value or argument.names[0] in leave_out:
            continue
        flag = f"--{argument.names[0]}"
        if argument.kind is bool:
            words.append(flag)
        else:
            values = argument.value if argument.kind is list else [argument.value]
            words += [part for value in values for part in (flag, shown(value))]
    return words


def shown(value: Any) -> str:
    """A value typed on the command line, as a one-line refusal repeats it."""
    return conceal(one_word(value)).replace("\n", "\\n")


def with_command(contexts, remainder: str) -> str:
    """The command line as typed, what followed `--` given to ssh as its --command (to paste as printed); a line
    without ssh gets ssh's own."""
    if not any(context.name == "ssh" for context in contexts):
        return shlex.join(["uv", "run", "invoke", "ssh", "--command", remainder])
    words = ["uv", "run", "invoke"]
    for context in contexts:
        words += typed_words(context, leave_out=("command",))
        if context.name == "ssh":
            words += ["--command", remainder]
    return shlex.join(words)


#: The flags that say what a command line acts on: given to one task of a chain, they are every task's.
WHERE_FLAGS = ("stack", "host")


def one_place(contexts) -> dict[str, Any]:
    """What a chain acts on: the --stack and --host its tasks were given, one value each, which then holds for every
    task of the chain that takes the flag (Invoke gives a flag to the task it follows, so `up provision --stack prod`
    would have `up` act on the default stack). Two tasks given different values are refused before any acts."""
    chosen: dict[str, Any] = {}
    for name in WHERE_FLAGS:
        given = {
            context.name: context.args[name].value
            for context in contexts
            if name in context.args and context.args[name].got_value
        }
        values = {one_word(value) for value in given.values()}  # compared as typed, said as `shown`
        if len(values) > 1:
            lines = [
                shlex.join(["uv", "run", "invoke", *typed_words(context)])
                for context in contexts
                if name in context.args
            ]
            said = ", ".join(f"{task} --{name} {shown(value)}" for task, value in given.items())
            apart = "; ".join(lines)
            apart = f": {apart}" if len(said) + len(apart) < MAX_SAID // 2 else ""  # else the cut would take the fix
            raise Exit(
                conceal(
                    f"error: the command line acts on two {name}s ({said}), and a chain acts on one; fix: give "
                    f"--{name} once (it holds for every task of the line), or run them apart{apart}"
                ),
                code=UserError.exit_code,
            )
        if given:
            chosen[name] = next(iter(given.values()))
    return chosen


def one_word(value: Any) -> str:
    """A flag's value as one word, to compare and to say: a repeatable flag's values joined by commas."""
    return ",".join(value) if isinstance(value, list) else str(value)


class CheckingExecutor(Executor):
    """Checks the flags of every task on the command line before running the first one, each acting on the one stack
    and the hosts the line names (one_place)."""

    place: dict[str, Any] = {}

    def normalize(self, tasks):
        calls = super().normalize(tasks)
        for call in calls:
            for name, value in self.place.items():
                if name in call.kwargs:
                    call.kwargs[name] = value
        return calls

    def execute(self, *tasks):
        for stream in (sys.stdout, sys.stderr):  # PYTHONIOENCODING=ascii: a `?` for what it cannot say, no traceback
            if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
                stream.reconfigure(errors="replace")
        token = masked_token()
        sys.stdout, sys.stderr = without_token(sys.stdout, token), without_token(sys.stderr, token)
        self.place = one_place([task for task in tasks if not isinstance(task, str)])
        for call in self.normalize(tasks):  # a bad flag is said first, before a fix that would repeat it
            if isinstance(call.task, FlagTask):
                call.task.checked_values.append(call.task.check(call.kwargs))
        remainder = getattr(self.core, "remainder", "")
        if remainder:  # Invoke keeps what follows `--` and hands it to no task: `ssh -- df -h` would drop `df -h`
            typed = conceal(remainder).replace("\n", "\\n")  # no secret's value, one line, cut when long
            raise Exit(
                conceal(
                    f"error: `-- {typed}`: no task reads what follows --; fix: {with_command(tasks, typed)} runs a "
                    "command on the VM (every task takes flags only)"
                ),
                code=UserError.exit_code,
            )
        with quiet_on_a_closed_pipe():
            return super().execute(*tasks)


@contextmanager
def quiet_on_a_closed_pipe():
    """The reader went away (`| head`): stop quietly with 128 + SIGPIPE, as command-line tools do."""
    try:
        try:
            yield
        finally:  # what is still buffered meets a reader gone here, not in Python's exit (which exits 120)
            sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        raise Exit(code=BROKEN_PIPE) from None


def parse_error_line(error: ParseError) -> str:
    """Invoke's own words for a command line it cannot parse ("No idea what '-x' is!"), as one line naming the
    value and the fix, like every other bad input."""
    task = getattr(error.context, "name", None)
    where = f"uv run invoke {task} --help" if task else "uv run invoke --list"
    text = str(error)
    unknown = re.fullmatch(r"No idea what '(.*)' is!", text)
    needs = re.fullmatch(r"Flag <Argument: (\w+).*> needed value and was not given one!", text)
    if unknown and unknown[1].startswith("-"):
        typed = unknown[1].split("=", 1)[0]
        flags = sorted(name for name in getattr(error.context, "flags", {}) if name.startswith("--"))
        # a flag of the same stem first (`--run` for `--run-name`, and back), else the closest spelling
        nearest = [name for name in flags if name.startswith(f"{typed}-") or typed.startswith(f"{name}-")][:1]
        nearest = nearest or difflib.get_close_matches(typed, flags, n=1, cutoff=0.6)
        meant = f"{nearest[0]}, {task}'s own (all of its flags: {where})" if nearest else f"its flags: {where}"
        return f"{task or 'invoke'} has no flag {unknown[1]}; fix: {meant}"
    if unknown:
        what = f"no flag or value of {task} (a flag given twice?)" if task else "no task"
        return f"{unknown[1]!r} is {what}; fix: {where}"
    if needs:
        return f"--{needs[1].replace('_', '-')} needs a value; fix: {where}"
    return f"{text}; fix: {where}"


_parse_tasks = Program.parse_tasks


def _parse_tasks_in_one_line(program: Program) -> None:
    try:
        _parse_tasks(program)
    except ParseError as error:
        raise Exit(f"error: {parse_error_line(error)}", code=UserError.exit_code) from None


# Invoke has no hook for its parse errors: it prints them in its own words and exits 1. Its tasks are parsed
# after this module is imported (with tasks.py), so wrapping Program.parse_tasks gives them the project's
# one line and exit code 2.
Program.parse_tasks = _parse_tasks_in_one_line  # type: ignore[method-assign, assignment]

_parse_cleanup = Program.parse_cleanup


def _cleanup_until_the_reader_goes(program: Program) -> None:
    with quiet_on_a_closed_pipe():
        _parse_cleanup(program)


# `invoke --list` and `--help` print in Invoke's parse_cleanup, after this module is imported; a reader gone
# (`| head -1`) was a BrokenPipeError's traceback.
Program.parse_cleanup = _cleanup_until_the_reader_goes  # type: ignore[method-assign, assignment]


# ------------------------------------------------------------------ what the tasks share


def exit_on_failure(code: int) -> None:
    """A non-zero exit code becomes the task's; zero returns, so that chained tasks go on
    (`invoke up provision pipeline`: Invoke stops the whole chain at any Exit, even Exit(0))."""
    if code:
        raise Exit(code=code)

"""The one kind of error that the command line shows as a single line, without a traceback."""

from __future__ import annotations

from typing import Any

#: What a task exits with when Ctrl-C stops it (128 + SIGINT); UserError says the others.
INTERRUPTED = 130
#: What a task exits with when its output's reader went away (`| head`): 128 + SIGPIPE, as a tool killed by it.
BROKEN_PIPE = 141


class UserError(Exception):
    """Bad input, or a state the user has to change: one line naming the value and the fix.

    `invoke` prints it and exits with `exit_code`: 2 when nothing was done, 1 when a step failed."""

    exit_code = 2


class BadFlag(UserError, ValueError):
    """A flag's value refused before anything is done: one line naming the value and the fix."""


class NotReady(UserError):
    """The command was right, but where it runs lacks what its step needs, or is busy (nothing trained yet, a job
    still running, an image not pushed): one line saying what to do first; nothing was started."""

    exit_code = 1


class Detached(UserError):
    """Ctrl-C while following a job: the job goes on, and what to do was said already (no line of its own)."""

    exit_code = INTERRUPTED


class SettingsError(UserError, ValueError):
    """A bad setting: says which key, what was wrong with its value and how to fix it."""

    def __init__(self, key: str, value: Any, problem: str, fix: str):
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        shown = "(missing)" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
        said = f"{key}={shown}{not_ascii(value)} {problem}; fix: {fix}"
        super().__init__(said.replace("\r", "\\r").replace("\n", "\\n"))  # one line, whatever a value held

    def to_json(self) -> dict[str, str]:
        """As `plan --json` and `settings --json` list what is still to set."""
        return {"key": self.key, "problem": self.problem, "fix": self.fix}


def not_ascii(value: Any) -> str:
    """` (holds U+2010 HYPHEN)`: what in an echoed value is not ASCII, which a look-alike (a Unicode hyphen, a
    Cyrillic letter) would hide beside a fix that looks the same; "" for a value all ASCII."""
    import unicodedata

    found = dict.fromkeys(char for char in value if ord(char) > 127) if isinstance(value, str) else {}
    named = [f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')}" for char in list(found)[:3]]
    return f" (holds {', '.join(named)}{', ...' if len(found) > 3 else ''})" if named else ""

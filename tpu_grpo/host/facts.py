"""What tpu-grpo reads from a host, each as a fact: the script that asks and the parser of the answer, kept
apart as pyinfra keeps a fact's command and its `process`. So every parser is tested from answers recorded on
a host (tests/facts/NAME/CASE.json), without one; the host tier keeps the end-to-end checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_grpo.host import hosts


@dataclass(frozen=True)
class Answer:
    """What the host printed for a fact's script, and its exit code."""

    stdout: str
    stderr: str = ""
    exited: int = 0


@dataclass(frozen=True)
class Fact:
    name: str
    script: Callable[..., str]  # (*args) -> the shell script that asks the host
    parse: Callable[..., Any]  # (answer, *args) -> the fact

    def read(self, connection, *args) -> Any:
        """The fact as the host tells it now (one round trip)."""
        result = hosts.run_script(connection, self.script(*args))
        return self.parse(Answer(result.stdout, result.stderr, result.exited), *args)

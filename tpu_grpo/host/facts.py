"""What tpu-grpo reads from a host, each as a fact: the script that asks and the parser of the answer, kept
apart as pyinfra keeps a fact's `command` and its `process`. A fact is a subclass of Fact, named by its module and
class (`vm_jobs.Jobs`) and registered as it is defined, as pyinfra's FactBase.__init_subclass__ names its facts; so
every parser is tested from answers recorded on a host (tests/facts/NAME/CASE.json) by one test that walks the
registry, and a fact without recorded answers fails it. The host tier keeps the end-to-end checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tpu_grpo.host import hosts


@dataclass(frozen=True)
class Answer:
    """What the host printed for a fact's script, and its exit code."""

    stdout: str
    stderr: str = ""
    exited: int = 0


#: Every fact by name, filled as the modules that define them are imported.
REGISTRY: dict[str, type[Fact]] = {}


class Fact:
    """A subclass gives `script` (its arguments -> the bash that asks the host) and `parse` (the answer and the
    same arguments -> the fact), each a staticmethod, and says in its docstring what the fact is."""

    name: ClassVar[str]
    script: ClassVar[Callable[..., str]]
    parse: ClassVar[Callable[..., Any]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
        assert cls.name not in REGISTRY, f"two facts named {cls.name}"
        REGISTRY[cls.name] = cls

    @classmethod
    def read(cls, connection, *args) -> Any:
        """The fact as the host tells it now (one round trip)."""
        result = hosts.run_script(connection, cls.script(*args))
        return cls.parse(Answer(result.stdout, result.stderr, result.exited), *args)

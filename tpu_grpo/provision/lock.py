"""The lock for reproducible rebuilds: `invoke freeze` records a provisioned host's exact Python, uv
and packages; `invoke provision --locked` installs exactly that (playbooks/host.yml's lock step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tpu_grpo.config import values
from tpu_grpo.host import hosts
from tpu_grpo.provision.playbook import PLAYBOOKS, Playbook, PlaybookError, render

LOCK = PLAYBOOKS / "host.lock.txt"
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+| @ [A-Za-z0-9+:/._@#=&%~-]+)$")


@dataclass(frozen=True)
class Lock:
    path: str
    python: str
    uv: str
    requirements: str


def read_lock(path: Path) -> Lock:
    """Parse the lock `invoke freeze` wrote; every requirement line is checked, so it is safe to template."""
    try:
        text = values.text_of(values.existing_file(str(path)))
    except values.Refused as problem:
        raise PlaybookError(
            f"--lock {str(path)!r} {problem}; fix: run `uv run invoke freeze` on a provisioned host "
            "first, or give its lock"
        ) from None
    header = dict(re.findall(r"^# (python|uv): (\S+)$", text, re.M))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#") and not _REQUIREMENT.match(line.strip()):
            raise PlaybookError(
                f"{path}:{number}: {line.strip()!r} is not 'name==version' or 'name @ url'; "
                "fix: regenerate it with `uv run invoke freeze`"
            )
    if not lines:
        raise PlaybookError(f"{path}: the lock lists no packages; fix: run `uv run invoke freeze`")
    return Lock(str(path), header.get("python", ""), header.get("uv", ""), "\n".join(lines))


#: How a lock freeze wrote begins.
HEADER = "# tpu-grpo host lock"


def check_lock_path(text: str | None) -> Path:
    """Where freeze writes the lock, checked before anything connects: a file in a folder this user may write, and,
    when it is there, a lock freeze wrote (as `metrics --out` overwrites only a plot of its own)."""
    if text is None:
        return LOCK
    path = values.flag("--lock", text, values.new_file, "playbooks/host.lock.txt")
    if path.is_file() and not _begins_with_the_header(path):
        raise PlaybookError(
            f"--lock {text!r} is a file `invoke freeze` did not write, which the lock would replace; fix: --lock "
            "playbooks/host.lock.txt, or another new file"
        )
    return path


def _begins_with_the_header(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(HEADER)) == HEADER.encode()


def write_lock(path: Path, text: str) -> tuple[Path, int]:
    """Write the lock `freeze` made (via a temporary file, so a failed write leaves the old one); returns
    its path and how many packages it pins."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)
    return path, sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def freeze(connection, book: Playbook, values: dict, source: str) -> str:
    """The host's exact environment as a lock: Python, uv and every package of the venv."""
    venv = values["venv"]
    script = (
        f"{render(book.prelude, values).rstrip()}\n"
        f'{venv}/bin/python -c "import sys; print(sys.version.split()[0])"\n'
        f'uv --version | cut -d" " -f2\n'
        f"uv pip freeze --python {venv}"
    )
    result = hosts.run_script(connection, script)
    if result.exited != 0:
        raise PlaybookError(
            f"{source}: cannot read the venv {venv} (exit {result.exited}: "
            f"{result.stderr.strip().splitlines()[-1:] or ''}); fix: run `uv run invoke provision` first"
        )
    python, uv, *packages = result.stdout.strip().splitlines()
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"{HEADER}: `invoke provision --locked` installs exactly this with `uv pip sync`.\n"
        f"# written by `invoke freeze` from {source} at {stamp}\n"
        f"# python: {python}\n# uv: {uv}\n" + "\n".join(sorted(packages, key=str.lower)) + "\n"
    )

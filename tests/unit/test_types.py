"""The code is formatted and linted by ruff (pyproject's [tool.ruff]: one line length, one rule set) and type-checks:
mypy over tpu_grpo, infra and tasks.py (pyproject's [tool.mypy]), with Optional strict, so a value that may be None (a
stack's slice shape, a regex match, a piped stream) is narrowed before it is used."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_mypy_finds_no_error():
    checked = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found" in checked.stdout


def test_ruff_formats_and_lints_the_tree_clean():
    """`ruff format` would change nothing and `ruff check` finds nothing: fix with `uv run ruff format . && uv run ruff
    check --fix .`."""
    for command in (["format", "--check"], ["check", "--output-format", "concise"]):
        checked = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

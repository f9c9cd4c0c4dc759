"""The test command (`tests/run`): each tier a pytest session of its own, in order, on workers of its own
(pytest-xdist), then each tier's wall time and the slowest tests of all of them.

Options (`tests/run -x`, `tests/run -p randomly`: a random order, its seed printed) reach every tier; test paths
(`tests/run tests/unit/test_fuzz.py -k flag`) run those tests in one session instead, on their tier's workers (a plain
session where they span tiers). A tier this machine
cannot run (not root, packages or the MaxText venv missing) is not started: its one line says why and what fixes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import host_tier_missing, maxtext_tier_missing
from tests.support import ROOT

CORES = os.cpu_count() or 1
SLOWEST = 15
NO_TESTS_COLLECTED = 5  # pytest's exit code when options select nothing in a tier


@dataclass(frozen=True)
class Tier:
    name: str
    folder: str
    #: Its workers: the unit and MaxText tiers keep the cores busy computing; the host tier's tests mostly wait (on
    #: SSH, apt and the network), so three times as many.
    workers: int
    missing: Callable[[], str | None] = lambda: None  # why the tier cannot run here, or None


TIERS = (
    Tier("unit", "tests/unit", CORES),
    Tier("host", "tests/host", 3 * CORES, host_tier_missing),
    Tier("maxtext", "tests/maxtext", CORES, maxtext_tier_missing),
)


#: pytest's options whose value is the next argument: `-k tests` selects by name, it names no folder.
VALUE_OPTIONS = {"-k", "-m", "-p", "-n", "-o", "-c", "-W", "--deselect", "--ignore", "--maxfail", "--basetemp"}


def named_tests(args: list[str]) -> list[Path]:
    """The tests the arguments name (paths, node ids), rather than only options and their values."""
    values = {index + 1 for index, arg in enumerate(args) if arg in VALUE_OPTIONS}
    return [
        (ROOT / arg.split("::")[0]).resolve()
        for index, arg in enumerate(args)
        if index not in values and not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists()
    ]


def run_tier(tier: Tier, args: list[str], report: Path | None = None) -> tuple[int, float]:
    """One pytest session of the tier's tests (or those `args` name in it) on its workers; its exit code and time."""
    started = time.monotonic()
    # worksteal: a worker that runs out takes tests queued for another, so long tests do not end a tier on one core
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            str(tier.workers),
            "--dist",
            "worksteal",
            *([f"--junitxml={report}", tier.folder] if report else []),
            *args,
        ],
        cwd=ROOT,
    ).returncode
    return code, time.monotonic() - started


def slowest(reports: dict[str, Path], count: int = SLOWEST) -> list[tuple[float, str, str]]:
    """(seconds, tier, test) of the slowest tests, setup and teardown included, from the tiers' JUnit reports."""
    found = []
    for tier, report in reports.items():
        if report.exists():
            for case in ElementTree.parse(report).iter("testcase"):
                test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                found.append((float(case.get("time", 0)), tier, test))
    return sorted(found, reverse=True)[:count]


def tier_holding(paths: list[Path]) -> Tier | None:
    """The tier whose folder holds every one of these tests, or None."""
    return next((tier for tier in TIERS if all(path.is_relative_to(ROOT / tier.folder) for path in paths)), None)


def main(args: list[str]) -> int:
    named = named_tests(args)
    if named:  # one session, on the workers of their tier if they are of one
        tier = tier_holding(named)
        return (
            run_tier(tier, args)[0]
            if tier
            else subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT).returncode
        )
    worst, times, reports = 0, {}, {}
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-tiers-") as folder:
        for tier in TIERS:
            why = tier.missing()
            if why:
                print(f"skipped the {tier.name} tier: {why}", flush=True)
                continue
            reports[tier.name] = Path(folder) / f"{tier.name}.xml"
            code, times[tier.name] = run_tier(tier, args, reports[tier.name])
            if code not in (0, NO_TESTS_COLLECTED):
                worst = worst or code
        print(f"\nslowest {SLOWEST} tests:")
        for seconds, tier, test in slowest(reports):
            print(f"{seconds:8.1f} s  {tier:8} {test}")
    print(
        "\nwall time by tier: "
        + ", ".join(f"{tier} {seconds / 60:.1f} min" for tier, seconds in times.items())
        + f"; all {sum(times.values()) / 60:.1f} min"
    )
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A training's start with its compile cache cleared (cold) against kept (warm), with real MaxText 0.2.3 on the CPU.

    uv run python -m benchmarks.warm_start [--runs N] [--json]   (as root, after tests/maxtext/install)

In one run, on one host laid out as the real-MaxText tier lays it out (tests/maxtext/conftest.py: the tier's venv,
the token file, the tiny Llama 3.1 model downloaded as provisioning does, the Hub's stand-in, /dev/shm a folder of
its own in a mount namespace), with the tier's training of the tutorial's stack (tests/maxtext/stack.py: 4 batches,
the model shrunk by `--set`s, the VM's 8 chips as CPU devices):

1. convert once (not timed);
2. N rounds, each one after the other: the training with the compile cache folder removed (cold: the baseline),
   the same training again (warm: the cache the cold one wrote), and the same training from a fresh home whose
   ~/tpu-grpo is the first home's (a VM created anew around the same data disk: the project's recovery);
3. print the median time to the first train step of each (MaxText's own log times, tpu_grpo.jobs.progress.startup:
   from its first log line, so the imports before it are not counted) and the median wall time of the script, the
   ratios cold / warm, and the cache's entries and bytes.

Each training is a run of its own name, so none resumes; everything is made in a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from tests.doubles.hub import HubServer
from tests.maxtext import stack
from tests.maxtext.conftest import Host, lay_out_host
from tests.maxtext.families import FAMILIES
from tpu_grpo.jobs import maxtext, progress

FAMILY = "llama3.1-8b-Instruct"


def train(host: Host, run: maxtext.Run, devices: dict[str, str]) -> dict:
    """One training: its wall time, its start-up as its log tells it."""
    started = time.monotonic()
    done = host.run(maxtext.script(run, "train"), devices)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"training {run.name} failed:\n" + "\n".join((done.stdout + done.stderr).splitlines()[-30:]))
    found = progress.startup((done.stdout + done.stderr).splitlines(), time.gmtime().tm_year)
    return {
        "wall_s": wall,
        "to_first_step_s": found["to_first_step"],
        "warm": found["cache"]["warm"],
        "phases": found["phases"],
        "folder": found["cache"]["folder"],
    }


def replaced(host: Host, folder: Path) -> Host:
    """A fresh home (nothing in ~ but the venv and the token) whose ~/tpu-grpo is `host`'s: the same data disk."""
    home = folder / "home"
    (home / ".cache/huggingface").mkdir(parents=True)
    shutil.copy(host.home / ".cache/huggingface/token", home / ".cache/huggingface/token")
    (home / "maxtext_venv").symlink_to((host.home / "maxtext_venv").readlink())
    (home / "tpu-grpo").symlink_to(host.home / "tpu-grpo")
    (folder / "shm").symlink_to(host.shm)  # the converted checkpoint, which a new VM restores from the data disk
    return replace(host, home=home)


def measure(rounds: int) -> dict:
    with HubServer() as hub, tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        host = lay_out_host(Path(tmp), hub, FAMILIES[FAMILY])
        chosen = stack.stack(FAMILY, "vm")
        run = stack.run(chosen, host.family, host.data, in_slice=False)
        devices = stack.chips_as_devices(chosen.chips)
        converted = host.run(maxtext.script(run, "convert"), devices)
        if converted.returncode != 0:
            raise SystemExit("conversion failed:\n" + converted.stderr[-3000:])
        new_vm = replaced(host, Path(tmp) / "replaced")
        caches = host.path(maxtext.compile_cache_root(run))
        found: dict[str, list[dict]] = {"cold": [], "warm": [], "replaced": []}
        for number in range(rounds):
            shutil.rmtree(caches, ignore_errors=True)
            found["cold"].append(train(host, replace(run, run_name=f"cold-{number}"), devices))
            found["warm"].append(train(host, replace(run, run_name=f"warm-{number}"), devices))
            found["replaced"].append(train(new_vm, replace(run, run_name=f"replaced-{number}"), devices))
            print(
                f"round {number + 1}: "
                + ", ".join(
                    f"{kind} {runs[-1]['to_first_step_s']:.1f} s to the first step" for kind, runs in found.items()
                ),
                file=sys.stderr,
                flush=True,
            )
        cache = host.path(found["cold"][-1]["folder"])
        entries = [path.stat().st_size for path in cache.glob("*-cache")]
    assert not any(each["warm"] for each in found["cold"]) and all(
        each["warm"] for kind in ("warm", "replaced") for each in found[kind]
    ), "a start was not what it was asked to be"
    medians = {
        kind: {what: statistics.median(each[what] for each in runs) for what in ("to_first_step_s", "wall_s")}
        for kind, runs in found.items()
    }
    return {
        "family": FAMILY,
        "rounds": rounds,
        "medians": medians,
        "cold_over_warm_first_step": medians["cold"]["to_first_step_s"] / medians["warm"]["to_first_step_s"],
        "cold_over_warm_wall": medians["cold"]["wall_s"] / medians["warm"]["wall_s"],
        "cold_over_replaced_first_step": (medians["cold"]["to_first_step_s"] / medians["replaced"]["to_first_step_s"]),
        "cache_entries": len(entries),
        "cache_bytes": sum(entries),
        "phases": {kind: runs[-1]["phases"] for kind, runs in found.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="rounds of cold, warm and replaced (default 2)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    found = measure(args.runs)
    if args.json:
        print(json.dumps(found, indent=2))
        return
    for kind, median in found["medians"].items():
        print(f"{kind:>8}: {median['to_first_step_s']:6.1f} s to the first step, {median['wall_s']:6.1f} s in all")
    print(
        f"cold / warm: {found['cold_over_warm_first_step']:.2f}x to the first step, "
        f"{found['cold_over_warm_wall']:.2f}x in all; cold / replaced VM: "
        f"{found['cold_over_replaced_first_step']:.2f}x to the first step"
    )
    print(f"cache: {found['cache_entries']} entries, {found['cache_bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

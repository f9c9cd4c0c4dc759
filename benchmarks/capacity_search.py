"""What the search for chips (tpu_grpo/cloud/search.py) adds to `invoke up`, on the Pulumi CLI double.

    uv run python -m benchmarks.capacity_search [--runs N] [--json]

Three stacks, each `invoke up --yes` as a process, in rounds: a spot stack without fallback (the baseline: one
attempt, as before the search), the same stack with two fallback places whose first place gets chips (the search's
own cost on a successful `up`: parsing the places, ordering them, the record), and the same with the first two places
out of chips (three attempts). The double answers at once, so the times are tpu-grpo's bookkeeping and the program run
offline for each attempt's preview, not the cloud's. It counts the Pulumi CLI calls per attempt from the double's
record of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import ROOT, task_environment

FALLBACK = [{"zone": "us-east5-a"}, {"zone": "us-central1-b", "capacity": "on-demand"}]
CASES = {
    "no fallback (baseline)": ([], ()),
    "fallback, first place gets chips": (FALLBACK, ()),
    "fallback, first two out of chips": (FALLBACK, (("us-east5-b", "spot"), ("us-east5-a", "spot"))),
}


def stack_folder(folder: Path, fallback: list) -> Path:
    folder.mkdir(parents=True)
    (folder / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "key")], check=True)
    config = {
        "gcp:project": "grpo-lab-123",
        "gcp:zone": "us-east5-b",
        "tpu-grpo:capacity": "spot",
        "tpu-grpo:sshPublicKeyPath": str(folder / "key.pub"),
        "tpu-grpo:sshSourceRanges": ["203.0.113.7/32"],
        **({"tpu-grpo:fallback": fallback} if fallback else {}),
    }
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
    return folder


def one_up(work: Path, name: str, round_number: int) -> tuple[float, int, int]:
    """(seconds, Pulumi calls, attempts) of one `invoke up --yes` on a fresh stack of the case."""
    fallback, refused = CASES[name]
    folder = work / f"{round_number}-{len(fallback)}-{len(refused)}"
    stack = stack_folder(folder / "project", fallback)
    cli = PulumiCli(folder / "pulumi")
    cli.gets_chips_anywhere()
    for zone, capacity in refused:
        cli.answer_at(zone, capacity, "stockout")
    env = task_environment({**cli.env(), "TPU_GRPO_STATE": str(folder / "state")})
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "up", "--yes"],
        cwd=stack,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{name}: invoke up failed: {done.stderr}")
    calls = cli.calls()
    return seconds, len(calls), sum(call.startswith("up ") for call in calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    counted: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-bench-") as work:
        for round_number in range(options.runs):  # rounds: this machine's speed drifts within minutes
            for name in CASES:
                seconds, calls, attempts = one_up(Path(work), name, round_number)
                times[name].append(seconds)
                counted[name] = (calls, attempts)
    baseline = statistics.median(times["no fallback (baseline)"])
    rows = [
        {
            "case": name,
            "median_s": round(statistics.median(times[name]), 3),
            "ratio": round(statistics.median(times[name]) / baseline, 2),
            "pulumi_calls": counted[name][0],
            "attempts": counted[name][1],
        }
        for name in CASES
    ]
    if options.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{row['case']:36} {row['median_s']:6.2f} s  x{row['ratio']:.2f}  {row['pulumi_calls']} Pulumi calls, "
            f"{row['attempts']} attempt(s)"
        )


if __name__ == "__main__":
    main()

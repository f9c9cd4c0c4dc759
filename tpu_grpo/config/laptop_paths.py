"""Where things live on the laptop, in one place, as tpu_grpo/config/host_paths.py says the host's: the project's state folder
(`.tpu-grpo/` beside the stack file, or $TPU_GRPO_STATE; never committed) and what tpu-grpo keeps in it."""

from __future__ import annotations

import os
from pathlib import Path

from tpu_grpo.config.stack_file import STATE_ENV, project_root


def state() -> Path:
    return Path(os.environ.get(STATE_ENV) or project_root() / ".tpu-grpo")


def known_hosts() -> Path:
    """The hosts' keys, recorded at first contact and checked at every other (tpu_grpo/host/hosts.py)."""
    return state() / "known_hosts"


def fetched_record(run: str, folder: Path | None = None) -> Path:
    """What `invoke fetch` records of a run it brought to this laptop: where, and its checksums."""
    return (folder or state()) / "fetched" / f"{run}.json"


def published_record(run: str, folder: Path | None = None) -> Path:
    """What `invoke publish` records of a run it uploaded: the Hub repository and the commit the Hub answered."""
    return (folder or state()) / "published" / f"{run}.json"


def records(kind: str, folder: Path | None = None) -> list[Path]:
    """Every `fetched` or `published` record, by run name."""
    return sorted(((folder or state()) / kind).glob("*.json"))


def runs(folder: Path | None = None) -> Path:
    return (folder or state()) / "runs"


def run_folder(run: str) -> Path:
    """A run's copies on the laptop: its TensorBoard events, training log, metrics plot and recovery timeline."""
    return runs() / run


def events(run: str) -> Path:
    return run_folder(run) / "tensorboard"


def job_log(job_id: str) -> Path:
    """A job's log as followed from the laptop."""
    return state() / "logs" / f"{job_id}.log"


COMPARE_PLOT, TIMELINE_PLOT, METRICS_PLOT, RECOVERY_TIMELINE = "compare.png", "timeline.png", "metrics.png", \
    "timeline.jsonl"

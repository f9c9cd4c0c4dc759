"""Where things live on the laptop, in one place, as tpu_grpo/config/host_paths.py says the host's: the project's state
folder (`.tpu-grpo/` beside the stack file, or $TPU_GRPO_STATE; never committed) and what tpu-grpo keeps in it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tpu_grpo.config import values
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.stack_file import STATE_ENV, project_root


def state() -> Path:
    given = os.environ.get(STATE_ENV)  # `~` is the home (as the check reads it), never a folder named `~` here
    return Path(os.path.expanduser(given)) if given else project_root() / ".tpu-grpo"


def writable_state() -> Path:
    """The state folder, checked before a task that writes in it acts: a folder (or one to make) this user can
    write in."""
    folder = state()
    given = os.environ.get(STATE_ENV, "")
    if re.search(r"\$|%\w+%", given) or str(folder).startswith("~"):  # `~` was expanded; `~nouser` is no one's
        raise UserError(
            f"{STATE_ENV}={given!r} holds a variable or home no shell expanded (a .env file is read as written), "
            f"which would be a folder of that name here; fix: {STATE_ENV}=FOLDER, the folder itself (e.g. "
            f"{STATE_ENV}=$HOME/tpu-grpo-state in a shell)"
        )
    try:
        return values.new_folder(str(folder))
    except values.Refused as problem:
        said = f"{STATE_ENV}={str(folder)!r}" if os.environ.get(STATE_ENV) else f"the state folder {str(folder)!r}"
        raise UserError(
            f"{said} {problem}; fix: {STATE_ENV}=FOLDER, a folder you can write (tpu-grpo keeps host "
            "keys, logs and plots there)"
        ) from None


def known_hosts() -> Path:
    """The hosts' keys, recorded at first contact and checked at every other (tpu_grpo/host/hosts.py)."""
    return state() / "known_hosts"


def fetched_record(run: str, folder: Path | None = None) -> Path:
    """What `invoke fetch` records of a run it brought to this laptop: where, and its checksums."""
    return (folder or state()) / "fetched" / f"{run}.json"


def published_record(run: str, folder: Path | None = None) -> Path:
    """What `invoke publish` records of a run it uploaded: the Hub repository and the commit the Hub answered."""
    return (folder or state()) / "published" / f"{run}.json"


def write_record(path: Path, data: dict) -> None:
    """A record written whole or not at all (a temporary file renamed over it): a task stopped midway never
    leaves the half-written record another task would read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def read_record(path: Path) -> dict:
    """A record as written, or {} for one that is not there or not readable (empty, damaged, by hand): a record is
    what tpu-grpo knows, never a reason to fail."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past what json's parser follows
        return {}
    return data if isinstance(data, dict) else {}


def recorded_folder(record: dict) -> Path | None:
    """The folder a fetch record names (`dir`), when it is text naming a folder that is there: a damaged record (a
    number, a name too long for the filesystem, a NUL in it) names none, as read_record promises."""
    folder = record.get("dir")
    try:
        return Path(folder) if isinstance(folder, str) and folder and Path(folder).is_dir() else None
    except (OSError, ValueError):
        return None


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


COMPARE_PLOT, TIMELINE_PLOT, METRICS_PLOT, RECOVERY_TIMELINE = (
    "compare.png",
    "timeline.png",
    "metrics.png",
    "timeline.jsonl",
)

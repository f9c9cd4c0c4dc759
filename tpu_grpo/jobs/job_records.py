"""A job as the tasks show it, one shape on both targets: a VM's job (tpu_grpo/jobs/vm_jobs.py) and a slice's JobSet
(tpu_grpo/jobs/slice_jobs.py) become the same record, so `status --json` reads the same wherever the jobs ran, and
one table shows them."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from rich.console import Console

from tpu_grpo.config.printing import styled
from tpu_grpo.jobs.progress import duration

#: pending (a slice's pods wait for nodes), running, finished (exit 0), failed, cancelled (the VM's), lost (a VM
#: job whose processes are gone without an exit code).
STATES = ("pending", "running", "finished", "failed", "cancelled", "lost")
COLOURS = {
    "pending": "yellow",
    "running": "yellow",
    "finished": "green",
    "failed": "red",
    "cancelled": "magenta",
    "lost": "red",
}


@dataclass(frozen=True)
class JobRecord:
    id: str  # the VM job's folder name, or the slice's JobSet name
    step: str
    run: str
    state: str  # one of STATES
    exit_code: int | None
    started: str  # UTC, ISO 8601 to the second
    finished: str | None  # the same; None while it runs, or where the cluster does not say
    total_steps: int | None  # a training's GRPO steps
    problem: str | None  # why it cannot run, with the fix (a slice's pending pods); else None

    def to_json(self) -> dict:
        return asdict(self)


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def show(console: Console, where: str, records: list[JobRecord]) -> None:
    """The jobs as a table (how long each took, where known), then each one's problem on a line of its own."""
    from rich.table import Table

    if not records:
        console.print(f"{where}: no jobs yet (start one: uv run invoke pipeline --batches 50)")
        return
    table = Table(title=f"jobs on {where}", title_justify="left")
    for column in ("job", "step", "run", "state", "exit", "started (UTC)", "took"):
        table.add_column(column)
    for record in records:
        took = (
            duration((seconds(record.finished) if record.finished else time.time()) - seconds(record.started))
            if record.started and (record.finished or record.state == "running")
            else ""
        )
        table.add_row(
            record.id,
            record.step,
            record.run,
            f"[{COLOURS[record.state]}]{record.state}[/]",
            "" if record.exit_code is None else str(record.exit_code),
            record.started.replace("T", " ")[:19],
            took,
        )
    console.print(table)
    for record in records:
        if record.problem:
            console.print(styled("[red]{}:[/] {}", record.id, record.problem))

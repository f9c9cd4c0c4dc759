"""`invoke timeline`: where the VM's hours went, from its boot to now.

A reservation's chips are paid for every hour, used or not. The timeline puts every phase on one
clock, from what the tasks record on the host (and fetch on the laptop): the boot and sshd's start,
each provisioning step that changed something, the base model's download, each job (convert, train,
export, publish), inside a training its start-up, step ranges and evaluations (from the log's own
timestamps), the saves and the fetches; what is left between them is idle. The sum of the training
step ranges over the time since boot is the share of the paid hours that trained.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.config import host_paths, laptop_paths
from tpu_grpo.host import facts
from tpu_grpo.jobs import job_records, vm_jobs
from tpu_grpo.jobs.progress import STARTUP_LABELS, STARTUP_PHASES, absl_seconds, message

#: A gap between phases at least this long is shown as idle.
IDLE_MIN_S = 60.0
#: absl's time of a log line (month, day, time; the year is the job's).
_LANDMARKS = "|".join(
    [
        "Pre RL Training",
        "Starting RL training",
        "Train step",
        "Intermediate Eval",
        "RL Training Completed",
        "Post RL Training",
        *(mark for _, mark in STARTUP_PHASES[1:-1]),
    ]
)
_STEP = re.compile(r"^Train step (\d+) ")
_EVAL_STEP = re.compile(r"^Intermediate Eval \(step=(\d+)\)")


@dataclass
class Phase:
    kind: str  # a COLOURS key: search, vm, provision, download, convert, ..., fetch, idle
    label: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


@dataclass
class Timeline:
    host: str
    booted: float
    now: float
    phases: list[Phase] = field(default_factory=list)
    chips: int | None = None  # the VM's, and how they were had: from its newest job's record
    capacity: str | None = None

    @property
    def paid_s(self) -> float:
        return self.now - self.booted

    @property
    def training_s(self) -> float:
        return sum(phase.seconds for phase in self.phases if phase.kind == "train")

    @property
    def chip_hours(self) -> float | None:
        return self.paid_s / 3600 * self.chips if self.chips else None

    @property
    def cost(self) -> tuple[float, str] | None:
        """What the paid time cost (USD) and the price's source; None until a job says the machine and capacity."""
        row = CAPACITIES.get(self.capacity or "")
        return (row.cost_usd(self.chip_hours), row.price_source) if row and self.chip_hours is not None else None

    def to_json(self) -> dict:
        cost = self.cost
        return {
            "host": self.host,
            "booted": self.booted,
            "now": self.now,
            "paid_seconds": round(self.paid_s, 3),
            "training_seconds": round(self.training_s, 3),
            "training_share": round(self.training_s / self.paid_s, 4) if self.paid_s > 0 else 0.0,
            "chips": self.chips,
            "capacity": self.capacity,
            "chip_hours": None if self.chip_hours is None else round(self.chip_hours, 4),
            "cost_usd": cost[0] if cost else None,
            "price_source": cost[1] if cost else None,
            "phases": [phase.to_json() for phase in self.phases],
        }


def training_phases(run: str, started: float, ended: float, log_end: float, lines: list[str]) -> list[Phase]:
    """A training job's phases from its log's landmark lines: start-up and the evaluation before training,
    GRPO step ranges split by the evaluations between them, the evaluation after. The log's clock is put
    on the job's by its last line, written when the log was last modified (`log_end`); every phase stays
    within the job."""
    year = time.gmtime(started).tm_year
    marks = [(stamp, message(line)) for line in lines if (stamp := absl_seconds(line, year)) is not None]
    if not marks:
        return [Phase("train", f"{run}: training", started, ended)]
    shift = log_end - marks[-1][0]

    def at(stamp: float) -> float:
        return min(max(stamp + shift, started), ended)

    phases: list[Phase] = []
    since, last_step_at, first_step, last_step = started, started, None, None
    starting = "boot"  # the start-up phase since `since`: each of MaxText's start-up lines begins the next
    for stamp, text in marks:
        if next_phase := next((phase for phase, mark in STARTUP_PHASES[1:] if text.startswith(mark)), None):
            kind = "eval" if starting == "eval" else "startup"
            phases.append(Phase(kind, f"{run}: {STARTUP_LABELS[starting]}", since, at(stamp)))
            since, starting = at(stamp), next_phase
        elif found := _STEP.match(text):
            first_step = first_step if first_step is not None else int(found[1])
            last_step, last_step_at = int(found[1]), at(stamp)
        elif (found := _EVAL_STEP.match(text)) or text.startswith("RL Training Completed"):
            if first_step is not None:
                phases.append(Phase("train", f"{run}: GRPO steps {first_step}-{last_step}", since, last_step_at))
                since, first_step = last_step_at, None
            if found:
                phases.append(Phase("eval", f"{run}: evaluation at step {found[1]}", since, at(stamp)))
                since = at(stamp)
        elif text.startswith("Post RL Training"):
            phases.append(Phase("eval", f"{run}: evaluation after training", since, at(stamp)))
            since = at(stamp)
    if first_step is not None:  # still training, or it ended without a landmark
        phases.append(Phase("train", f"{run}: GRPO steps {first_step}-{last_step}", since, last_step_at))
    return [phase for phase in phases if phase.seconds > 0 or phase.kind == "train"]


def _script(trainings: list[str]) -> str:
    """One round trip: the boot, sshd's start, provisioning records, the download's times, save records,
    and each training job's landmark lines with its log's modification time."""
    logs = "".join(
        f"""cd {vm_jobs.JOBS}/{job_id} && echo log {job_id} $(stat -c %Y log) && \
  {{ grep -aE '{_LANDMARKS}' log | sed 's/^/line {job_id} /'; }}
"""
        for job_id in trainings
    )
    return f"""ticks=$(getconf CLK_TCK); btime=$(awk '/^btime/ {{print $2}}' /proc/stat)
started() {{ awk -v b="$btime" -v t="$ticks" '{{printf "%.3f\\n", b + $22 / t}}' "/proc/$1/stat"; }}
echo boot $(started 1)
sshd=$(pgrep -o -x sshd) && echo sshd $(started "$sshd")
for f in {host_paths.PROVISIONING}/*.json; do [ -f "$f" ] && echo provision $(base64 -w0 "$f"); done
for f in {host_paths.BASE_MODELS}/*/*.sh; do
  [ -f "$f" ] && echo download "${{f%.sh}}" $(stat -c %Y "$f") $(stat -c %Y "${{f%.sh}}.complete" 2>/dev/null || echo -)
done
for f in {vm_jobs.ROOT}/runs/*/saved-at.json; do [ -f "$f" ] && echo save $(base64 -w0 "$f"); done
{logs}echo now $(date +%s.%N)
true
"""


def _recorded(answer: facts.Answer, trainings: list[str]) -> dict:
    found: dict = {"provisioning": [], "downloads": [], "saves": [], "logs": {}}
    for line in answer.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("boot", "sshd", "now") and rest:
            found[kind] = float(rest)
        elif kind == "provision":
            found["provisioning"].append(json.loads(base64.b64decode(rest)))
        elif kind == "download":
            folder, start, end = rest.split(" ")
            found["downloads"].append(
                {
                    "model": "/".join(folder.split("/")[-2:]),
                    "started": float(start),
                    "finished": None if end == "-" else float(end),
                }
            )
        elif kind == "save":
            found["saves"].append(json.loads(base64.b64decode(rest)))
        elif kind == "log":
            job_id, mtime = rest.split(" ")
            found["logs"][job_id] = (float(mtime), [])
        elif kind == "line":
            job_id, _, text = rest.partition(" ")
            found["logs"][job_id][1].append(text)
    return found


class HostRecord(facts.Fact):
    """What the host recorded of its hours (the training jobs' ids): {boot, sshd, now, provisioning, downloads,
    saves, logs: {job: (log's mtime, landmark lines)}}."""

    script = staticmethod(_script)
    parse = staticmethod(_recorded)


def gather(connection) -> dict:
    """What the host recorded, with its jobs."""
    found_jobs = vm_jobs.list_jobs(connection)
    return {**HostRecord.read(connection, [job.id for job in found_jobs if job.step == "train"]), "jobs": found_jobs}


def fetches() -> list[dict]:
    """The laptop's fetch records that say when they ran (a damaged one, edited or cut short, says nothing)."""
    return [record for record in map(laptop_paths.read_record, laptop_paths.records("fetched")) if _a_fetch(record)]


def searches(stack: str | None) -> list[dict]:
    """The laptop's records of `invoke up`'s searches for chips of this stack (tpu_grpo/cloud/search.py), oldest
    first; none for a VM named by --host alone, which no stack's search is known to have made. A damaged record
    (an attempt without its place, time or refusal) says nothing."""
    found = [laptop_paths.read_record(path) for path in laptop_paths.records("searches")]
    return sorted(
        (record for record in found if stack is not None and record.get("stack") == stack and _a_search(record)),
        key=lambda r: r["attempts"][0]["started"],
    )


def _a_fetch(record: dict) -> bool:
    return isinstance(record.get("run"), str) and _time(record.get("started")) and _time(record.get("finished"))


def _a_search(record: dict) -> bool:
    attempts = record.get("attempts")
    return isinstance(attempts, list) and bool(attempts) and all(map(_an_attempt, attempts))


def _an_attempt(attempt: object) -> bool:
    if not isinstance(attempt, dict) or not (_time(attempt.get("started")) and _time(attempt.get("seconds"))):
        return False
    place, refusal = attempt.get("place"), attempt.get("refusal")
    named = isinstance(place, dict) and all(isinstance(place.get(key), str) for key in ("capacity", "zone"))
    return named and (refusal is None or isinstance(refusal, dict) and isinstance(refusal.get("kind"), str))


def _time(value: object) -> bool:
    """A record's time or duration: a finite number (JSON's true is no time)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def build(host: str, found: dict, fetched: list[dict], searched: tuple[dict, ...] | list[dict] = ()) -> Timeline:
    """Every phase on one clock, sorted, with the idle gaps between them; the search for chips that made the VM (the
    newest that began before it booted), each attempt a phase before the boot."""
    now = found.get("now", time.time())
    booted = found.get("boot", now)
    phases = []
    if "sshd" in found:
        phases.append(Phase("vm", "boot until SSH answers", booted, found["sshd"]))
    for record in found["provisioning"]:
        for step in record["steps"]:
            phases.append(
                Phase("provision", f"provision: {step['step']}", step["started"], step["started"] + step["seconds"])
            )
    for download in found["downloads"]:
        phases.append(
            Phase("download", f"download {download['model']}", download["started"], download["finished"] or now)
        )
    for job in found["jobs"]:
        end = job.finished or now
        if job.step == "train":
            log_end, lines = found["logs"].get(job.id, (end, []))
            phases += training_phases(job.run, job.started, end, log_end, lines)
        else:
            kind = job.step if job.step in ("convert", "export", "publish") else "other"
            phases.append(Phase(kind, f"{job.step} {job.run}".strip(), job.started, end))
    for record in found["saves"]:
        phases.append(Phase("save", f"save {record['run']}", record["started"], record["finished"]))
    for record in fetched:
        phases.append(Phase("fetch", f"fetch {record['run']}", record["started"], record["finished"]))
    made_it = [record for record in searched if record["attempts"][0]["started"] <= booted][-1:]
    for attempt in (attempt for record in made_it for attempt in record["attempts"]):
        place, refusal = attempt["place"], attempt["refusal"]
        said = f"refused: {refusal['kind']}" if refusal else "got chips"
        label = f"chips: {place['capacity']} in {place['zone']}, {said}"
        phases.append(Phase("search", label, attempt["started"], attempt["started"] + attempt["seconds"]))
    phases = sorted(
        (phase for phase in phases if phase.end >= booted or phase.kind == "search"),
        key=lambda phase: (phase.start, phase.end),
    )
    newest = found["jobs"][-1].meta if found["jobs"] else {}
    machine = MACHINES.get(newest.get("inputs", {}).get("machine", ""))
    return Timeline(
        host,
        booted,
        now,
        phases + _idle(phases, booted, now),
        machine.chips if machine else None,
        newest.get("capacity"),
    )


def _idle(phases: list[Phase], booted: float, now: float) -> list[Phase]:
    """The gaps of at least IDLE_MIN_S that no phase covers, from the boot to now."""
    gaps, covered = [], booted
    for phase in phases:
        if phase.start - covered >= IDLE_MIN_S:
            gaps.append(Phase("idle", "idle", covered, phase.start))
        covered = max(covered, phase.end)
    if now - covered >= IDLE_MIN_S:
        gaps.append(Phase("idle", "idle", covered, now))
    return gaps


def _clock(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp))


def show(console, timeline: Timeline, png: Path) -> None:
    from rich.table import Table

    table = Table(title=f"where the hours of {timeline.host} went (UTC)", title_justify="left")
    for column in ("start", "end", "took", "phase"):
        table.add_column(column)
    for phase in sorted(timeline.phases, key=lambda phase: phase.start):
        table.add_row(_clock(phase.start), _clock(phase.end), job_records.duration(phase.seconds), phase.label)
    console.print(table)
    share = timeline.training_s / timeline.paid_s if timeline.paid_s > 0 else 0.0
    console.print(
        f"paid since boot: {job_records.duration(timeline.paid_s)}; training (GRPO steps): "
        f"{job_records.duration(timeline.training_s)}, {share:.0%} of it; chart: {png}"
    )
    if timeline.cost:
        usd, source = timeline.cost
        console.print(
            f"cost since boot: {timeline.chip_hours:.2f} chip-hours ({timeline.chips} chips, "
            f"{timeline.capacity}) = ${usd:,.2f}; price: {source}"
        )


COLOURS = {
    "search": "#ffbb78",
    "vm": "#888888",
    "provision": "#1f77b4",
    "download": "#17becf",
    "convert": "#9467bd",
    "startup": "#aec7e8",
    "train": "#2ca02c",
    "eval": "#bcbd22",
    "export": "#8c564b",
    "save": "#e377c2",
    "publish": "#ff7f0e",
    "fetch": "#7f7f7f",
    "idle": "#d62728",
    "other": "#aaaaaa",
}


def plot(timeline: Timeline, path: Path) -> Path:
    """A Gantt-like chart: a row per kind of phase, hours since boot across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [kind for kind in COLOURS if any(phase.kind == kind for phase in timeline.phases)]
    figure, axes = plt.subplots(figsize=(11, 0.5 * len(kinds) + 1.5))
    scale = 3600.0 if timeline.paid_s >= 2 * 3600 else 60.0
    for row, kind in enumerate(kinds):
        bars = [
            ((phase.start - timeline.booted) / scale, max(phase.seconds / scale, 1e-3))
            for phase in timeline.phases
            if phase.kind == kind
        ]
        axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLOURS[kind])
    axes.set_yticks(range(len(kinds)), kinds)
    axes.invert_yaxis()
    axes.set_xlabel(f"{'hours' if scale == 3600 else 'minutes'} since boot")
    axes.set_title(
        f"{timeline.host}: {job_records.duration(timeline.paid_s)} paid, "
        f"{timeline.training_s / timeline.paid_s:.0%} training"
        if timeline.paid_s
        else timeline.host
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path

"""Progress of a MaxText `train_rl` run, read from its log lines.

The trainer prints a few absl lines a person cares about (train steps, the pre/intermediate/post
evals, start and end) among thousands of others. This turns those lines into small events and
keeps a running picture of the run (step, loss, evals, ETA) for `invoke status` and live
progress displays. Stdlib only, so a laptop can tail a log without the training stack.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

Stage = Literal["pre", "intermediate", "post"]

#: absl's prefix: `W1202 14:23:07.528425 140671093824384 train_rl.py:716] `. tqdm may write its
#: bar (`\r0it [00:00, ?it/s]`) just before it, on the same line, so it is searched, not anchored.
ABSL_PREFIX = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\s\]]+:\d+\] ")
TRAIN_STEP = re.compile(
    r"Train step (?P<step>\d+) training loss: (?P<loss>\S+)\s+- training perplexity: (?P<perplexity>\S+)"
)
PRE_EVAL = "Pre RL Training: "
EVAL = re.compile(
    r"(?:(?P<pre>Pre)|(?P<post>Post)) RL Training: (?P<fields>.*)"
    r"|Intermediate Eval \(step=(?P<step>\d+)\): (?P<ifields>.*)"
)
#: MaxText 0.2.3's intermediate evaluation that raised (trainers/post_train/rl/hooks.py): the training goes on.
EVAL_FAILED = re.compile(r"\[intermediate-eval\] step=(?P<step>\d+) failed: (?P<error>.*)")
EVAL_FIELD = re.compile(r"(\w+)=\s*([-+\w.]+)%?")
EVAL_KEYS = ("corr", "total", "accuracy", "partial_accuracy", "format_accuracy", "mean_reward")
STARTED = "Starting RL training..."
COMPLETED = "RL Training Completed Successfully!"
#: What a training job's script prints before MaxText starts, when the run has a checkpoint that
#: train_rl will restore (tpu_grpo/jobs/maxtext.py): the steps up to it are done.
RESUMES = "tpu-grpo: training resumes after checkpoint"
RESUMED = re.compile(re.escape(RESUMES) + r" (?P<step>\d+)")
#: What an export's script prints before it scores the exported checkpoint on the report examples
#: (tpu_grpo/jobs/maxtext.py's report_lines): MaxText's next "Pre RL Training" line is that score.
REPORT_LINE = "tpu-grpo: report evaluation of checkpoint"
REPORT = re.compile(re.escape(REPORT_LINE) + r" (?P<step>\d+) on test examples (?P<start>\d+) to (?P<stop>\d+)")


@dataclass(frozen=True)
class TrainStep:
    step: int
    loss: float
    perplexity: float


@dataclass(frozen=True)
class Eval:
    """One evaluation pass. Accuracies are percentages (0-100), as MaxText prints them.

    `step` is the outer step (the batch) of an intermediate eval, scored on the weights after it (MaxText 0.2.3's
    RLTrainingHooks counts rl_cluster.global_steps); the log gives none for pre and post.
    """

    stage: Stage
    step: int | None
    correct: int
    total: int
    accuracy: float
    partial_accuracy: float
    format_accuracy: float
    mean_reward: float


@dataclass(frozen=True)
class EvalFailed:
    """An intermediate evaluation that raised: shown as such, never a checkpoint's score."""

    step: int
    error: str


@dataclass(frozen=True)
class Started:
    pass


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Resumed:
    step: int


Event = TrainStep | Eval | EvalFailed | Started | Completed | Resumed


def message(line: str) -> str:
    """The message part of a log line: what follows the absl prefix, or the line itself."""
    line = line.rstrip("\r\n")
    if found := ABSL_PREFIX.search(line):
        return line[found.end() :].strip()
    return line.rsplit("\r", 1)[-1].strip()


def parse_line(line: str) -> Event | None:
    """The progress event a log line stands for, or None for every other line."""
    text = message(line)
    if text == STARTED:
        return Started()
    if text == COMPLETED:
        return Completed()
    if match := RESUMED.match(text):
        return Resumed(int(match["step"]))
    if match := TRAIN_STEP.match(text):
        return TrainStep(int(match["step"]), float(match["loss"]), float(match["perplexity"]))
    if match := EVAL.match(text):
        return _eval(match)
    if match := EVAL_FAILED.match(text):
        return EvalFailed(int(match["step"]), match["error"])
    return None


def _eval(match: re.Match[str]) -> Eval | None:
    if match["step"] is not None:
        stage: Stage = "intermediate"
        step: int | None = int(match["step"])
        fields = match["ifields"]
    else:
        stage = "pre" if match["pre"] else "post"
        step = None
        fields = match["fields"]
    values = dict(EVAL_FIELD.findall(fields))
    if not all(key in values for key in EVAL_KEYS):
        return None
    try:
        return Eval(
            stage=stage,
            step=step,
            correct=int(values["corr"]),
            total=int(values["total"]),
            accuracy=float(values["accuracy"]),
            partial_accuracy=float(values["partial_accuracy"]),
            format_accuracy=float(values["format_accuracy"]),
            mean_reward=float(values["mean_reward"]),
        )
    except ValueError:
        return None


def parse_lines(lines: Iterable[str]) -> list[Event]:
    return [event for line in lines if (event := parse_line(line)) is not None]


@dataclass(frozen=True)
class Report:
    """The exported checkpoint (train step `step`) scored once on test examples [start, stop), which chose nothing;
    `score` None when that evaluation did not finish."""

    step: int
    start: int
    stop: int
    score: Eval | None = None


def report(lines: Iterable[str]) -> Report | None:
    """The last report evaluation in an export's log lines: its line, then the "Pre RL Training" one after it."""
    found = None
    for line in lines:
        if said := REPORT.match(message(line)):
            found = Report(int(said["step"]), int(said["start"]), int(said["stop"]))
        elif found and not found.score and isinstance(event := parse_line(line), Eval) and event.stage == "pre":
            found = Report(found.step, found.start, found.stop, event)
    return found


def scored_step(each: Eval, iterations: int = 1, last_step: int = 0) -> int:
    """The train step whose weights an evaluation scored: 0 before training, `last_step` after it, and after outer
    step N (an intermediate one) N x rl.num_iterations, the step of the checkpoint that holds them. The plot, the
    TensorBoard scalars, the export's choice and the model card all place an evaluation by this."""
    if each.stage == "pre":
        return 0
    if each.stage == "intermediate" and each.step is not None:
        return each.step * iterations
    return last_step


def best(events: Iterable[Event], checkpoints: Iterable[int], iterations: int = 1) -> Eval | None:
    """The intermediate evaluation of highest accuracy among those of a step with a checkpoint (scored_step), the
    earlier on a tie (a later one has not shown it is better); None when no checkpoint was scored."""
    saved = set(checkpoints)
    scored = [
        each
        for each in events
        if isinstance(each, Eval) and each.stage == "intermediate" and scored_step(each, iterations) in saved
    ]
    return max(scored, key=lambda each: (each.accuracy, -(each.step or 0)), default=None)


def total_steps(num_batches: int, num_iterations: int = 1, train_fraction: float = 1.0, num_epochs: int = 1) -> int:
    """Train steps of a run, as train_rl.py works them out (`max_train_steps`, truncated)."""
    return int(num_batches * num_iterations * train_fraction * num_epochs)


@dataclass
class Tracker:
    """A running picture of one run, fed its log lines as they arrive.

    Times come from `clock` (seconds, monotonic by default) when a line is fed, so the ETA is
    about the run as watched; `feed(line, now=...)` overrides the clock for one line.
    """

    total_steps: int
    clock: Callable[[], float] = time.monotonic
    step: int = 0
    loss: float | None = None
    perplexity: float | None = None
    evals: list[Eval] = field(default_factory=list)
    failed_evals: list[EvalFailed] = field(default_factory=list)
    started: bool = False
    completed: bool = False
    started_at: float | None = None
    first_step_at: float | None = None
    first_step: int | None = None
    last_step_at: float | None = None
    resumed_from: int | None = None
    #: The time the evaluations during and after training took: from the step (or the end) they follow to their line.
    eval_seconds: float = 0.0
    completed_at: float | None = None

    def feed(self, line: str, now: float | None = None) -> Event | None:
        event = parse_line(line)
        if event is not None:
            self.apply(event, self.clock() if now is None else now)
        return event

    def apply(self, event: Event, now: float) -> None:
        if isinstance(event, Started):
            self.started, self.started_at = True, now
        elif isinstance(event, Completed):
            self.completed, self.completed_at = True, now
        elif isinstance(event, Eval):
            self.evals.append(event)
            since = {"intermediate": self.last_step_at, "post": self.completed_at}.get(event.stage)
            self.eval_seconds += max(0.0, now - since) if since is not None else 0.0
        elif isinstance(event, EvalFailed):
            self.failed_evals.append(event)
        elif isinstance(event, Resumed):
            self.step = self.resumed_from = event.step
        elif isinstance(event, TrainStep):
            if self.first_step_at is None:
                self.first_step_at, self.first_step = now, event.step
            self.step, self.loss, self.perplexity = event.step, event.loss, event.perplexity
            self.last_step_at = now

    def seconds_per_step(self) -> float | None:
        """Mean time between the train steps seen so far (the first one's compile excluded)."""
        if (
            self.first_step is None
            or self.first_step_at is None
            or self.last_step_at is None
            or self.step <= self.first_step
        ):
            return None
        return (self.last_step_at - self.first_step_at) / (self.step - self.first_step)

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds until the last step, at the rate so far; None before two steps are seen."""
        if self.completed or (self.total_steps and self.step >= self.total_steps):
            return 0.0
        rate = self.seconds_per_step()
        if rate is None or self.last_step_at is None:
            return None
        now = self.clock() if now is None else now
        finish = self.last_step_at + (self.total_steps - self.step) * rate
        return max(0.0, finish - now)

    @property
    def best_so_far(self) -> Eval | None:
        """The intermediate evaluation scored best so far, the earlier on a tie (each follows a checkpoint's batch:
        maxtext.Run.eval_interval)."""
        return best(self.evals, [each.step or 0 for each in self.evals])

    @property
    def latest_accuracy(self) -> float | None:
        return self.evals[-1].accuracy if self.evals else None

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.step / self.total_steps) if self.total_steps > 0 else None

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """A JSON-able view for `invoke status --json`."""
        eta = self.eta_seconds(now)
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "fraction": self.fraction,
            "loss": self.loss,
            "perplexity": self.perplexity,
            "started": self.started,
            "completed": self.completed,
            "resumed_from": self.resumed_from,
            "seconds_per_step": self.seconds_per_step(),
            "eta_seconds": None if eta is None else round(eta, 1),
            "latest_accuracy": self.latest_accuracy,
            "evals": [asdict(e) for e in self.evals],
            "failed_evals": [asdict(e) for e in self.failed_evals],  # shown as such, never a checkpoint's score
            "best": asdict(found) if (found := self.best_so_far) else None,
            "eval_seconds": round(self.eval_seconds, 1),
            "training_seconds": None if self.started_at is None else round((now or self.clock()) - self.started_at, 1),
        }


ABSL_TIME = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) ")


#: The start of a training, phase by phase, each from its line to the next's: MaxText 0.2.3's own lines
#: (model_creation_utils.create_models_and_meshes, train_rl.py), the first train step ending the last.
STARTUP_PHASES = (
    ("boot", "System Information: Jax Version"),
    ("weights", "Creating reference model"),
    ("rollout", "Creating RL cluster"),
    ("eval", "Setting up RL trainer"),
    ("first_step", STARTED),
)
#: What each phase is, for a person: imports and config, both models' weights, vLLM's start and its precompilation
#: (tpu-inference's), the trainer's set-up and the evaluation before training, the first step's compilation.
STARTUP_LABELS = {
    "boot": "start",
    "weights": "weights",
    "rollout": "vLLM start and compile",
    "eval": "evaluation before training",
    "first_step": "first step",
}
#: tpu-inference's CompilationManager: `Compilation finished in 12.34 [secs].` after each precompiled function
#: (`Compilation of NAME finished in` in some releases), in vLLM's own format (`INFO 08-16 20:24:55 [file:line]`).
VLLM_COMPILED = re.compile(r"Compilation (?:of .*? )?finished in (?P<seconds>[0-9.]+) \[secs\]")
#: tpu_grpo/host/remote/compile_cache.py's line, before MaxText starts.
CACHE_LINE = re.compile(
    r"tpu-grpo: compile cache (?P<state>warm|cold): (?P<entries>\d+) entries, "
    r"(?P<bytes>\d+) bytes, in (?P<folder>\S+)"
)
#: What a log's start-up is read from (a fact's grep), with the first train step that ends it.
STARTUP_LINES = "|".join(
    [
        *(mark for _, mark in STARTUP_PHASES[:-1]),
        "Starting RL training",
        "Train step",
        "Compilation .*finished in",
        "tpu-grpo: compile cache",
    ]
)
#: What a run's logs are grepped for (a fact's script, one grep): its evaluations before, during and after training
#: (EVAL_LINES, which TensorBoard gets as scalars), an export's report evaluation, and the training's start.
EVAL_LINES = "Pre RL Training|Intermediate Eval|Post RL Training"
RUN_LOG_LINES = f"{EVAL_LINES}|{REPORT_LINE}|{STARTUP_LINES}"


def compile_cache(line: str) -> dict | None:
    """The compile cache a training started with, from the line its script prints."""
    found = CACHE_LINE.search(line)
    if found is None:
        return None
    return {
        "warm": found["state"] == "warm",
        "entries": int(found["entries"]),
        "bytes": int(found["bytes"]),
        "folder": found["folder"],
    }


def startup(lines: Iterable[str], year: int) -> dict[str, Any]:
    """How long each phase of a training's start took (seconds, by the log's own times; a phase not reached is
    absent), the time to its first step, vLLM's precompilation, and the compile cache it started with. A resumed
    run's log holds one start; a log of several starts (none here) gives the last."""
    marks: dict[str, float] = {}
    first_step, compiled, cache = None, 0.0, None
    for line in lines:
        text = message(line)
        if (said := compile_cache(text)) is not None:
            marks, first_step, compiled, cache = {}, None, 0.0, said
        elif (vllm := VLLM_COMPILED.search(text)) is not None:
            compiled += float(vllm["seconds"])
        elif (at := absl_seconds(line, year)) is not None:
            if first_step is None and TRAIN_STEP.match(text):
                first_step = at
            for phase, mark in STARTUP_PHASES:
                if text.startswith(mark) and phase not in marks:
                    marks[phase] = at
    ends = [*(marks.get(phase) for phase, _ in STARTUP_PHASES[1:]), first_step]
    phases = {
        phase: round(end - marks[phase], 3)
        for (phase, _), end in zip(STARTUP_PHASES, ends)
        if phase in marks and end is not None
    }
    found: dict[str, Any] = {
        "phases": phases,
        "vllm_compile": round(compiled, 3) if compiled else None,
        "to_first_step": None,
        "cache": cache,
    }
    if first_step is not None and marks:
        found["to_first_step"] = round(first_step - min(marks.values()), 3)
    return found


def startup_text(found: dict | None) -> str:
    """`weights 12s, vLLM start and compile 3m05s, ... (compile cache warm)`, or "" before a training starts."""
    if not found or not (found.get("phases") or found.get("cache")):
        return ""
    parts = [f"{STARTUP_LABELS[phase]} {duration(seconds)}" for phase, seconds in found["phases"].items()]
    if found.get("vllm_compile"):
        parts.append(f"of which vLLM compiled {duration(found['vllm_compile'])}")
    total = f"to first step {duration(found['to_first_step'])}: " if found.get("to_first_step") is not None else ""
    cache = found.get("cache")
    said = f" (compile cache {'warm' if cache['warm'] else 'cold'})" if cache else ""
    return total + ", ".join(parts) + said


def duration(seconds: float) -> str:
    """A span as a person reads it in a table: 1h02m, or 4m05s under an hour."""
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def absl_seconds(line: str, year: int) -> float | None:
    """A log line's absl time as seconds on the job's own clock (naive: only differences are used)."""
    found = ABSL_TIME.search(line)
    if not found:
        return None
    month, day, hour, minute, second = found.groups()
    return datetime(year, int(month), int(day), int(hour), int(minute)).timestamp() + float(second)

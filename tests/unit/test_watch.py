"""Following a job's log: however the bytes arrive (one at a time, at any split, across a
reconnect), the view sees the same lines, the same progress events and evals, and keeps the
same local copy of the log."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from tests.support import FIXTURES
from tpu_grpo.jobs.job_records import JobRecord
from tpu_grpo.jobs.watch import JobView

LOG = (FIXTURES / "train_rl.cpu-rehearsal.log").read_bytes()


def followed(chunks) -> tuple[list, int, bytes, str]:
    """(events, line count, the local log copy, what was shown) of one follow fed these chunks."""
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    view = JobView(console, "job-1", "train", 4)
    events = []
    feed = view.tracker.feed
    view.tracker.feed = lambda line, now=None: events.append(feed(line, now=0.0)) or events[-1]
    with view:
        for chunk in chunks:
            view.feed(chunk)
    shown = [line for line in console.file.getvalue().splitlines() if "ETA" not in line]
    return [event for event in events if event is not None], view.lines, view.path.read_bytes(), "\n".join(shown)


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_GRPO_STATE", str(tmp_path))


def test_one_byte_at_a_time_is_every_split_at_once():
    whole = followed([LOG])
    assert len(whole[0]) > 8 and whole[1] == LOG.count(b"\n") + (not LOG.endswith(b"\n"))
    assert followed(LOG[i : i + 1] for i in range(len(LOG))) == whole


def test_random_splits_and_reconnect_points_change_nothing():
    """A reconnect resumes at the byte offset it had: to the view that is one more split."""
    whole = followed([LOG])
    chooser = random.Random(7)
    for _ in range(20):
        cuts = sorted(chooser.sample(range(1, len(LOG)), 40))
        chunks = [LOG[start:end] for start, end in zip([0, *cuts], [*cuts, len(LOG)])]
        assert followed(chunks) == whole


def test_a_last_line_without_newline_is_counted_once():
    text = LOG.rstrip(b"\n")
    events, lines, copy, _ = followed([text[:-5], text[-5:]])
    assert lines == text.count(b"\n") + 1 and copy == text
    assert events == followed([text])[0]


@pytest.mark.parametrize("capacity", ["reservation", "spot", "flex-start", "on-demand"])
def test_status_says_what_an_idle_stop_means_for_the_stacks_capacity(capacity):
    from tpu_grpo.catalog.capacity import CAPACITIES
    from tpu_grpo.jobs.watch import print_status

    console = Console(file=io.StringIO(), force_terminal=False, width=400)
    after = CAPACITIES[capacity].after_stop
    print_status(console, "vm", [], None, {"idle_minutes": 60, "stops_at_earliest": 0, "after_stop": after})
    shown = " ".join(console.file.getvalue().split())
    billing = "the reservation is still billed" if capacity == "reservation" else "the chips are no longer billed"
    assert f"at the earliest; then {billing}" in shown
    assert (
        "the next `invoke up` creates the VM anew around the same data disk (a stopped TPU VM is never started" in shown
    )


@pytest.mark.parametrize("warm", [True, False])
def test_status_says_whether_the_stacks_next_training_starts_warm_and_how_the_last_one_started(warm):
    from tpu_grpo.jobs.watch import print_status

    console = Console(file=io.StringIO(), force_terminal=False, width=400)
    cache = {"warm": warm, "entries": 40 if warm else 0, "bytes": 1_234_567_890 if warm else 0, "folder": "/c/f"}
    started = {
        "phases": {"weights": 75.0, "rollout": 610.0},
        "vllm_compile": 580.0,
        "to_first_step": 700.0,
        "cache": {**cache, "warm": False},
    }
    job = JobRecord(
        id="20261205-100000.000-train",
        step="train",
        run="r",
        state="running",
        exit_code=None,
        started="2026-12-05T10:00:00Z",
        finished=None,
        total_steps=50,
        problem=None,
    )
    print_status(console, "vm", [job], {"run": "r", "step": 3, "total_steps": 50, "startup": started}, None, cache)
    shown = " ".join(console.file.getvalue().split())
    assert (
        "next training of the stack's settings: starts warm (40 compiled programs, 1,234.6 MB) from /c/f" in shown
        if warm
        else "starts cold (its compile cache /c/f is empty: this start compiles" in shown
    )
    assert (
        "start-up: to first step 11m40s: weights 1m15s, vLLM start and compile 10m10s, of which vLLM compiled "
        "9m40s (compile cache cold)"
    ) in shown


def test_a_job_table_reads_hours_and_a_job_that_ended_unseen_shows_no_growing_duration(monkeypatch):
    """A finished job took its finish less its start (1h00m05s reads 1h00m); a running one has run until now; a lost
    job, or a JobSet that finished without a finish time, shows none, rather than a time that grows every call."""
    from tpu_grpo.jobs import job_records

    monkeypatch.setattr(job_records.time, "time", lambda: job_records.seconds("2026-12-05T12:00:00Z"))

    def record(name: str, state: str, started: str, finished: str | None) -> JobRecord:
        return JobRecord(
            id=name,
            step="train",
            run="r",
            state=state,
            exit_code=None,
            started=started,
            finished=finished,
            total_steps=None,
            problem=None,
        )

    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    job_records.show(
        console,
        "vm",
        [
            record("done", "finished", "2026-12-05T08:00:00Z", "2026-12-05T09:00:05Z"),
            record("going", "running", "2026-12-05T10:54:55Z", None),
            record("gone", "lost", "2026-12-01T08:00:00Z", None),
            record("jobset", "finished", "2026-12-01T08:00:00Z", None),
        ],
    )
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in console.file.getvalue().splitlines()]
    took = {row[0]: row[-1] for row in cells if row and row[0] in ("done", "going", "gone", "jobset")}
    assert took == {"done": "1h00m", "going": "1h05m", "gone": "", "jobset": ""}


def test_status_shows_the_curve_so_far_the_best_marked_and_what_evaluating_cost():
    """A training's log read as status reads it (watch.TrainingProgress's parse, at the log's own times): each
    evaluation with its accuracy, format accuracy and reward, the best marked, and the evaluations' share of the
    training's time, from the step each follows to its line."""
    from tpu_grpo.host import facts
    from tpu_grpo.jobs.watch import TrainingProgress, print_status

    def at(second: int, text: str) -> str:
        return f"I1206 10:00:{second:02d}.000000 1 train_rl.py:1] {text}"

    def scored(stage: str, correct: int, reward: float) -> str:
        return (
            f"{stage}: corr={correct}, total=4, accuracy={25.0 * correct}%, partial_accuracy=0.0%, "
            f"format_accuracy=100.0%, mean_reward={reward}"
        )

    log = [
        at(0, scored("Pre RL Training", 1, 0.5)),
        at(1, "Starting RL training..."),
        at(10, "Train step 1 training loss: 0.1  - training perplexity: 1.1"),
        at(20, "Train step 2 training loss: 0.1  - training perplexity: 1.1"),
        at(26, scored("Intermediate Eval (step=2)", 3, 1.5)),
        at(36, "Train step 3 training loss: 0.1  - training perplexity: 1.1"),
        at(46, "Train step 4 training loss: 0.1  - training perplexity: 1.1"),
        at(50, scored("Intermediate Eval (step=4)", 2, 1.0)),
        at(51, "RL Training Completed Successfully!"),
        at(55, scored("Post RL Training", 2, 1.0)),
    ]
    found = TrainingProgress.parse(facts.Answer("\n".join(log)), "20261206-100000.000-train", 4)
    assert (found["eval_seconds"], found["training_seconds"]) == (14.0, 54.0)  # 6 + 4 + 4 of the 54 since the start
    console = Console(file=io.StringIO(), force_terminal=False, width=400)
    job = JobRecord("20261206-100000.000-train", "train", "r", "finished", 0, "", None, 4, None)
    print_status(console, "vm", [job], {"run": "r", **found})
    shown = console.file.getvalue()
    assert "training r: step 4/4; best so far: batch 2, 75%" in shown
    assert "  before training: accuracy 25% (1/4), format 100%, reward 0.5\n" in shown
    assert "  after batch 2: accuracy 75% (3/4), format 100%, reward 1.5  <- best\n" in shown
    assert "  after batch 4: accuracy 50% (2/4), format 100%, reward 1\n" in shown
    assert "  after training: accuracy 50% (2/4)" in shown
    assert "evaluation: 0m14s of the training's 0m54s so far (26%;" in shown


def test_status_shows_a_failed_evaluation_as_such_and_never_as_the_best():
    """hooks.py logs `[intermediate-eval] step=N failed: ...` and the training goes on: status says it failed."""
    from tpu_grpo.host import facts
    from tpu_grpo.jobs.watch import TrainingProgress, print_status

    log = [
        "I1206 10:00:01.000000 1 train_rl.py:1] Starting RL training...",
        "I1206 10:00:10.000000 1 peft_trainer.py:1] Train step 1 training loss: 0.1  - training perplexity: 1.1",
        "W1206 10:00:12.000000 1 hooks.py:104] [intermediate-eval] step=1 failed: RuntimeError('vLLM went away')",
    ]
    found = TrainingProgress.parse(facts.Answer("\n".join(log)), "20261206-100000.000-train", 2)
    assert found["failed_evals"] == [{"step": 1, "error": "RuntimeError('vLLM went away')"}] and found["best"] is None
    console = Console(file=io.StringIO(), force_terminal=False, width=400)
    job = JobRecord("20261206-100000.000-train", "train", "r", "running", None, "", None, 2, None)
    print_status(console, "vm", [job], {"run": "r", **found})
    assert (
        "  after batch 1: the evaluation failed (RuntimeError('vLLM went away')); never chosen\n"
        in console.file.getvalue()
    )

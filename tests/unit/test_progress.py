"""Progress events come out of MaxText 0.2.3's real train_rl log: every train step, every eval,
start and end, and nothing from the thousands of other lines; the tracker's ETA follows the
step rate it has seen."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from tests.support import FIXTURES
from tests.tutorial import RUN
from tpu_grpo.jobs import pipeline, progress
from tpu_grpo.jobs.progress import Completed, Eval, Started, Tracker, TrainStep, parse_line

LOG = FIXTURES / "train_rl.cpu-rehearsal.log"


@pytest.fixture(scope="module")
def raw_lines() -> list[str]:
    """The log's physical lines, with tqdm's carriage returns kept inside them."""
    with LOG.open(newline="") as log:
        return log.read().split("\n")


def after_prefix(line: str) -> str:
    """The message after absl's `file.py:N] `, found without the module's regex."""
    return line.split("] ", 1)[1]


def train_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "peft_trainer.py:" in line and "] Train step " in line]


def eval_lines(lines: list[str]) -> list[str]:
    return [
        line
        for line in lines
        if "] Pre RL Training: " in line or "] Post RL Training: " in line or "] Intermediate Eval (" in line
    ]


def field(text: str, name: str) -> str:
    """`name=value` out of an eval line, by plain string search."""
    return text.split(f" {name}=", 1)[1].split(",", 1)[0].rstrip("%")


def config_param(lines: list[str], name: str) -> str:
    marker = f"] Config param {name}: "
    return next(line.split(marker, 1)[1] for line in lines if marker in line)


def absl_seconds(line: str) -> float:
    """Seconds since midnight from absl's `I1202 14:23:21.073122` (the run stayed in one day)."""
    clock = line.split()[1]
    moment = datetime.strptime(clock, "%H:%M:%S.%f")
    return moment.hour * 3600 + moment.minute * 60 + moment.second + moment.microsecond / 1e6


def test_every_train_step_of_the_real_log(raw_lines):
    lines = train_lines(raw_lines)
    expected = [int(after_prefix(line).split()[2]) for line in lines]
    assert expected == [1, 2, 3, 4]
    events = [parse_line(line) for line in lines]
    assert [e.step for e in events] == expected
    for line, event in zip(lines, events):
        words = after_prefix(line).split()
        assert event == TrainStep(step=int(words[2]), loss=float(words[5]), perplexity=float(words[-1]))
    assert {e.perplexity for e in events} == {1.0}


def test_every_eval_of_the_real_log(raw_lines):
    lines = eval_lines(raw_lines)
    assert len(lines) == 4  # pre, intermediate at steps 2 and 4 (eval_interval 2), post
    events = [parse_line(line) for line in lines]
    assert [e.stage for e in events] == ["pre", "intermediate", "intermediate", "post"]
    assert [e.step for e in events] == [None, 2, 4, None]
    assert int(config_param(raw_lines, "eval_interval")) == 2
    for line, event in zip(lines, events):
        assert isinstance(event, Eval)
        text = " " + after_prefix(line).split(": ", 1)[1]
        assert event.correct == int(field(text, "corr"))
        assert event.total == int(field(text, "total"))
        assert event.accuracy == float(field(text, "accuracy"))
        assert event.partial_accuracy == float(field(text, "partial_accuracy"))
        assert event.format_accuracy == float(field(text, "format_accuracy"))
        assert event.mean_reward == float(field(text, "mean_reward"))
    assert [e.total for e in events] == [4, 4, 4, 4]


def test_start_and_end_and_the_order_of_everything(raw_lines):
    events = progress.parse_lines(raw_lines)
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Eval",
        "Started",
        "TrainStep",
        "TrainStep",
        "Eval",
        "TrainStep",
        "TrainStep",
        "Eval",
        "Completed",
        "Eval",
    ]
    assert parse_line(next(line for line in raw_lines if "Starting RL training" in line)) == Started()
    assert parse_line(next(line for line in raw_lines if "Completed Successfully" in line)) == Completed()


def test_no_event_from_any_other_line(raw_lines):
    wanted = (
        set(train_lines(raw_lines))
        | set(eval_lines(raw_lines))
        | {line for line in raw_lines if "] Starting RL training..." in line or "] RL Training Completed" in line}
    )
    others = [line for line in raw_lines if line not in wanted]
    assert len(others) > 1000
    assert [line for line in others if parse_line(line) is not None] == []


def test_lines_without_the_absl_prefix(raw_lines):
    for line in train_lines(raw_lines) + eval_lines(raw_lines):
        bare = after_prefix(line)
        assert not re.match(r"[IWEF]\d{4} ", bare)
        assert parse_line(bare) == parse_line(line) is not None
        assert parse_line(bare + "\n") == parse_line(line)


def test_tqdm_bar_written_before_the_prefix(raw_lines):
    """The real log has tqdm's bar glued in front of absl lines (`\\r0it [00:00, ?it/s]I1202 ...`)."""
    glued = [line for line in raw_lines if re.match(r"\r\d+it \[", line) and "] " in line]
    assert glued, "the fixture has tqdm-prefixed absl lines"
    bar = glued[0].split("I1202", 1)[0]
    for line in train_lines(raw_lines) + eval_lines(raw_lines):
        assert parse_line(bar + line) == parse_line(line) is not None


def test_malformed_and_unrelated_lines():
    assert parse_line("") is None
    assert parse_line("Pre RL Training: corr=0, total=4") is None
    assert parse_line("Train step x training loss: 0.1  - training perplexity: 1.1") is None
    assert parse_line("I1202 14:22:51.374924 1 pyconfig.py:554] Config param num_batches: 4") is None


def test_total_steps_matches_the_real_run(raw_lines):
    steps = progress.total_steps(
        num_batches=int(config_param(raw_lines, "num_batches")),
        num_iterations=int(config_param(raw_lines, "num_iterations")),
        train_fraction=float(config_param(raw_lines, "train_fraction")),
        num_epochs=int(config_param(raw_lines, "num_epoch")),
    )
    last_step = max(e.step for e in progress.parse_lines(raw_lines) if isinstance(e, TrainStep))
    assert steps == last_step == 4


def test_total_steps_formula():
    assert progress.total_steps(50) == 50
    assert progress.total_steps(4, num_iterations=2, train_fraction=0.5, num_epochs=3) == 12
    assert progress.total_steps(5, train_fraction=0.5) == 2  # truncated, as train_rl.py does


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_tracker_eta_with_a_fake_clock():
    clock = FakeClock(100.0)
    tracker = Tracker(total_steps=10, clock=clock)
    tracker.feed("I1202 14:23:07.531409 1 train_rl.py:730] Starting RL training...")
    assert tracker.started_at == 100.0
    clock.now = 130.0
    tracker.feed("Train step 1 training loss: 0.500000  - training perplexity: 1.648721")
    assert tracker.first_step_at == 130.0
    assert tracker.eta_seconds() is None  # one step gives no rate
    clock.now = 134.0
    tracker.feed("Train step 2 training loss: 0.400000  - training perplexity: 1.491825")
    assert tracker.seconds_per_step() == 4.0  # compile time before step 1 left out
    assert tracker.eta_seconds() == 8 * 4.0
    assert tracker.eta_seconds(now=140.0) == 8 * 4.0 - 6.0
    assert tracker.eta_seconds(now=1000.0) == 0.0
    clock.now = 144.0
    tracker.feed("Train step 4 training loss: 0.300000  - training perplexity: 1.349859")
    assert tracker.seconds_per_step() == 14.0 / 3
    assert tracker.eta_seconds() == pytest.approx(6 * 14.0 / 3)
    assert (tracker.step, tracker.loss) == (4, 0.3)
    tracker.feed("RL Training Completed Successfully!")
    assert tracker.eta_seconds() == 0.0


def test_a_resumed_run_starts_at_its_checkpoint():
    """The training script says which checkpoint MaxText restores; the steps up to it are done."""
    clock = FakeClock(0.0)
    tracker = Tracker(total_steps=8, clock=clock)
    assert tracker.feed(f"{progress.RESUMES} 4") == progress.Resumed(4)
    assert (tracker.step, tracker.fraction, tracker.summary()["resumed_from"]) == (4, 0.5, 4)
    clock.now = 10.0
    tracker.feed("Train step 6 training loss: 0.300000  - training perplexity: 1.349859")
    clock.now = 20.0
    tracker.feed("Train step 8 training loss: 0.200000  - training perplexity: 1.221403")
    assert (tracker.step, tracker.seconds_per_step()) == (8, 5.0)
    assert parse_line(f"{progress.RESUMES} x") is None


def test_tracker_over_the_real_log_at_its_own_timestamps(raw_lines):
    """Fed the real lines at the times absl stamped on them, the ETA is the real step rate."""
    steps = progress.total_steps(int(config_param(raw_lines, "num_batches")))
    tracker = Tracker(total_steps=steps)
    stamped = train_lines(raw_lines)
    times = {int(after_prefix(line).split()[2]): absl_seconds(line) for line in stamped}
    for line in raw_lines:
        now = absl_seconds(line) if re.match(r"[IWEF]\d{4} ", line) else None
        if now is None:
            assert tracker.feed(line, now=0.0) is None
            continue
        event = tracker.feed(line, now=now)
        if isinstance(event, TrainStep) and event.step == 2:
            rate = times[2] - times[1]
            assert tracker.eta_seconds(now) == pytest.approx((steps - 2) * rate)
        if isinstance(event, TrainStep) and event.step == 1:
            assert tracker.eta_seconds(now) is None
    assert tracker.step == 4
    assert tracker.completed and tracker.started
    assert tracker.first_step_at == times[1]
    assert tracker.seconds_per_step() == pytest.approx((times[4] - times[1]) / 3)
    evals = [parse_line(line) for line in eval_lines(raw_lines)]
    assert tracker.evals == evals
    assert tracker.latest_accuracy == evals[-1].accuracy


def test_summary_is_json(raw_lines):
    tracker = Tracker(total_steps=8, clock=FakeClock(5.0))
    for line in raw_lines:
        tracker.feed(line)
    summary = json.loads(json.dumps(tracker.summary()))
    assert summary["step"] == 4
    assert summary["total_steps"] == 8
    assert summary["fraction"] == 0.5
    assert summary["completed"] is True
    assert [e["stage"] for e in summary["evals"]] == ["pre", "intermediate", "intermediate", "post"]
    assert summary["latest_accuracy"] == tracker.evals[-1].accuracy
    assert summary["eta_seconds"] == 0.0  # completed


def test_summary_before_anything():
    summary = Tracker(total_steps=4, clock=FakeClock()).summary()
    assert summary["step"] == 0 and summary["eta_seconds"] is None
    assert summary["latest_accuracy"] is None and summary["evals"] == []
    assert json.dumps(summary)


def test_a_trainings_start_up_phase_by_phase_from_the_real_log(raw_lines):
    """Each phase from its MaxText line to the next's, by the log's own times (compared with absl's clock read by
    plain string search); the compile cache from the script's own line; vLLM's precompilation summed from
    tpu-inference's lines (none in this CPU rehearsal, whose rollout was vLLM-free)."""

    def at(mark: str) -> float:
        return absl_seconds(next(line for line in raw_lines if mark in line))

    cache = "tpu-grpo: compile cache warm: 12 entries, 3456789 bytes, in /home/u/tpu-grpo/compile-cache/v/x"
    found = progress.startup([cache, *raw_lines], 2026)
    first_step = at("] Train step 1 ")
    marks = [
        at(mark)
        for mark in (
            "System Information: Jax Version",
            "Creating reference model",
            "Creating RL cluster",
            "Setting up RL trainer",
            "Starting RL training",
        )
    ]
    assert list(found["phases"]) == ["boot", "weights", "rollout", "eval", "first_step"]
    assert list(found["phases"].values()) == [
        round(end - start, 3) for start, end in zip(marks, [*marks[1:], first_step])
    ]
    assert found["to_first_step"] == round(first_step - marks[0], 3) and found["vllm_compile"] is None
    assert found["cache"] == {
        "warm": True,
        "entries": 12,
        "bytes": 3456789,
        "folder": "/home/u/tpu-grpo/compile-cache/v/x",
    }
    said = progress.startup_text(found)
    assert said.startswith("to first step 0m30s: start 0m00s, weights 0m12s, vLLM start and compile 0m02s, ")
    assert said.endswith("first step 0m13s (compile cache warm)")


def test_vllms_precompilation_is_summed_and_a_start_not_reached_is_absent():
    lines = [
        "INFO 12-05 10:00:00 [compilation_manager.py:236] Precompile all the subgraphs with possible input shapes.",
        "INFO 12-05 10:00:09 [compilation_manager.py:120] Compilation finished in 8.50 [secs].",
        "INFO 12-05 10:00:12 [compilation_manager.py:120] Compilation of sample_from_logits finished in 2.25 [secs].",
        "I1205 10:00:01.000000 1 model_creation_utils.py:751] Creating reference model and also meshes",
        "I1205 10:01:02.500000 1 train_rl.py:498] Creating RL cluster...",
    ]
    found = progress.startup(lines, 2026)
    assert found == {"phases": {"weights": 61.5}, "vllm_compile": 10.75, "to_first_step": None, "cache": None}
    assert progress.startup_text(found) == "weights 1m01s, of which vLLM compiled 0m10s"
    assert progress.startup_text(progress.startup([], 2026)) == ""


@pytest.mark.parametrize(
    "seconds, said",
    [
        (5, "0m05s"),
        (65, "1m05s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3605, "1h00m"),
        (3660, "1h01m"),
        (90061, "25h01m"),
    ],
)
def test_durations_read_hours_and_minutes(seconds, said):
    assert progress.duration(seconds) == said


def test_the_compile_cache_line_is_the_remote_programs(tmp_path):
    """The line the job's script prints (tpu_grpo/host/remote/compile_cache.py, run here as the host runs it) is the
    one status, runs and the model card read: cold and made before the first start, warm once JAX wrote an entry."""
    import subprocess
    import sys

    from tpu_grpo.host import remote

    def run(mode: str) -> tuple[str, dict]:
        done = subprocess.run(
            [
                "bash",
                "-c",
                remote.run(
                    "compile_cache",
                    {"root": str(tmp_path / "caches"), "named": "m/model/train-1", "mode": mode},
                    python=sys.executable,
                ),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip(), progress.compile_cache(done.stderr)

    folder, said = run("look")
    assert said == {"warm": False, "entries": 0, "bytes": 0, "folder": folder} and not (tmp_path / "caches").exists()
    assert folder.startswith(f"{tmp_path}/caches/maxtext-") and folder.endswith("/m/model/train-1")
    assert "_jax-" in folder and "_jaxlib-" in folder and "_libtpu-" in folder
    assert run("make") == (folder, said) and (tmp_path / folder).is_dir()
    (tmp_path / folder / "jit_step-abc123-cache").write_bytes(b"x" * 1000)
    (tmp_path / folder / "jit_step-abc123-atime").write_bytes(b"t" * 8)  # JAX's access time: no entry
    assert run("look") == (folder, {"warm": True, "entries": 1, "bytes": 1000, "folder": folder})


def intermediate(step: int, accuracy: float) -> str:
    """An intermediate evaluation's line as MaxText 0.2.3's hooks.py:98 logs it (absl prefix and all)."""
    return (
        f"W1202 14:23:21.662907 140671093824384 hooks.py:98] Intermediate Eval (step={step}): corr=1, total=4, "
        f"accuracy={accuracy}%, partial_accuracy={accuracy}%, format_accuracy=50.0%, mean_reward=0.5000"
    )


def test_the_best_checkpoint_is_the_peak_of_the_scores_not_the_last():
    events = progress.parse_lines([intermediate(10, 40.0), intermediate(20, 62.5), intermediate(30, 50.0)])
    found = progress.best(events, [10, 20, 30])
    assert found is not None and (found.step, found.accuracy) == (20, 62.5)


def test_a_tie_goes_to_the_earlier_step_and_only_saved_steps_count():
    events = progress.parse_lines([intermediate(10, 50.0), intermediate(20, 70.0), intermediate(30, 70.0)])
    assert progress.best(events, [10, 20, 30]).step == 20  # type: ignore[union-attr]
    assert progress.best(events, [10, 30]).step == 30  # type: ignore[union-attr]  # step 20's checkpoint is gone
    assert progress.best(events, [5]) is None
    assert progress.best(events, [40, 60], iterations=2).step == 20  # type: ignore[union-attr]  # batch 20: train step 40


def test_the_choice_never_reads_the_report_examples_score():
    """An export's report evaluation (its own log: the report line, then train_rl's Pre RL Training on the report
    examples) scores 100% here; the choice among checkpoints is still the training's own best, and the report is read
    as the chosen checkpoint's score."""
    export_log = [
        f"{progress.REPORT_LINE} 10 on test examples 10 to 20",
        "W1202 14:30:00.000000 1 train_rl.py:716] Pre RL Training: corr=4, total=4, accuracy=100.0%, "
        "partial_accuracy=100.0%, format_accuracy=100.0%, mean_reward=1.0000",
    ]
    lines = [intermediate(10, 40.0), intermediate(20, 30.0), *export_log]
    chosen = pipeline.best_of(RUN, lines, [10, 20])
    assert chosen.scored_step == 10 and chosen.export_step == 10
    reported = progress.report(lines)
    assert reported and (reported.step, reported.start, reported.stop, reported.score.accuracy) == (10, 10, 20, 100.0)


def test_a_failed_intermediate_eval_is_shown_as_such_and_never_chosen():
    """hooks.py:104 logs `[intermediate-eval] step=N failed: {e!r}` and training goes on."""
    failed = "W1202 14:23:21.7 1 hooks.py:104] [intermediate-eval] step=20 failed: RuntimeError('vLLM went away')"
    events = progress.parse_lines([intermediate(10, 30.0), failed])
    assert events[1] == progress.EvalFailed(20, "RuntimeError('vLLM went away')")
    assert progress.best(events, [10, 20]).step == 10  # type: ignore[union-attr]
    tracker = progress.Tracker(20)
    tracker.feed(failed, now=0.0)
    assert tracker.failed_evals == [events[1]] and tracker.evals == []


def test_the_real_logs_intermediate_evals_score_its_checkpoints(raw_lines):
    """The recorded MaxText 0.2.3 run (4 batches, checkpoint_period 2, eval_interval 2): steps 2 and 4 scored, all
    0% with the stand-in's rollout, so the earlier wins."""
    events = progress.parse_lines(raw_lines)
    scored = [e.step for e in events if isinstance(e, progress.Eval) and e.stage == "intermediate"]
    assert scored == [2, 4]
    assert progress.best(events, [1, 2, 4]).step == 2  # type: ignore[union-attr]


def test_status_says_the_best_scored_batch_so_far():
    tracker = progress.Tracker(30)
    for line in (intermediate(10, 40.0), intermediate(20, 62.5), intermediate(30, 62.5)):
        tracker.feed(line, now=0.0)
    best = tracker.summary(now=0.0)["best"]
    assert (best["step"], best["accuracy"]) == (20, 62.5)
    assert progress.Tracker(30).summary(now=0.0)["best"] is None

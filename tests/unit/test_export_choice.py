"""The export's run and checkpoint, chosen once for both targets (tpu_grpo/jobs/pipeline.py's export_choice) over what
a target gives it: its finished trainings, a run's training log, the checkpoints in its store."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.tutorial import RUN
from tpu_grpo.config.errors import BadFlag, NotReady
from tpu_grpo.jobs import pipeline

ASKED = replace(RUN, run_name=None)  # `invoke export` with no --run-name
TRAINED = replace(RUN, run_name="peak", batches=50)
ABSL = "I1206 20:35:10.347785 139769738177408 hooks.py:98] "


def evaluation(batch: int, accuracy: float) -> str:
    return (
        f"{ABSL}Intermediate Eval (step={batch}): corr=1, total=4, accuracy={accuracy}%, partial_accuracy=0.0%, "
        "format_accuracy=0.0%, mean_reward=0.0000"
    )


def choose(run, trained, lines=(), steps=(10, 20, 50)):
    return pipeline.export_choice(run, trained, lambda name: list(lines), lambda chosen: list(steps), "on this host")


def test_the_newest_trained_run_at_the_checkpoint_its_evaluations_scored_best():
    older = replace(TRAINED, run_name="older")
    chosen = choose(ASKED, [("older", older), ("peak", TRAINED)], [evaluation(10, 25.0), evaluation(20, 75.0)])
    assert (chosen.run_name, chosen.export_step, chosen.scored_step) == ("peak", 20, 20)
    assert choose(replace(ASKED, last=True), [("peak", TRAINED)], [evaluation(20, 75.0)]).export_step == 50
    assert choose(replace(ASKED, step=10), [("peak", TRAINED)], [evaluation(20, 75.0)]).export_step == 10
    assert choose(ASKED, [("peak", TRAINED)], ["no evaluation"]).export_step == 50  # none scored: the last


def test_a_training_recorded_before_whole_records_exports_its_newest_checkpoint():
    chosen = choose(ASKED, [("old", None)], [evaluation(10, 99.0)], steps=(10, 30))
    assert (chosen.run_name, chosen.export_step) == ("old", 30)


def test_nothing_trained_and_a_missing_checkpoint_are_refused_with_the_fix():
    with pytest.raises(NotReady) as nothing:
        choose(replace(ASKED, run_name="nope"), [("peak", TRAINED)])
    assert str(nothing.value) == (
        "no finished training for run 'nope' on this host; fix: uv run invoke train --batches 50 (or name a trained "
        "run: uv run invoke status)"
    )
    with pytest.raises(BadFlag) as missing:
        choose(replace(ASKED, step=40), [("peak", TRAINED)])
    assert str(missing.value).endswith("/peak/checkpoints/actor; it has: 10, 20, 50; fix: --step 50")
    with pytest.raises(BadFlag) as emptied:
        choose(ASKED, [("peak", TRAINED)], steps=())
    assert str(emptied.value).endswith("it has: none (was /dev/shm cleared by a restart?); fix: --step N")
    bucket = replace(TRAINED, store=replace(TRAINED.store, name="gs", root="gs://b/runs"))
    with pytest.raises(BadFlag) as empty_bucket:
        choose(ASKED, [("peak", bucket)], steps=())
    assert str(empty_bucket.value).endswith("it has: none; fix: --step N")

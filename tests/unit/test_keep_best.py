"""The training's keeper (tpu_grpo/host/remote/keep_best.py), run by bash as the train script runs it, fed a trainer's
output while checkpoints come and go as the checkpoint manager makes and deletes them: every byte passes through, and
the best scored checkpoint (progress.best's choice) is kept, hard-linked, whatever the manager deleted."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tutorial import RUN
from tpu_grpo.catalog.stores import store_for
from tpu_grpo.host import remote
from tpu_grpo.jobs import maxtext, progress

ABSL = "W1206 20:35:10.347785 139769738177408 hooks.py:98] "


def eval_line(batch: int, accuracy: float) -> str:
    return (
        f"{ABSL}Intermediate Eval (step={batch}): corr=1, total=4, accuracy={accuracy}%, partial_accuracy=0.0%, "
        "format_accuracy=0.0%, mean_reward=0.0000"
    )


def trainer(actor: Path, out: Path, scores: list[float], keep: int, first: int = 1, iterations: int = 1) -> str:
    """Bash standing in for train_rl: each batch's checkpoint written at its last train step (batch x `iterations`,
    rl.num_iterations; the oldest beyond `keep` deleted, as Orbax's max_to_keep does), then its intermediate
    evaluation printed, numbered by its batch as MaxText numbers it; the next batch starts once the keeper has passed
    that line on to `out` (a real batch takes minutes: the keeper links a written checkpoint before it passes the
    line)."""
    lines = []
    for batch, accuracy in enumerate(scores, start=first):
        step = batch * iterations
        lines += [
            f"mkdir -p {actor}/{step}.tmp/model_params && echo {step} > {actor}/{step}.tmp/model_params/w",
            f"mv {actor}/{step}.tmp {actor}/{step}",
            f"rm -rf {actor}/{(batch - keep) * iterations}" if batch > keep else "true",
            f"echo '{eval_line(batch, accuracy)}'",
            f"until grep -q 'step={batch})' {out}; do sleep 0.01; done",
        ]
    return "{\n" + "\n".join(lines) + "\necho 'RL Training Completed Successfully!'\n}"


def run_keeper(folder: Path, scores: list[float], keep: int = 1, first: int = 1) -> subprocess.CompletedProcess:
    (folder / "kept").mkdir(parents=True, exist_ok=True)
    data = {
        "checkpoints": str(folder / "actor"),
        "kept": str(folder / "kept"),
        "iterations": 1,
        "period": 1,
        "last": first + len(scores) - 1,
        "pattern": progress.EVAL.pattern,
        "field": progress.EVAL_FIELD.pattern,
    }
    written, command = remote.filter_into("keep_best", data, "keeper")
    bash = trainer(folder / "actor", folder / "out", scores, keep, first)
    script = f"set -eo pipefail\n{written}\n{bash} 2>&1 | {command} > {folder}/out\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    return subprocess.CompletedProcess(done.args, done.returncode, (folder / "out").read_text(), done.stderr)


def test_the_best_checkpoint_outlives_the_managers_deletion_and_the_output_passes_whole(tmp_path):
    done = run_keeper(tmp_path, [10.0, 50.0, 50.0, 20.0], keep=1)
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    own = [line for line in said if line.startswith("tpu-grpo: keeps checkpoint")]
    assert [line for line in said if line not in own] == [
        *(eval_line(batch, accuracy) for batch, accuracy in enumerate([10.0, 50.0, 50.0, 20.0], start=1)),
        "RL Training Completed Successfully!",
    ]
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["2"]  # the earlier of the two best
    assert (tmp_path / "kept/2/model_params/w").read_text() == "2\n"
    assert sorted(p.name for p in (tmp_path / "actor").iterdir()) == ["4"]  # what the manager kept
    assert own[-1] == f"tpu-grpo: keeps checkpoint 2, the best scored so far, in {tmp_path / 'kept'}"


def test_a_resumed_training_keeps_the_earlier_best_until_a_later_one_beats_it(tmp_path):
    """A resumed run's job starts a new keeper: it reads what the earlier one kept and its score, so a tie later does
    not replace it (the earlier wins, as progress.best reads both jobs' logs), and a higher score does."""
    run_keeper(tmp_path, [50.0, 10.0], keep=1)
    (tmp_path / "out").unlink()
    again = run_keeper(tmp_path, [0.0, 0.0, 50.0], keep=1, first=3)  # batches 3, 4 and 5 of the same run
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["1"]
    (tmp_path / "out").unlink()
    run_keeper(tmp_path, [75.0], keep=1, first=6)
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["6"]
    assert (tmp_path / "kept/6/accuracy").read_text() == "75.0\n"


def test_the_steps_an_export_can_convert_include_the_kept_one(tmp_path):
    """pipeline.Checkpoints lists the manager's folder and the kept one, as checkpoint_steps reads them."""
    from tpu_grpo.host import facts
    from tpu_grpo.jobs import pipeline

    run_keeper(tmp_path, [80.0, 10.0, 20.0], keep=1)
    script = pipeline.Checkpoints.script(str(tmp_path / "actor"), str(tmp_path / "kept"))
    answer = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert pipeline.Checkpoints.parse(facts.Answer(answer.stdout), "") == [1, 3]


def test_the_train_script_pipes_the_training_through_the_keeper_on_one_vm_only():
    train = maxtext.script(RUN, "train")
    assert "2>&1 | TPU_GRPO_INPUT=" in train and 'python3 "$keeper"' in train
    assert "keep_best" not in maxtext.script(RUN, "train", maxtext.Placement(pod=True))
    export = maxtext.script(RUN, "export")
    kept = '"$BASE_OUTPUT_DIRECTORY/$RUN_NAME/kept/50/model_params"'
    assert f'[ -d "$POST_TRAIN_PATH" ] || [ ! -d {kept} ] || POST_TRAIN_PATH={kept}' in export


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([0.0, 12.5, 25.0, 50.0, 100.0]), min_size=1, max_size=6), st.integers(1, 3))
def test_what_is_kept_is_what_progress_best_chooses(tmp_path_factory, scores, keep):
    """An independent oracle: progress.best over every evaluation (each with a checkpoint) names the step kept."""
    folder = tmp_path_factory.mktemp("run")
    done = run_keeper(folder, scores, keep)
    assert done.returncode == 0, done.stderr
    events = progress.parse_lines(eval_line(batch, accuracy) for batch, accuracy in enumerate(scores, start=1))
    best = progress.best(events, range(1, len(scores) + 1))
    assert best is not None
    assert [p.name for p in (folder / "kept").iterdir()] == [str(best.step)]


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_a_disk_stores_keeper_keeps_the_train_step_its_best_evaluation_scored(tmp_path, iterations):
    """The keeper as the train script writes it (maxtext.keeper_lines) for a run on the data disk (the `disk` store,
    its folders under the home) with rl.num_iterations `iterations`: MaxText numbers an intermediate evaluation by its
    batch N (its outer step) and the checkpoint of its weights by train step N x iterations, and that checkpoint is the
    one kept; the outer step's number names older weights, or none, and the manager then deletes the best."""
    scores = [25.0, 75.0, 50.0]  # the best after batch 2, train step 2 x iterations
    run = replace(
        RUN,
        store=store_for("disk"),
        batches=len(scores),
        checkpoint_period=iterations,  # a checkpoint every batch, each evaluated (Run.eval_interval)
        checkpoints_to_keep=1,
        sets={"train": {"rl.num_iterations": str(iterations)}},
    )
    written, command = maxtext.keeper_lines(run, maxtext.VM)
    checkpoints, kept = (
        Path(maxtext.paths(run)[name].replace("~", str(tmp_path), 1)) for name in ("checkpoints", "kept")
    )
    bash = trainer(checkpoints, tmp_path / "out", scores, keep=1, iterations=iterations)
    script = f"set -eo pipefail\n{chr(10).join(written)}\n{bash} 2>&1 | {command} > {tmp_path}/out\n"
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)}
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in kept.iterdir()] == [str(2 * iterations)]
    assert (kept / str(2 * iterations) / "model_params/w").read_text() == f"{2 * iterations}\n"
    assert sorted(p.name for p in checkpoints.iterdir()) == [str(3 * iterations)]  # what the manager kept

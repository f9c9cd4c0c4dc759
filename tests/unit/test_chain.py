"""A pipeline's chain (tpu_grpo/host/remote/chain.py), the host's own driver of its steps: it chooses the export's
checkpoint as the laptop's progress.best does, the export and save it then runs are what the laptop renders for that
step, and run by bash and Python for real (no SSH: the host tier runs it over one), it runs each step as a job of
its own, skips what is done and stops at a failed step."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tutorial import RUN
from tpu_grpo.host.remote import chain
from tpu_grpo.jobs import pipeline, progress

ABSL = "I1206 20:35:10.347785 139769738177408 hooks.py:98] "
NAMED = RUN.named("peak")
TWICE = replace(NAMED, sets={**NAMED.sets, "train": {**NAMED.sets.get("train", {}), "rl.num_iterations": "2"}})


def eval_line(batch: int, accuracy: str, corr: str = "1") -> str:
    return (
        f"{ABSL}Intermediate Eval (step={batch}): corr={corr}, total=4, accuracy={accuracy}%, "
        "partial_accuracy=0.0%, format_accuracy=0.0%, mean_reward=0.0000"
    )


@pytest.mark.parametrize("run", [NAMED, TWICE], ids=["one-iteration", "two-iterations"])
@pytest.mark.parametrize("keep_checkpoint", [False, True])
def test_the_export_and_save_of_a_chosen_step_are_what_the_laptop_renders_for_it(run, keep_checkpoint):
    """Every checkpoint step the training can write, the last among them: the stand-in replaced gives the export's
    and the save's script, job.json, done-record and done-test the laptop gives a run that scored that step."""
    data = json.loads(json.dumps(pipeline.chain_data(run, keep_checkpoint)))
    steps = range(run.checkpoint_period, run.train_steps + 1, run.checkpoint_period)
    assert run.train_steps in steps and len(steps) > 2
    for step in steps:
        scored = replace(run, scored_step=step)
        wanted = [pipeline.chain_step(scored, name, keep_checkpoint) for name in ("export", "save")]
        assert chain.variant(data, step) == json.loads(json.dumps(wanted)), step
    unscored = [pipeline.chain_step(run, name, keep_checkpoint) for name in ("export", "save")]
    assert chain.variant(data, None) == json.loads(json.dumps(unscored))
    assert str(pipeline.SENTINEL) not in json.dumps(unscored)  # the stand-in means nothing else


def test_an_export_whose_step_is_asked_has_no_stand_in():
    data = pipeline.chain_data(replace(NAMED, last=True), False)
    assert list(data["variants"]) == ["last"] and chain.variant(data, None)[0]["meta"]["inputs"]["step"] == 50


ACCURACY = st.sampled_from(["0.0", "25.0", "50.0", "50", "75.5", "1e2", "x", ""])
LINE = st.one_of(
    st.builds(eval_line, st.integers(0, 12), ACCURACY, st.sampled_from(["1", "one", "2"])),
    st.builds(lambda batch, accuracy: eval_line(batch, accuracy).replace(ABSL, ""), st.integers(0, 12), ACCURACY),
    st.builds(lambda batch: eval_line(batch, "10").replace(", mean_reward=0.0000", ""), st.integers(0, 12)),
    st.sampled_from(
        [
            f"{ABSL}Pre RL Training: corr=1, total=4, accuracy=99.0%, partial_accuracy=0.0%, "
            "format_accuracy=0.0%, mean_reward=0.0",
            f"{ABSL}Train step 3 training loss: 0.1 - training perplexity: 1.1",
            "noise",
        ]
    ),
    st.text(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(LINE, max_size=14),
    checkpoints=st.sets(st.integers(0, 24), max_size=8),
    iterations=st.sampled_from([1, 2]),
)
def test_the_host_chooses_the_checkpoint_the_laptop_would(lines, checkpoints, iterations):
    """Over raw log text, evaluations well and badly formed among other lines: the host's choice is the laptop's
    (progress.best over the parsed lines, then its scored step; none when the best is the step before training)."""
    found = progress.best(progress.parse_lines(lines), checkpoints, iterations)
    laptop = progress.scored_step(found, iterations) if found and found.step else None
    choose = pipeline.chain_data(NAMED, False)["choose"] | {"iterations": iterations}
    assert chain.best_step(lines, checkpoints, choose) == laptop


def step(name: str, script: str, test: str = "false", record: str = "", when_done: str = "") -> dict:
    meta = {"step": name, "run": "r", "inputs": {"x": name}}
    return {"name": name, "script": script, "meta": meta, "record": record, "test": test, "when_done": when_done}


def run_chain(tmp_path: Path, steps: list[dict], variants: dict, choose: dict | None = None) -> tuple[int, list[str]]:
    """chain.py as the chain's job runs it: from a file beside it, in a folder of the jobs' folder."""
    jobs = tmp_path / "jobs"
    folder = jobs / "20261207-000000.000-pipeline"
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "jobs": str(jobs),
        "done": str(tmp_path / "done"),
        "root": str(tmp_path),
        "wrapper": (Path(chain.__file__).parent / "job_wrapper.sh").read_text(),
        "sentinel": pipeline.SENTINEL,
        "steps": steps,
        "variants": variants,
        "choose": choose or {"run": "nobody", "list": "true"},
    }
    (folder / "chain.json").write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, chain.__file__, str(folder / "chain.json")], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout.splitlines()


def job_folders(tmp_path: Path) -> list[Path]:
    return sorted(path for path in (tmp_path / "jobs").iterdir() if not path.name.endswith("-pipeline"))


def test_each_step_is_a_job_of_its_own_recorded_as_a_step_started_alone(tmp_path):
    code, lines = run_chain(
        tmp_path,
        [step("convert", "echo converting", record="convert-1"), step("train", "echo training")],
        {"last": [step("export", "echo exporting", record="export-2"), step("save", "echo saving")]},
    )
    assert code == 0
    folders = job_folders(tmp_path)
    assert [folder.name.rsplit("-", 1)[1] for folder in folders] == ["convert", "train", "export", "save"]
    assert [line.split()[2:4] for line in lines if " job " in line] == [
        ["convert", "job"],
        ["train", "job"],
        ["export", "job"],
        ["save", "job"],
    ]
    for folder, said in zip(folders, ["converting", "training", "exporting", "saving"]):
        assert (folder / "log").read_text() == f"{said}\n" and (folder / "exit_code").read_text() == "0\n"
        meta = json.loads((folder / "job.json").read_text())
        assert meta["chain"] == "20261207-000000.000-pipeline" and meta["inputs"] == {"x": meta["step"]}
    assert sorted(path.name for path in (tmp_path / "done").iterdir()) == ["convert-1", "export-2"]
    assert (tmp_path / "current").read_text().strip() == folders[-1].name


def test_steps_before_the_last_done_one_are_skipped_and_a_failed_step_stops_the_chain(tmp_path):
    code, lines = run_chain(
        tmp_path,
        [step("convert", "echo never"), step("train", "echo never", test="true")],
        {"last": [step("export", "echo half; exit 3"), step("save", "echo never")]},
    )
    assert code == 3
    assert lines[:2] == ["tpu-grpo pipeline: convert skipped", "tpu-grpo pipeline: train done"]
    assert lines[-1] == "tpu-grpo pipeline: export exit 3"
    [export] = job_folders(tmp_path)
    assert export.name.endswith("-export") and (export / "log").read_text() == "half\n"


def test_a_step_that_runs_even_when_done_runs_its_other_command(tmp_path):
    code, lines = run_chain(
        tmp_path,
        [step("convert", "echo never", test="true"), step("train", "echo never", test="true")],
        {"last": [step("export", "echo never", test="true"), step("save", "echo anew", "true", when_done="echo kept")]},
    )
    assert code == 0 and lines[:3] == [f"tpu-grpo pipeline: {name} done" for name in ("convert", "train", "export")]
    [save] = job_folders(tmp_path)
    assert (save / "log").read_text() == "kept\n"


def test_after_the_training_its_scores_choose_the_export(tmp_path):
    """The training writes its log; the export then runs the "best" variant with the step its scores chose, named by
    its inputs as the laptop names it."""
    log = "\n".join([eval_line(1, "25.0"), eval_line(2, "50.0"), eval_line(3, "50.0")])
    best = [
        {
            **step("export", f"echo export {pipeline.SENTINEL}", record="export-old"),
            "meta": {"step": "export", "run": "r", "key": "export-old", "inputs": {"step": pipeline.SENTINEL}},
        },
        step("save", f"echo save {pipeline.SENTINEL} export-old"),
    ]
    code, lines = run_chain(
        tmp_path,
        [step("convert", "echo c"), {**step("train", f"echo '{log}'"), "meta": {"step": "train", "run": "r"}}],
        {"last": [step("export", "echo last"), step("save", "echo last")], "best": best},
        {"run": "r", "list": "printf '1\\n2\\n3\\n'"}
        | {
            key: value
            for key, value in pipeline.chain_data(NAMED, False)["choose"].items()
            if key not in ("run", "list")
        },
    )
    assert code == 0, lines
    export, save = job_folders(tmp_path)[2:]
    key = "export-" + hashlib.sha256(json.dumps({"step": 2}).encode()).hexdigest()[:12]  # as pipeline.record_key
    assert (export / "log").read_text() == "export 2\n"  # 2 and 3 scored alike: the earlier
    assert json.loads((export / "job.json").read_text())["inputs"] == {"step": 2}
    assert json.loads((export / "job.json").read_text())["key"] == key
    assert (save / "log").read_text() == f"save 2 {key}\n"
    assert (tmp_path / "done" / key).exists()

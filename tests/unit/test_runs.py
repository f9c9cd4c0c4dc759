"""`invoke runs` without a host: a run's row from its jobs (cost at the capacity's price), the laptop's fetched
copies, and a host that does not answer. The host's own answers are parsed in tests/unit/test_facts.py
(tests/facts/host_runs); the whole task runs against a throwaway host in tests/host/test_runs.py."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.tutorial import RUN
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.host import hosts
from tpu_grpo.jobs import vm_jobs
from tpu_grpo.results import runs

PRE = "I1202 14:23:07.528425 1 train_rl.py:716] Pre RL Training: corr=1, total=4, accuracy=25.0%, partial_accuracy=25.0%, format_accuracy=100.0%, mean_reward=0.5"  # noqa: E501
POST = "I1202 14:24:07.528425 1 train_rl.py:760] Post RL Training: corr=3, total=4, accuracy=75.0%, partial_accuracy=75.0%, format_accuracy=100.0%, mean_reward=1.5"  # noqa: E501


def job(step: str, started: float, finished: float, capacity: str = "spot", code: int = 0) -> vm_jobs.Job:
    meta = {"step": step, "run": "r1", "capacity": capacity, "inputs": RUN.inputs(step), "total_steps": 50}
    return vm_jobs.Job(f"2026-{step}", step, "r1", "finished", code, started, finished, 0, meta)


def test_a_runs_row_adds_its_jobs_hours_and_prices_its_chip_hours_at_its_capacity():
    row = runs.RunRow("r1")
    runs._add_job(row, job("convert", 0, 1800), [])
    assert row.state == "converted"
    runs._add_job(row, job("train", 1800, 1800 + 3 * 3600), [PRE, POST])
    assert (row.job_hours, row.chips, row.chip_hours) == (3.5, 8, 28.0)  # a ct6e-standard-8t: 8 chips
    assert row.cost_usd == round(28.0 * CAPACITIES["spot"].usd_per_chip_hour, 2)
    assert (row.state, row.accuracy_before, row.accuracy_after, row.total_steps) == ("trained", 25.0, 75.0, 50)
    assert (row.model, row.dataset, row.loss, row.batches) == ("llama3.1-8b-Instruct", "openai/gsm8k", "grpo", 50)
    runs._add_job(row, job("export", 12600, 12900), [])
    assert row.state == "exported"


def test_a_failed_training_is_said_failed():
    row = runs.RunRow("r1")
    runs._add_job(row, job("train", 0, 60, code=3), [PRE])
    assert (row.state, row.accuracy_before, row.accuracy_after) == ("failed", 25.0, None)


def test_the_laptops_copies_answer_when_the_host_does_not(tmp_path):
    model = tmp_path / "models" / "r1"
    model.mkdir(parents=True)
    (tmp_path / "fetched").mkdir()
    (tmp_path / "fetched" / "r1.json").write_text(json.dumps({"run": "r1", "dir": str(model)}))
    (tmp_path / "fetched" / "gone.json").write_text(json.dumps({"run": "gone", "dir": str(tmp_path / "deleted")}))

    def unreachable():
        raise hosts.ConnectError("tpu@203.0.113.9: cannot connect (timed out); fix: is the VM up?")

    rows, sources = runs.gather(unreachable, tmp_path)
    assert [(row.run, row.state, row.where) for row in rows] == [("r1", "fetched", [f"laptop: {model}"])]
    assert sources == {
        "host": "no answer: tpu@203.0.113.9: cannot connect (timed out); fix: is the VM up?",
        "laptop": "answered",
    }


def test_a_run_this_laptop_published_says_where_on_the_hub(tmp_path):
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "r1.json").write_text(
        json.dumps(
            {"run": "r1", "repo": "you/Llama-GRPO", "url": "https://huggingface.co/you/Llama-GRPO", "commit": "abc"}
        )
    )
    rows = {"r1": runs.RunRow("r1", state="saved", where=["host: ~/tpu-grpo/models/r1"])}
    runs.add_laptops(rows, tmp_path)
    assert (rows["r1"].state, rows["r1"].where) == (
        "published",
        ["host: ~/tpu-grpo/models/r1", "hub: https://huggingface.co/you/Llama-GRPO"],
    )


def test_a_bucket_store_answers_with_each_runs_steps_and_export_when_the_host_does_not(bucket, tmp_path):
    """One listing of the store's post-train folder (the Cloud Storage emulator): runs, their newest checkpoint,
    their export; with the host gone, the table still has them."""
    from google.cloud import storage

    folder = f"gs://{bucket}/runs/llama3.1-8b-Instruct/post-train"
    client = storage.Client().bucket(bucket)
    for name in (
        "r1/checkpoints/actor/2/model_params/x",
        "r1/checkpoints/actor/2/commit_success.txt",
        "r1/checkpoints/actor/4/model_params/x",
        "r1/checkpoints/actor/4/commit_success.txt",
        "r1/checkpoints/actor/6/model_params/x",  # a save into gs:// cut short (no commit_success.txt): no step
        "r1/hf-trained/config.json",
        "r1/tensorboard/events.out.tfevents.1",
        "r2/checkpoints/actor/1/x",
        "r2/checkpoints/actor/1/commit_success.txt",
    ):
        client.blob(f"runs/llama3.1-8b-Instruct/post-train/{name}").upload_from_string(b"x")

    def unreachable():
        raise hosts.ConnectError("tpu@203.0.113.9: cannot connect (timed out)")

    rows, sources = runs.gather(unreachable, tmp_path, folder)
    assert sorted((row.run, row.state, row.steps, row.where) for row in rows) == [
        ("r1", "exported", 4, [f"bucket: {folder}/r1/hf-trained"]),
        ("r2", "trained", 1, []),
    ]
    assert sources == {
        "host": "no answer: tpu@203.0.113.9: cannot connect (timed out)",
        "bucket": "answered",
        "laptop": "answered",
    }
    _, missing = runs.gather(unreachable, tmp_path, "gs://no-such-bucket-here/runs/m/post-train")
    assert missing["bucket"].startswith("no answer: cannot list gs://no-such-bucket-here/")


def test_a_run_trained_in_two_jobs_is_scored_before_by_its_first_and_after_by_its_last():
    """A resumed run: its accuracy before training is the first job's evaluation of the converted model (the second
    job's evaluates a model already trained), after is the last job's."""
    later = PRE.replace("corr=1", "corr=2").replace("accuracy=25.0%", "accuracy=50.0%")
    row = runs.RunRow("r1")
    runs._add_job(row, job("train", 0, 600), [PRE])
    runs._add_job(row, job("train", 700, 1300), [later, POST])
    assert (row.accuracy_before, row.accuracy_after) == (25.0, 75.0)


@pytest.mark.parametrize(
    "state, code", [("finished", 1), ("failed", 1), ("running", None), ("cancelled", None), ("lost", None)]
)
def test_only_an_export_that_finished_well_makes_a_run_exported(state, code):
    row = runs.RunRow("r1")
    runs._add_job(row, job("train", 0, 600), [PRE, POST])
    export = job("export", 700, 800, code=code or 0)
    runs._add_job(row, vm_jobs.Job(export.id, "export", "r1", state, code, 700.0, 800.0, 0, export.meta), [])
    assert row.state == "trained"


def test_runs_are_listed_newest_first_and_runs_of_no_known_start_last():
    rows = [
        runs.RunRow("b", started=100.0),
        runs.RunRow("fetched-only"),
        runs.RunRow("a", started=300.0),
        runs.RunRow("c", started=200.0),
    ]
    assert [row.run for row in runs.newest_first(rows)] == ["a", "c", "b", "fetched-only"]


def test_a_runs_steps_in_the_bucket_are_its_newest_checkpoint_as_a_number(bucket):
    """The bucket lists names as text ("10" before "2"): the steps are 10."""
    from google.cloud import storage

    client = storage.Client().bucket(bucket)
    for step in (2, 10, 4):
        client.blob(f"runs/m/post-train/r1/checkpoints/actor/{step}/model_params/x").upload_from_string(b"x")
        client.blob(f"runs/m/post-train/r1/checkpoints/actor/{step}/commit_success.txt").upload_from_string(b"x")
    [row] = runs.bucket_runs(f"gs://{bucket}/runs/m/post-train")
    assert (row.run, row.steps, row.state) == ("r1", 10, "trained")


def test_runs_on_a_vm_are_newest_first_from_what_the_host_answered(tmp_path, monkeypatch):
    """The host's recorded answer (tests/facts/runs.HostRuns: `saved`'s pipeline, then `failed`, then `only-trained`),
    through gather: the newest run first."""
    from tests.support import ROOT
    from tpu_grpo.host import facts

    case = json.loads((ROOT / "tests/facts/runs.HostRuns/saved-failed-and-trained.json").read_text())
    fact = runs.HostRuns

    class Recorded:
        """HostRuns answering what the host answered when it was recorded."""

        @staticmethod
        def read(connection):
            return fact.parse(facts.Answer(case["stdout"], case["stderr"], case["exited"]))

    monkeypatch.setattr(runs, "HostRuns", Recorded)
    rows, sources = runs.gather(lambda: None, tmp_path)
    assert [row.run for row in rows] == ["only-trained", "failed", "saved"] and sources["host"] == "answered"


@pytest.mark.parametrize("answer", ["nothing", "unsaved", "no answer"])
def test_up_and_down_keep_what_only_the_data_disk_holds(answer):
    """One guard for both: a change that deletes the data disk goes ahead only when the VM answers that nothing is
    only there; a run only there, or a VM that does not answer, is refused (exit 1) with the doing's own fix."""
    from tpu_grpo.host.hosts import ConnectError
    from tpu_grpo.results import sources

    class Answering:
        def unsaved(self):
            if answer == "no answer":
                raise ConnectError("u@h: cannot connect (timed out)")
            return ["run r1: trained, not saved; save it: uv run invoke pipeline --run-name r1"] * (answer == "unsaved")

    def guard():
        sources.keep_what_only_the_data_disk_holds(Answering(), "dev", "destroy", "", "FIX-UNKNOWN", "FIX-UNSAVED")

    if answer == "nothing":
        guard()
        return
    with pytest.raises(sources.DataDiskAtRisk) as refused:
        guard()
    assert refused.value.exit_code == 1
    said = str(refused.value)
    assert said.startswith("refusing to destroy stack 'dev': ")
    if answer == "unsaved":
        assert "\n  - run r1: trained" in said and said.endswith("\nfix: FIX-UNSAVED")
    else:
        assert "(u@h: cannot connect (timed out)); fix: FIX-UNKNOWN" in said


def test_runs_say_the_best_scored_batch_and_hold_the_curve():
    """The recorded host (tests/facts/runs.HostRuns): each training's intermediate evaluations after batches 2 and 4,
    0% with the stand-in's rollout, so the best is the earlier; --json holds the curve."""
    import json as json_module

    from tests.unit.test_facts import RECORDED
    from tpu_grpo.host import facts
    from tpu_grpo.results import runs

    case = json_module.loads((RECORDED / "runs.HostRuns" / "saved-failed-and-trained.json").read_text())
    rows = {row.run: row for row in runs.HostRuns.parse(facts.Answer(case["stdout"], case["stderr"], case["exited"]))}
    saved = rows["saved"]
    assert [point.step for point in saved.curve] == [2, 4]
    assert (saved.best_batch, saved.best_accuracy) == (2, 0.0)
    # the evaluations before and after training, read from the answer (a parse that lost them fails here, whatever
    # the recording says)
    assert (saved.accuracy_before, saved.accuracy_after) == (0.0, 0.0)
    assert saved.to_json()["curve"][0]["accuracy"] == 0.0
    # its export scored the checkpoint it converted on the report examples, after the 10 that chose it
    assert saved.report is not None and (saved.report.step, saved.report.start, saved.report.stop) == (4, 10, 20)
    assert saved.report.score is not None and saved.report.score.total == 4
    assert rows["only-trained"].report is None  # not exported
    console = Console(width=400, record=True)
    runs.show(console, [saved, rows["only-trained"]], {"host": "answered"})
    shown = console.export_text()
    assert "0% -> 0% (0% after batch 2; test 0% at step 4)" in shown and "reportBatches" in shown


def test_runs_read_before_best_and_after_each_from_its_own_line():
    """The recorded host's answer with the saved run's training log scored apart (MaxText 0.2.3's lines, as the
    recorded ones are shaped: 12.5% before, 50% then 37.5% in training, 62.5% after), so a row that took one
    evaluation for another (before for after, the last intermediate for the best, post for pre) says another number."""
    from tests.unit.test_facts import RECORDED
    from tpu_grpo.host import facts

    case = json.loads((RECORDED / "runs.HostRuns" / "saved-failed-and-trained.json").read_text())
    job = "20261206-204148.190-train"  # the run `saved`'s training
    log = [
        "W1202 14:23:07.528425 140671093824384 train_rl.py:716] Pre RL Training: corr=1, total=8, accuracy=12.5%, "
        "partial_accuracy=25.0%, format_accuracy=50.0%, mean_reward=0.5000",
        "I1202 14:23:21.594429 140671093824384 peft_trainer.py:488] Train step 2 training loss: 0.000000  - "
        "training perplexity: 1.000000",
        "W1202 14:23:21.662907 140671093824384 hooks.py:98] Intermediate Eval (step=2): corr=4, total=8, "
        "accuracy=50.0%, partial_accuracy=50.0%, format_accuracy=75.0%, mean_reward=1.7500",
        "I1202 14:23:22.069841 140671093824384 peft_trainer.py:488] Train step 4 training loss: 0.000000  - "
        "training perplexity: 1.000000",
        "W1202 14:23:22.149193 140671093824384 hooks.py:98] Intermediate Eval (step=4): corr=3, total=8, "
        "accuracy=37.5%, partial_accuracy=50.0%, format_accuracy=87.5%, mean_reward=1.5000",
        "W1202 14:23:22.246774 140671093824384 train_rl.py:754] Post RL Training: corr=5, total=8, accuracy=62.5%, "
        "partial_accuracy=75.0%, format_accuracy=100.0%, mean_reward=2.2500",
    ]
    kept = [line for line in case["stdout"].splitlines() if not line.startswith(f"line {job} ")]
    stdout = "\n".join([*kept, *(f"line {job} {line}" for line in log)]) + "\n"
    [saved] = [row for row in runs.HostRuns.parse(facts.Answer(stdout)) if row.run == "saved"]
    assert (saved.accuracy_before, saved.best_batch, saved.best_accuracy, saved.accuracy_after) == (12.5, 2, 50.0, 62.5)
    assert [(point.step, point.accuracy) for point in saved.curve] == [(2, 50.0), (4, 37.5)]


def test_no_runs_says_so_and_the_command_that_makes_one(stack_dir):
    """Not thirteen empty columns; and the command given runs as printed (here with --dry-run, which starts nothing)."""
    from tests.support import invoke

    console = Console(width=200, record=True)
    runs.show(console, [], {"host": "answered", "laptop": "answered"})
    said = console.export_text().splitlines()
    assert said == [
        "no runs yet; make one: uv run invoke pipeline --batches 50 (docs/training.md)",
        "host: answered",
        "laptop: answered",
    ]
    command = said[0].split("make one: uv run invoke ")[1].split(" (")[0].split()
    assert invoke(*command, "--dry-run", cwd=stack_dir).returncode == 0


def test_no_runs_where_a_source_did_not_answer_says_what_was_read_and_what_was_not():
    """A host that did not answer may hold runs: "no runs yet" would tell a user there are none."""
    console = Console(width=200, record=True)
    runs.show(console, [], {"host": "no answer: connection refused", "laptop": "answered"})
    assert console.export_text().splitlines() == [
        "no runs known to laptop; host did not answer (below)",
        "host: no answer: connection refused",
        "laptop: answered",
    ]

"""Each host fact from what a host answered (tests/facts), without a host: the script it sends is the one
recorded, and the recorded answer parses to the recorded fact."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest

from tests.support import ROOT
from tpu_grpo.host import facts
from tpu_grpo.jobs import pipeline, vm_jobs
from tpu_grpo.results import retrieval

RECORDED = ROOT / "tests" / "facts"
CASES = sorted(RECORDED.glob("*/*.json"))


def every_fact() -> dict[str, type[facts.Fact]]:
    """The registry once every module of the package is imported, so that each fact has registered itself."""
    package = importlib.import_module("tpu_grpo")
    for module in pkgutil.walk_packages(package.__path__, "tpu_grpo."):
        if ".host.remote." not in module.name:  # the host's programs, which run there
            importlib.import_module(module.name)
    return facts.REGISTRY


def plain(value):
    """A fact as JSON holds it (a job: its record; a tuple: a list)."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value.to_json() if hasattr(value, "to_json") else value


def test_every_fact_has_recorded_answers_and_every_recording_a_fact():
    assert {path.parent.name for path in CASES} == set(every_fact())


@pytest.mark.parametrize("path", CASES, ids=[f"{path.parent.name}/{path.stem}" for path in CASES])
def test_a_recorded_answer_parses_to_the_recorded_fact(path: Path):
    case = json.loads(path.read_text())
    fact = every_fact()[path.parent.name]
    assert fact.script(*case["args"]) == case["command"], "the script changed: record this case again"
    answer = facts.Answer(case["stdout"], case["stderr"], case["exited"])
    assert plain(fact.parse(answer, *case["args"])) == case["fact"]


def test_a_job_list_the_host_could_not_make_is_one_error():
    with pytest.raises(vm_jobs.JobError, match="cannot list the jobs on the host: ls: Permission denied"):
        vm_jobs.Jobs.parse(facts.Answer("", "ls: Permission denied\n", 2))


def test_down_counts_a_run_published_with_a_commit_as_safe(tmp_path, monkeypatch):
    """`down` refuses while a run's model is only on the VM: a copy fetched here, or a commit the Hub acknowledged
    (recorded by `invoke publish`), makes it safe; a publish with no commit recorded does not."""
    recorded = json.loads((RECORDED / "retrieval.RunsOnHost" / "one-saved-one-only-trained.json").read_text())
    host_runs = retrieval.RunsOnHost.parse(facts.Answer(recorded["stdout"], recorded["stderr"], recorded["exited"]))
    monkeypatch.setenv("TPU_GRPO_STATE", str(tmp_path))
    assert [line.split(":")[0] for line in retrieval.only_on_the_vm(host_runs)] == ["run only-trained", "run saved"]
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "saved.json").write_text(json.dumps({"run": "saved", "repo": "me/m", "commit": None}))
    assert len(retrieval.only_on_the_vm(host_runs)) == 2  # asked, never acknowledged
    (tmp_path / "published" / "saved.json").write_text(json.dumps({"run": "saved", "repo": "me/m", "commit": "abc123"}))
    assert [line.split(":")[0] for line in retrieval.only_on_the_vm(host_runs)] == ["run only-trained"]


def test_a_runs_checkpoints_are_its_steps_as_numbers_whatever_order_ls_gives():
    """`ls` sorts by text (10 before 2, in some locales 2 after 10): the newest checkpoint is the largest number, and
    Orbax's unfinished saves (STEP.orbax-checkpoint-tmp) are none."""
    found = pipeline.Checkpoints.parse(facts.Answer("10\n2\n4.orbax-checkpoint-tmp-123\n4\n"), "/x")
    assert found == [2, 4, 10]

"""`invoke publish` without a host: repository names, the license note, the model card, what the token may
write (the upload itself runs against a throwaway host: tests/host/test_publish.py)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import subprocess
import sys

import pytest
from huggingface_hub import ModelCard

from tests.doubles.hub import whoami
from tests.support import ROOT
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.config import errors, stack_file
from tpu_grpo.config.errors import UserError
from tpu_grpo.host.remote.hub import refusal
from tpu_grpo.jobs import progress, vm_jobs
from tpu_grpo.jobs.progress import Eval
from tpu_grpo.results import publish


@pytest.mark.parametrize("repo", ["alice/Llama-3.1-8B", "a/b", "org_1/x.y-z", "A" * 96 + "/" + "b" * 96])
def test_repo_names_the_hub_takes_pass(repo):
    assert publish.check_repo(repo) == repo


@pytest.mark.parametrize(
    "repo",
    ["noslash", "a/b/c", "a/-b", "a/b.", "a/b--c", "a/b..c", "a/b.git", "a/b c", "a/" + "b" * 97, "/b", "a/", "a/bé"],
)
def test_repo_names_the_hub_refuses_are_one_line_with_the_fix(repo):
    with pytest.raises(UserError, match=r"is not a Hugging Face repository id \(OWNER/NAME.*fix: e\.g\. --repo"):
        publish.check_repo(repo)


def test_a_name_not_starting_with_llama_gets_the_licenses_note():
    assert publish.license_note("alice/Llama-3.1-8B-GRPO", "llama3.1") is None
    assert "alice/Llama-my-model" in publish.license_note("alice/my-model", "llama3.1")
    assert publish.license_note("alice/my-qwen", "apache-2.0") is None  # a Qwen run: no Llama naming rule


def test_hf_endpoint_must_be_a_url(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8080/")
    assert stack_file.hub_endpoint() == "http://127.0.0.1:8080"
    monkeypatch.setenv("HF_ENDPOINT", "hub; rm -rf ~")
    with pytest.raises(errors.SettingsError, match="HF_ENDPOINT='hub; rm -rf ~' is not an http"):
        stack_file.hub_endpoint()


@pytest.mark.parametrize(
    "answer, repo, expected",
    [
        (whoami("alice"), "alice/x", None),
        (whoami("alice", orgs={"team": "write"}), "team/x", None),
        (whoami("alice", orgs={"team": "contributor"}), "team/x", None),
        (whoami("alice", role="read"), "alice/x", "can only read"),
        (whoami("alice", orgs={"team": "read"}), "team/x", "alice is a read member of team"),
        (
            whoami("alice", orgs={"team": "write"}),
            "bob/x",
            r"bob is neither alice nor one of alice's organizations\); "
            r"fix: --repo alice/x \(you may write to: alice, team\)",
        ),
        (
            whoami(
                "alice",
                role="fineGrained",
                scoped=[
                    {"entity": {"type": "user", "name": "alice"}, "permissions": ["repo.content.read", "repo.write"]}
                ],
            ),
            "alice/x",
            None,
        ),
        (
            whoami(
                "alice",
                role="fineGrained",
                scoped=[{"entity": {"type": "model", "name": "alice/x"}, "permissions": ["repo.write"]}],
            ),
            "alice/x",
            None,
        ),
        (
            whoami(
                "alice",
                role="fineGrained",
                scoped=[{"entity": {"type": "user", "name": "alice"}, "permissions": ["repo.content.read"]}],
            ),
            "alice/x",
            "fine-grained .* has no write access to repositories of alice",
        ),
    ],
)
def test_what_the_token_may_write_is_read_from_whoami(answer, repo, expected):
    why = refusal(answer, repo)
    if expected is None:
        assert why is None
    else:
        assert re.search(expected, why) and "fix:" in why


def _eval(stage, correct, total=4):
    return Eval(stage, None, correct, total, 100 * correct / total, 100 * correct / total, 100.0, 0.5)


def test_the_card_is_in_the_hubs_format_and_says_what_was_trained():
    trained = {
        "model": "llama3.1-8b-Instruct",
        "batches": 50,
        "test_batches": 10,
        "machine": "ct6e-standard-8t",
        "store": "disk",
        "use_pathways": False,
        "convert_set": {},
        "train_set": {"rl.num_generations": "4", "learning_rate": "1e-6"},
    }
    saved = {**trained, "export_model": "llama3.1-8b", "step": 50, "export_set": {"weight_dtype": "bfloat16"}}
    text = publish.card(
        publish.Facts(
            "gsm8k-50", trained, saved, "spot", "0.2.3", 3725.0, 2, pre=_eval("pre", 1), post=_eval("post", 3)
        )
    )
    card = ModelCard(text)
    assert card.data.base_model == "meta-llama/Llama-3.1-8B-Instruct"
    assert card.data.datasets == ["openai/gsm8k"]
    assert (card.data.library_name, card.data.license, card.data.pipeline_tag) == (
        "transformers",
        "llama3.1",
        "text-generation",
    )
    assert {"grpo", "maxtext", "tpu"} <= set(card.data.tags)
    for row in (
        "| generations per prompt | 4 (`rl.num_generations`) |",
        "| learning rate | 1e-6 (`learning_rate`) |",
        "| KL coefficient beta | 0.08 (`rl.grpo_beta`) |",
        "| clipping epsilon | 0.2 (`rl.grpo_epsilon`) |",
        "| batches | 50 (`num_batches`), batch size 1 |",
        "| machine | ct6e-standard-8t (v6e-8, 8 chips) |",
        "| capacity | spot |",
        "| training time | 1 h 02 min in 2 training jobs |",
        f"| cost | {3725 / 3600 * 8:.2f} chip-hours of training at the spot price: "
        f"${round(3725 / 3600 * 8 * CAPACITIES['spot'].usd_per_chip_hour, 2):,.2f} "
        f"({CAPACITIES['spot'].price_source}) |",
        "| accuracy | 25% (1/4) | 75% (3/4) | not measured |",
        "| format accuracy | 100% | 100% | not measured |",
        "`train:rl.num_generations=4`, `train:learning_rate=1e-6`, `export:weight_dtype=bfloat16`",
        "MaxText 0.2.3",
        "Built with Llama",
        "on 10 batches of the test split",
        "It was not scored on a report set",
        "uv run invoke pipeline --run-name gsm8k-50 --batches 50 --set train:rl.num_generations=4",
    ):
        assert row in text, row


def test_the_card_names_the_dataset_the_loss_the_tokenizer_and_the_models_license():
    trained = {
        "model": "qwen3-8b",
        "batches": 20,
        "test_batches": 5,
        "machine": "ct6e-standard-8t",
        "store": "disk",
        "use_pathways": False,
        "convert_set": {},
        "train_set": {},
        "data": {
            "dataset_name": "nvidia/OpenMathInstruct-2",
            "eval_dataset_name": "nvidia/OpenMathInstruct-2",
            "hf_name": "",
            "rl.loss_algo": "gspo-token",
        },
    }
    saved = {**trained, "export_model": "qwen3-8b", "step": 20, "export_set": {}}
    text = publish.card(
        publish.Facts("math-1", trained, saved, "spot", "0.2.3", 600.0, 1, pre=_eval("pre", 1), post=_eval("post", 2))
    )
    card = ModelCard(text)
    assert (card.data.base_model, card.data.license) == ("Qwen/Qwen3-8B", "apache-2.0")
    assert card.data.datasets == ["nvidia/OpenMathInstruct-2"] and "openmathinstruct-2" in card.data.tags
    for row in (
        "# math-1: Qwen3-8B trained with gspo-token on nvidia/OpenMathInstruct-2",
        "| dataset | [nvidia/OpenMathInstruct-2](https://huggingface.co/datasets/nvidia/OpenMathInstruct-2), "
        "MaxText's math reward |",
        "| loss | gspo-token (`rl.loss_algo`) |",
        "| tokenizer | [Qwen/Qwen3-8B](https://huggingface.co/Qwen/Qwen3-8B), in the export too |",
        "A derivative of Qwen/Qwen3-8B, shared under its license (`apache-2.0`).",
    ):
        assert row in text, row
    assert "Llama" not in text


def test_publish_refuses_a_bad_repo_before_connecting(tmp_path):
    for argv, wanted in (
        (["--repo", "no-slash"], "--repo 'no-slash' is not a Hugging Face repository id (OWNER/NAME"),
        ([], "--repo is missing"),
        (["--repo", "a/b", "--run", "../x"], "--run '../x' is not a name"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), "publish", *argv, "--host", "nobody@192.0.2.1"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "TPU_GRPO_STATE": str(tmp_path), "HOME": str(tmp_path)},
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and wanted in result.stderr, result.stderr
    assert not any(tmp_path.iterdir())


def test_a_run_trained_in_two_jobs_is_scored_before_by_the_first_and_after_by_the_last():
    """A training resumed after a lost VM evaluates again before it goes on: the card's "before training" is the
    first job's evaluation, of the model as it was converted, and "after" the last job's."""
    import base64
    import json as json_module

    from tpu_grpo.jobs.vm_jobs import Job
    from tpu_grpo.results import publish

    def eval_line(stage: str, correct: int) -> str:
        return (
            f"W1202 14:23:07.528425 140671093824384 train_rl.py:716] {stage} RL Training: corr={correct}, total=8, "
            f"accuracy={correct * 12.5}%, partial_accuracy=0.0%, format_accuracy=0.0%, mean_reward=0.0000"
        )

    def started(cache: str, weights_s: int) -> list[str]:
        return [
            f"tpu-grpo: compile cache {cache}: 3 entries, 300 bytes, in /c",
            "I1204 12:00:00.000000 1 model_creation_utils.py:751] Creating reference model and also meshes",
            f"I1204 12:00:{weights_s:02d}.000000 1 train_rl.py:498] Creating RL cluster...",
        ]

    first = Job("20261204-100000000-train", "train", "r", "lost", None, 1000.0, None, 10, {"capacity": "spot"})
    second = Job("20261204-120000000-train", "train", "r", "finished", 0, 5000.0, 6000.0, 10, {"capacity": "spot"})
    record = base64.b64encode(json_module.dumps({"batches": 8}).encode()).decode()
    answer = "\n".join(
        [
            f"job {first.id}",
            *started("cold", 50),
            eval_line("Pre", 1),
            f"job {second.id}",
            *started("warm", 20),
            eval_line("Pre", 3),
            eval_line("Post", 5),
            f"trained {record}",
            f"saved {record}",
            "maxtext 0.2.3",
        ]
    )
    found = publish.read_facts("r", [first, second], answer)
    assert (found.pre.correct, found.post.correct, found.trainings) == (1, 5, 2)
    assert found.train_seconds == 1000.0 and found.maxtext_version == "0.2.3"
    # the start-up the card states is the last training's: its weights phase, its warm cache
    assert found.startup["phases"] == {"weights": 20.0} and found.startup["cache"]["warm"]
    assert "| start-up | weights 0m20s (compile cache warm) |" in publish.card(
        dataclasses.replace(found, trained={**found.trained, "model": "llama3.1-8b-Instruct"})
    )


@pytest.mark.parametrize(
    "repo",
    [
        "a/b",
        "_a/b_",
        "A.b/c-d",
        "a/b.gi",
        "a" * 96 + "/b",
        "a/b--",
        "a/b.git",
        "a/.b",
        "a/b..",
        "-a/b",
        "a/b/c",
        "a",
        "a/bé",
        "a/b c",
        "a/",
        "a/b\n",
        "a/" + "b" * 97,
    ],
)
def test_the_hub_id_rule_is_huggingface_hubs(repo):
    """values.hub_id takes what huggingface_hub's validate_repo_id takes of OWNER/NAME ids, and nothing else."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from tpu_grpo.config import values

    try:
        validate_repo_id(repo)
        hub_takes = "/" in repo
    except HFValidationError:
        hub_takes = False
    try:
        values.hub_id(repo)
        ours = True
    except values.Refused:
        ours = False
    assert ours == hub_takes


def test_the_card_scores_the_checkpoint_it_holds_the_best_not_the_last():
    """A model saved from checkpoint 20 of 50 (the best scored) is described by the intermediate evaluation after
    batch 20, not by the evaluation after training, which scored the last weights."""
    trained = {"model": "llama3.1-8b-Instruct", "batches": 50, "test_batches": 10, "machine": "ct6e-standard-8t",
               "store": "disk", "use_pathways": False, "convert_set": {}, "train_set": {}}  # fmt: skip
    saved = {**trained, "export_model": "llama3.1-8b", "step": 20, "export_set": {}}
    peak = Eval("intermediate", 20, 3, 4, 75.0, 75.0, 100.0, 1.5)
    later = Eval("intermediate", 30, 1, 4, 25.0, 25.0, 100.0, 0.5)
    found = publish.Facts(
        "r", trained, saved, "spot", "0.2.3", 600.0, 1, pre=_eval("pre", 1), post=_eval("post", 2),
        intermediate=[peak, later],
    )  # fmt: skip
    text = publish.card(found)
    assert "the exported checkpoint (step 20, the best scored) was chosen on them" in text
    assert "| accuracy | 25% (1/4) | 75% (3/4) | not measured |" in text
    last = publish.card(dataclasses.replace(found, saved={**saved, "step": 50}))
    assert "(step 50, the last)" in last and "| accuracy | 25% (1/4) | 50% (2/4) | not measured |" in last


def test_the_card_quotes_the_report_sets_score_of_the_saved_step_beside_the_choosing_one():
    """The newest export's report evaluation (read from the host's answer, as `facts` asks for it) is the card's
    score to quote, with the examples it was measured on; a report of another step than the saved one is not."""
    trained = {"model": "llama3.1-8b-Instruct", "batches": 50, "test_batches": 10, "machine": "ct6e-standard-8t",
               "store": "disk", "use_pathways": False, "convert_set": {}, "train_set": {}}  # fmt: skip
    saved = {**trained, "export_model": "llama3.1-8b", "step": 20, "export_set": {}}
    training = vm_jobs.Job("t1", "train", "r", "finished", 0, 1000.0, 1600.0, 100)
    absl = "W1206 20:35:10.347785 139769738177408 train_rl.py:716] "
    answer = "\n".join(
        [
            "job t1",
            absl + "Pre RL Training: corr=1, total=4, accuracy=25.0%, partial_accuracy=25.0%, "
            "format_accuracy=100.0%, mean_reward=0.5",
            absl.replace("train_rl.py:716", "hooks.py:98") + "Intermediate Eval (step=20): corr=3, total=4, "
            "accuracy=75.0%, partial_accuracy=75.0%, format_accuracy=100.0%, mean_reward=1.5",
            "job e1",
            f"{progress.REPORT_LINE} 20 on test examples 10 to 20",
            absl + "Pre RL Training: corr=6, total=10, accuracy=60.0%, partial_accuracy=60.0%, "
            "format_accuracy=90.0%, mean_reward=1.0",
            "saved " + base64.b64encode(json.dumps(saved).encode()).decode(),
            "trained " + base64.b64encode(json.dumps(trained).encode()).decode(),
        ]
    )
    found = publish.read_facts("r", [training], answer, "e1")
    assert found.pre is not None and found.pre.accuracy == 25.0  # the training's, not the export's evaluation
    assert found.report is not None and found.report.score is not None and found.report.score.correct == 6
    text = publish.card(found)
    assert "| accuracy | 25% (1/4) | 75% (3/4) | 60% (6/10) |" in text
    assert "test examples 10 to 20 of MaxText's shuffled test split, chose nothing" in text
    other = publish.read_facts("r", [training], answer.replace("checkpoint 20 on", "checkpoint 50 on"), "e1")
    assert other.report is None and "| 75% (3/4) | not measured |" in publish.card(other)

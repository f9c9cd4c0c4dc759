"""`invoke publish`: the saved model to the Hugging Face Hub from the host, with a model card.

Against a stand-in of the Hub's HTTP API (tests/hub.py, HF_ENDPOINT) and the real huggingface_hub in
the test host's venv: what arrives is compared byte for byte with the saved model, a re-run sends
nothing, the card parses with huggingface_hub's ModelCard and holds the run's numbers, and a token or
repo the Hub would refuse stops in one line before anything is written or uploaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest
from huggingface_hub import ModelCard

from tests.conftest import ROOT, TEST_TOKEN, give_hub_client
from tests.hub import HubServer, whoami
from tests.test_workloads import FAST, job_dirs, scan_for_token
from tpu_grpo import maxtext, publish, settings
from tpu_grpo.hub_host import refusal
from tpu_grpo.progress import Eval

REPO = "alice/Llama-3.1-8B-Instruct-GRPO"


@pytest.mark.parametrize("repo", ["alice/Llama-3.1-8B", "a/b", "org_1/x.y-z", "A" * 96 + "/" + "b" * 96])
def test_repo_names_the_hub_takes_pass(repo):
    assert publish.check_repo(repo) == repo


@pytest.mark.parametrize("repo", ["noslash", "a/b/c", "a/-b", "a/b.", "a/b--c", "a/b..c", "a/b.git", "a/b c",
                                  "a/" + "b" * 97, "/b", "a/", "a/bé"])
def test_repo_names_the_hub_refuses_are_one_line_with_the_fix(repo):
    with pytest.raises(maxtext.CommandError, match=r"is not OWNER/NAME.*fix: e\.g\. --repo"):
        publish.check_repo(repo)


def test_a_name_not_starting_with_llama_gets_the_licenses_note():
    assert publish.license_note("alice/Llama-3.1-8B-GRPO") is None
    assert "alice/Llama-my-model" in publish.license_note("alice/my-model")


def test_hf_endpoint_must_be_a_url(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8080/")
    assert settings.hub_endpoint() == "http://127.0.0.1:8080"
    monkeypatch.setenv("HF_ENDPOINT", "hub; rm -rf ~")
    with pytest.raises(settings.SettingsError, match="HF_ENDPOINT='hub; rm -rf ~' is not an http"):
        settings.hub_endpoint()


@pytest.mark.parametrize("answer, repo, expected", [
    (whoami("alice"), "alice/x", None),
    (whoami("alice", orgs={"team": "write"}), "team/x", None),
    (whoami("alice", orgs={"team": "contributor"}), "team/x", None),
    (whoami("alice", role="read"), "alice/x", "can only read"),
    (whoami("alice", orgs={"team": "read"}), "team/x", "alice is a read member of team"),
    (whoami("alice", orgs={"team": "write"}), "bob/x", r"bob is neither alice nor one of alice's organizations\); "
                                                       r"fix: --repo alice/x \(you may write to: alice, team\)"),
    (whoami("alice", role="fineGrained", scoped=[{"entity": {"type": "user", "name": "alice"},
                                                   "permissions": ["repo.content.read", "repo.write"]}]), "alice/x", None),
    (whoami("alice", role="fineGrained", scoped=[{"entity": {"type": "model", "name": "alice/x"},
                                                   "permissions": ["repo.write"]}]), "alice/x", None),
    (whoami("alice", role="fineGrained", scoped=[{"entity": {"type": "user", "name": "alice"},
                                                   "permissions": ["repo.content.read"]}]), "alice/x",
     "fine-grained .* has no write access to repositories of alice"),
])
def test_what_the_token_may_write_is_read_from_whoami(answer, repo, expected):
    why = refusal(answer, repo)
    if expected is None:
        assert why is None
    else:
        assert re.search(expected, why) and "fix:" in why


def _eval(stage, correct, total=4):
    return Eval(stage, None, correct, total, 100 * correct / total, 100 * correct / total, 100.0, 0.5)


def test_the_card_is_in_the_hubs_format_and_says_what_was_trained():
    trained = {"model": "llama3.1-8b-Instruct", "batches": 50, "test_batches": 10, "machine": "ct6e-standard-8t",
               "store": "disk", "use_pathways": False, "convert_set": {},
               "train_set": {"rl.num_generations": "4", "learning_rate": "1e-6"}}
    saved = {**trained, "export_model": "llama3.1-8b", "step": 50, "export_set": {"weight_dtype": "bfloat16"}}
    text = publish.card(publish.Facts("gsm8k-50", trained, saved, "spot", "0.2.3", 3725.0, 2,
                                      pre=_eval("pre", 1), post=_eval("post", 3)))
    card = ModelCard(text)
    assert card.data.base_model == "meta-llama/Llama-3.1-8B-Instruct"
    assert card.data.datasets == ["openai/gsm8k"]
    assert (card.data.library_name, card.data.license, card.data.pipeline_tag) == ("transformers", "llama3.1",
                                                                                    "text-generation")
    assert {"grpo", "maxtext", "tpu"} <= set(card.data.tags)
    for row in ("| generations per prompt | 4 (`rl.num_generations`) |", "| learning rate | 1e-6 (`learning_rate`) |",
                "| KL coefficient beta | 0.08 (`rl.grpo_beta`) |", "| clipping epsilon | 0.2 (`rl.grpo_epsilon`) |",
                "| batches | 50 (`num_batches`), batch size 1 |",
                "| machine | ct6e-standard-8t (v6e-8, 8 chips) |", "| capacity | spot |",
                "| training time | 1 h 02 min in 2 training jobs |",
                "| accuracy | 25% (1/4) | 75% (3/4) |", "| format accuracy | 100% | 100% |",
                "`train:rl.num_generations=4`, `train:learning_rate=1e-6`, `export:weight_dtype=bfloat16`",
                "MaxText 0.2.3", "Built with Llama", "on 10 test batches",
                "uv run invoke pipeline --run-name gsm8k-50 --batches 50 --set train:rl.num_generations=4"):
        assert row in text, row


def test_publish_refuses_a_bad_repo_before_connecting(tmp_path):
    for argv, wanted in ((["--repo", "no-slash"], "--repo 'no-slash' is not OWNER/NAME"),
                         ([], "--repo is missing"),
                         (["--repo", "a/b", "--run", "../x"], "--run '../x' is not a run name")):
        result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "publish", *argv,
                                 "--host", "nobody@192.0.2.1"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "TPU_GRPO_STATE": str(tmp_path), "HOME": str(tmp_path)})
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and wanted in result.stderr, result.stderr
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- on a test host, against the stand-in Hub


def _saved_files(host, run: str) -> dict[str, bytes]:
    folder = host.host.user.home / "tpu-grpo/models" / run
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.name != "SHA256SUMS"}


def _with_evals(host, pre: int, post: int) -> None:
    """Give the replayed training log other eval results than the recording's zeros, so that the card's
    numbers are seen to come from this run's log."""
    log = host.host.user.home / "fixtures/train_rl.cpu-rehearsal.log"
    text = log.read_text()
    for stage, correct in (("Pre", pre), ("Post", post)):
        text = text.replace(f"{stage} RL Training: corr=0, total=4, accuracy=0.0%",
                            f"{stage} RL Training: corr={correct}, total=4, accuracy={25.0 * correct}%")
    log.write_text(text)


def test_publish_uploads_the_saved_model_with_its_card_and_a_rerun_sends_nothing(workload_host, hub_client, tmp_path):
    host = workload_host
    give_hub_client(host, hub_client)
    _with_evals(host, pre=1, post=3)
    trained = host.invoke("pipeline", "--batches", "4", "--run-name", "pub", "--set", "rl.num_generations=4", *FAST)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    saved_before = _saved_files(host, "pub")
    with HubServer() as hub:
        hub.tokens[TEST_TOKEN] = whoami("alice", orgs={"team": "write", "viewers": "read"})
        env = {"HF_ENDPOINT": hub.url}

        # refused before anything is written on the host or created on the Hub
        hub.refused_names["alice/Llama-reserved"] = "Repository name is reserved"
        jobs_before = job_dirs(host)
        for repo, wanted in (("viewers/Llama-x", r"alice is a read member of viewers\); fix: --repo alice/Llama-x"),
                             ("bob/Llama-x", r"bob is neither alice nor one of alice's organizations"),
                             ("alice/Llama-reserved", r"the Hub refuses the name --repo alice/Llama-reserved "
                                                      r"\(Repository name is reserved\)")):
            result = host.invoke("publish", "--repo", repo, env=env)
            assert result.returncode == 2, result.stdout + result.stderr
            assert re.search(wanted, result.stderr) and result.stderr.strip().count("\n") == 0, result.stderr
        hub.tokens[TEST_TOKEN] = whoami("alice", role="read")
        result = host.invoke("publish", "--repo", REPO, env=env)
        assert result.returncode == 2 and "can only read" in result.stderr, result.stderr
        assert hub.repos == {} and hub.uploads == []
        assert job_dirs(host) == jobs_before
        assert _saved_files(host, "pub") == saved_before  # no card written

        # published: every file arrives byte for byte, in one commit, to a new private repo
        hub.tokens[TEST_TOKEN] = whoami("alice", orgs={"team": "write"})
        result = host.invoke("publish", "--repo", REPO, "--json", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        outcome = json.loads(result.stdout)
        repo = hub.repos[REPO]
        assert (outcome["created"], outcome["private"], repo.private) == (True, True, True)
        saved = _saved_files(host, "pub")
        assert set(saved) == set(saved_before) | {"README.md"}
        assert sorted(outcome["uploaded"]) == sorted(saved)
        assert outcome["bytes_uploaded"] == sum(len(data) for data in saved.values())
        for name, data in saved.items():
            assert hub.file_bytes(REPO, name) == data, name
        assert [commit["summary"] for commit in repo.commits] == ["initial commit", "tpu-grpo: pub"]
        assert hub.authorizations == {TEST_TOKEN}  # the host's token reached the Hub ...
        scan_for_token(result.stdout, result.stderr, folders=(host.host.user.home / "tpu-grpo/jobs",
                                                              host.host.state))  # ... and nothing else

        # the card: the Hub's format, this run's numbers; beside the model, in its SHA256SUMS
        card = ModelCard(hub.file_bytes(REPO, "README.md").decode())
        assert card.data.base_model == "meta-llama/Llama-3.1-8B-Instruct" and card.data.license == "llama3.1"
        for row in ("| accuracy | 25% (1/4) | 75% (3/4) |", "| batches | 4 (`num_batches`)",
                    "| generations per prompt | 4 (`rl.num_generations`) |", "MaxText 0.2.3",
                    "| machine | ct6e-standard-8t (v6e-8, 8 chips) |", "in 1 training job |"):
            assert row in card.content, row
        sums = (host.host.user.home / "tpu-grpo/models/pub/SHA256SUMS").read_text()
        assert f"{hashlib.sha256(saved['README.md']).hexdigest()}  README.md" in sums.splitlines()

        # a re-run sends nothing and commits nothing
        uploads, commits = list(hub.uploads), len(repo.commits)
        again = host.invoke("publish", "--repo", REPO, "--json", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout)["uploaded"] == [] and json.loads(again.stdout)["already_there"] == len(saved)
        assert hub.uploads == uploads and len(repo.commits) == commits
        assert not [request for request in hub.requests if request[0] == "PUT"][len(uploads):]

    # fetch brings the card home too
    fetched = host.invoke("fetch", "--run", "pub", "--to", str(tmp_path / "model"))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert (tmp_path / "model/README.md").read_bytes() == saved["README.md"]


def test_a_run_trained_in_two_jobs_is_scored_before_by_the_first_and_after_by_the_last():
    """A training resumed after a lost VM evaluates again before it goes on: the card's "before training" is the
    first job's evaluation, of the model as it was converted, and "after" the last job's."""
    import base64
    import json as json_module

    from tpu_grpo import publish
    from tpu_grpo.jobs import Job

    def eval_line(stage: str, correct: int) -> str:
        return (f"W1202 14:23:07.528425 140671093824384 train_rl.py:716] {stage} RL Training: corr={correct}, total=8, "
                f"accuracy={correct * 12.5}%, partial_accuracy=0.0%, format_accuracy=0.0%, mean_reward=0.0000")

    first = Job("20261204-100000000-train", "train", "r", "lost", None, 1000.0, None, 10, {"capacity": "spot"})
    second = Job("20261204-120000000-train", "train", "r", "finished", 0, 5000.0, 6000.0, 10, {"capacity": "spot"})
    record = base64.b64encode(json_module.dumps({"batches": 8}).encode()).decode()
    answer = "\n".join([f"job {first.id}", eval_line("Pre", 1), f"job {second.id}", eval_line("Pre", 3),
                        eval_line("Post", 5), f"trained {record}", f"saved {record}", "maxtext 0.2.3"])
    found = publish.read_facts("r", [first, second], answer)
    assert (found.pre.correct, found.post.correct, found.trainings) == (1, 5, 2)
    assert found.train_seconds == 1000.0 and found.maxtext_version == "0.2.3"


def test_a_file_is_reported_uploaded_only_once_the_hubs_commit_holds_it(workload_host, hub_client):
    """Small files (the card, config.json, the tokenizer's) travel in the commit itself: when the Hub refuses the
    commit, no file is reported uploaded (sent ones are said sent), and the run again uploads them all."""
    host = workload_host
    give_hub_client(host, hub_client)
    trained = host.invoke("pipeline", "--batches", "4", "--run-name", "pub2", *FAST)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    with HubServer() as hub:
        hub.tokens[TEST_TOKEN] = whoami("alice")
        env = {"HF_ENDPOINT": hub.url}
        hub.refused_commit = "Your push was rejected"
        failed = host.invoke("publish", "--repo", REPO, "--json", env=env)
        assert failed.returncode == 1 and failed.stdout == "", failed.stderr
        [job] = [job for job in job_dirs(host) if job.name.endswith("-publish")]
        log = (job / "log").read_text()
        assert re.search(r"^tpu-grpo: sent README\.md \d+$", log, re.MULTILINE)  # sent, and refused with the commit
        assert not re.search(r"uploaded \S+ \d+", log + failed.stderr)
        assert [commit["summary"] for commit in hub.repos[REPO].commits] == ["initial commit"]
        hub.refused_commit = None
        again = host.invoke("publish", "--repo", REPO, "--json", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        outcome = json.loads(again.stdout)
        assert sorted(outcome["uploaded"]) == sorted(_saved_files(host, "pub2"))
        assert outcome["bytes_uploaded"] == outcome["bytes_sent"]
        for name in outcome["uploaded"]:
            assert hub.file_bytes(REPO, name) == _saved_files(host, "pub2")[name], name

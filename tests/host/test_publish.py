"""`invoke publish`: the saved model to the Hugging Face Hub from the host, with a model card.

Against a stand-in of the Hub's HTTP API (tests/doubles/hub.py, HF_ENDPOINT) and the real huggingface_hub in
the test host's venv: what arrives is compared byte for byte with the saved model, a re-run sends
nothing, the card parses with huggingface_hub's ModelCard and holds the run's numbers, and a token or
repo the Hub would refuse stops in one line before anything is written or uploaded.
"""

from __future__ import annotations

import hashlib
import json
import re

from huggingface_hub import ModelCard

from tests.doubles.hub import HubServer, whoami
from tests.support import FAST, TEST_TOKEN, job_dirs, scan_for_token

REPO = "alice/Llama-3.1-8B-Instruct-GRPO"


def _saved_files(host, run: str) -> dict[str, bytes]:
    folder = host.host.user.home / "tpu-grpo/models" / run
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.name != "SHA256SUMS"}


def _with_evals(host, pre: int, post: int) -> None:
    """Give the replayed training log other eval results than the recording's zeros, so that the card's
    numbers are seen to come from this run's log."""
    log = host.host.user.home / "fixtures/train_rl.cpu-rehearsal.log"
    text = log.read_text()
    for stage, correct in (("Pre", pre), ("Post", post)):
        text = text.replace(
            f"{stage} RL Training: corr=0, total=4, accuracy=0.0%",
            f"{stage} RL Training: corr={correct}, total=4, accuracy={25.0 * correct}%",
        )
    log.write_text(text)


# ---------------------------------------------------------------- on a test host, against the stand-in Hub


def test_publish_uploads_the_saved_model_with_its_card_and_a_rerun_sends_nothing(workload_host, hub_client, tmp_path):
    host = workload_host
    host.give_client(hub_client)
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
        for repo, wanted in (
            ("viewers/Llama-x", r"alice is a read member of viewers\); fix: --repo alice/Llama-x"),
            ("bob/Llama-x", r"bob is neither alice nor one of alice's organizations"),
            (
                "alice/Llama-reserved",
                r"the Hub refuses the name --repo alice/Llama-reserved "
                r"\(Repository name is reserved\)",
            ),
        ):
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
        [row] = json.loads(host.invoke("runs", "--json").stdout)["runs"]  # the laptop's record of what it published
        assert (row["run"], row["state"], row["where"][-1]) == ("pub", "published", f"hub: {outcome['url']}")
        assert hub.authorizations == {TEST_TOKEN}  # the host's token reached the Hub ...
        scan_for_token(
            result.stdout, result.stderr, folders=(host.host.user.home / "tpu-grpo/jobs", host.host.state)
        )  # ... and nothing else

        # the card: the Hub's format, this run's numbers; beside the model, in its SHA256SUMS
        card = ModelCard(hub.file_bytes(REPO, "README.md").decode())
        assert card.data.base_model == "meta-llama/Llama-3.1-8B-Instruct" and card.data.license == "llama3.1"
        for row in (
            "| accuracy | 25% (1/4) | 75% (3/4) |",
            "| batches | 4 (`num_batches`)",
            "| generations per prompt | 4 (`rl.num_generations`) |",
            "MaxText 0.2.3",
            "| machine | ct6e-standard-8t (v6e-8, 8 chips) |",
            "in 1 training job |",
        ):
            assert row in card.content, row
        sums = (host.host.user.home / "tpu-grpo/models/pub/SHA256SUMS").read_text()
        assert f"{hashlib.sha256(saved['README.md']).hexdigest()}  README.md" in sums.splitlines()

        # a re-run sends nothing and commits nothing
        uploads, commits = list(hub.uploads), len(repo.commits)
        again = host.invoke("publish", "--repo", REPO, "--json", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout)["uploaded"] == [] and json.loads(again.stdout)["already_there"] == len(saved)
        assert hub.uploads == uploads and len(repo.commits) == commits
        assert not [request for request in hub.requests if request[0] == "PUT"][len(uploads) :]

    # fetch brings the card home too
    fetched = host.invoke("fetch", "--run", "pub", "--to", str(tmp_path / "model"))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert (tmp_path / "model/README.md").read_bytes() == saved["README.md"]


def test_a_file_is_reported_uploaded_only_once_the_hubs_commit_holds_it(workload_host, hub_client):
    """Small files (the card, config.json, the tokenizer's) travel in the commit itself: when the Hub refuses the
    commit, no file is reported uploaded (sent ones are said sent), and the run again uploads them all."""
    host = workload_host
    host.give_client(hub_client)
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

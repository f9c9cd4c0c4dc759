"""`invoke runs` against a throwaway host: the run the pipeline saved, then fetched to this laptop, and the table
still there (from the laptop's copy) when the host does not answer."""

from __future__ import annotations

import json

from tests.support import FAST


def test_runs_lists_the_host_runs_then_the_laptops_copy_when_the_host_is_gone(workload_host, tmp_path):
    host = workload_host
    assert host.invoke("pipeline", "--batches", "4", "--run-name", "gsm8k-4", *FAST).returncode == 0
    first = json.loads(host.invoke("runs", "--json").stdout)
    [row] = first["runs"]
    assert first["sources"] == {"host": "answered", "laptop": "answered"}
    assert (row["run"], row["model"], row["dataset"], row["loss"], row["batches"], row["state"]) == (
        "gsm8k-4",
        "llama3.1-8b-Instruct",
        "openai/gsm8k",
        "grpo",
        4,
        "saved",
    )
    assert (row["steps"], row["total_steps"], row["accuracy_before"], row["accuracy_after"]) == (4, 4, 0.0, 0.0)
    assert (row["chips"], row["capacity"], row["where"]) == (8, "reservation", ["host: ~/tpu-grpo/models/gsm8k-4"])
    assert row["job_hours"] >= 0 and row["cost_usd"] is not None
    # its export scored the checkpoint it converted on the test examples after the 10 that chose it
    assert (row["report"]["start"], row["report"]["stop"], row["report"]["score"]["stage"]) == (10, 20, "pre")

    fetched = host.invoke("fetch", "--run", "gsm8k-4", "--to", str(tmp_path / "model"))
    assert fetched.returncode == 0, fetched.stderr
    table = host.invoke("runs")
    assert table.returncode == 0 and "gsm8k-4" in table.stdout and "fetched" in table.stdout

    host.host.vm.lose()  # the VM is gone: its sshd, its disk
    gone = host.invoke("runs", "--json")
    assert gone.returncode == 0, gone.stderr
    found = json.loads(gone.stdout)
    assert found["sources"]["host"].startswith("no answer: ") and found["sources"]["laptop"] == "answered"
    assert [(row["run"], row["state"], row["where"]) for row in found["runs"]] == [
        ("gsm8k-4", "fetched", [f"laptop: {tmp_path / 'model'}"])
    ]


def test_metrics_compare_overlays_two_runs_of_the_host(workload_host, tmp_path):
    host = workload_host
    assert host.invoke("convert").returncode == 0
    for name, generations in (("g2", "2"), ("g4", "4")):
        trained = host.invoke(
            "train", "--batches", "4", "--run-name", name, "--set", f"rl.num_generations={generations}"
        )
        assert trained.returncode == 0, trained.stderr
    compared = host.invoke("metrics", "--compare", "g2", "--compare", "g4", "--json", "--out", str(tmp_path / "c.png"))
    assert compared.returncode == 0, compared.stderr
    found = json.loads(compared.stdout)
    assert [run["run"] for run in found["runs"]] == ["g2", "g4"]
    assert [run["train:rl.num_generations"] for run in found["runs"]] == ["2", "4"]
    assert found["plot"] == str(tmp_path / "c.png") and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"

"""`invoke timeline` gathered from a test host where provisioning, the pipeline and fetch really ran."""

from __future__ import annotations

import json

from tests.support import FAST


def test_timeline_of_a_host_that_provisioned_trained_and_fetched(workload_host, tmp_path):
    host = workload_host
    host.control(line_delay_s=0.002)
    done = host.invoke("pipeline", "--batches", "4", "--run-name", "tl", *FAST)
    assert done.returncode == 0, done.stdout + done.stderr
    busy = host.host.user.home / ".tpu-grpo-busy"
    assert not busy.exists()  # nothing on this host took a lease yet
    assert host.invoke("fetch", "--run", "tl", "--to", str(tmp_path / "model")).returncode == 0
    assert busy.is_dir() and not any(busy.iterdir())  # the fetch held a lease (the idle stop waits), and let it go
    result = host.invoke("timeline", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    labels = [phase["label"] for phase in data["phases"]]
    # (the stand-in replays the recorded log faster than it was written: its start-up shrinks to nothing)
    for wanted in (
        "boot until SSH answers",
        "convert",
        "tl: GRPO steps 1-2",
        "tl: evaluation at step 2",
        "tl: GRPO steps 3-4",
        "export tl",
        "save tl",
        "fetch tl",
    ):
        assert any(label.startswith(wanted) for label in labels), (wanted, data["phases"])
    order = [
        next(i for i, label in enumerate(labels) if label.startswith(name))
        for name in ("convert", "tl: GRPO steps 1-2", "export tl", "save tl", "fetch tl")
    ]
    assert order == sorted(order)
    assert 0 < data["training_seconds"] <= data["paid_seconds"] and 0 < data["training_share"] <= 1
    assert (host.host.state / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = host.invoke("timeline")
    assert "where the hours of" in shown.stdout and "paid since boot" in shown.stdout

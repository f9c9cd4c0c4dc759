"""`invoke status` shows what the TPU is doing: tpu-info's Python API on the host (here the stand-in
tpu_info in tests/doubles/standin, which returns what the real package's functions return)."""

from __future__ import annotations

import json
import shutil

from tests.support import wait_for

GIB = 1 << 30


def test_status_shows_each_chips_hbm_and_duty_cycle_while_training(workload_host):
    host = workload_host
    idle = json.loads(host.invoke("status", "--json").stdout)["tpu"]
    assert idle == {"chip": "v6e", "chips": 8, "owners": [], "usage": []}
    assert "TPU: 8 v6e chips, idle" in host.invoke("status").stdout

    assert host.invoke("convert").returncode == 0
    host.control(hold_s=120, hbm_used_bytes=25 * GIB, duty_cycle_pct=91.5)
    assert host.invoke("train", "--batches", "4", "--detach").returncode == 0
    wait_for(lambda: len(host.records()) == 2, what="the training to start")
    busy = json.loads(host.invoke("status", "--json").stdout)["tpu"]
    assert busy["owners"] == [host.records()[-1]["pid"]]
    assert busy["usage"] == [
        {"device": index, "hbm_used": 25 * GIB, "hbm_total": 32 * GIB, "duty_cycle_pct": 91.5} for index in range(8)
    ]
    shown = host.invoke("status").stdout
    assert f"held by pid {busy['owners'][0]}" in shown
    assert shown.count("25.00 GiB") == 8 and shown.count("32.00 GiB") == 8 and "91.5%" in shown and "78%" in shown
    assert host.invoke("cancel").returncode == 0


def test_status_without_tpu_info_says_how_to_get_it(workload_host):
    shutil.rmtree(workload_host.host.user.home / "standin/tpu_info")
    result = workload_host.invoke("status")
    assert result.returncode == 0, result.stderr
    assert "TPU: tpu-info is not in the venv; fix: uv run invoke provision" in result.stdout

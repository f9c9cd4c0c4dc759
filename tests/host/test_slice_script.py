"""A slice pod's script run for real as PID 1 of its own PID namespace: a SIGTERM reaches MaxText."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support import DOUBLES, TEST_TOKEN, this_python
from tests.tutorial import RUN
from tpu_grpo.jobs import maxtext


def test_a_sigterm_to_a_slice_pods_script_reaches_maxtext(tmp_path, bucket):
    """A pod's script is PID 1 of its container (here: of a PID namespace of its own), which ignores a SIGTERM it
    has no handler for; it passes it on to MaxText (the stand-in, which records it), and exits with its code."""
    import signal
    import time
    from dataclasses import replace

    from tests.support import FIXTURES
    from tpu_grpo.catalog.stores import store_for

    run = replace(RUN, store=store_for(f"gs://{bucket}/runs"), use_pathways=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".standin.json").write_text(json.dumps({"fixtures": str(FIXTURES), "hold_s": 120}))
    tools = this_python(tmp_path)
    env = {
        "PATH": f"{tools}:/usr/bin:/bin",
        "HOME": str(home),
        "HF_TOKEN": TEST_TOKEN,
        "PYTHONPATH": str(DOUBLES / "standin"),
        "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
    }
    pod = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "bash",
            "-c",
            maxtext.script(run, "convert", maxtext.Placement(pod=True)),
        ],
        env=env,
    )
    try:
        records = home / ".standin/records.jsonl"
        for _ in range(300):
            if records.is_file():
                break
            time.sleep(0.05)
        time.sleep(1)  # the stand-in is converting (then holding: hold_s)
        [script] = [int(pid) for pid in Path(f"/proc/{pod.pid}/task/{pod.pid}/children").read_text().split()]
        status = Path(f"/proc/{script}/status").read_text()
        assert [line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")] == ["1"], status
        os.kill(script, signal.SIGTERM)
        assert pod.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        pod.kill()
        pod.wait()
    [received] = [json.loads(line) for line in (home / ".standin/signals.jsonl").read_text().splitlines()]
    assert received["module"] == maxtext.MODULES["convert"] and received["signal"] == "SIGTERM"

"""Saving and fetching a model, without a host: how remote paths are quoted (the rest runs against a throwaway
host: tests/host/test_artifacts.py)."""

from __future__ import annotations

import subprocess

from tpu_grpo.host import artifacts


def test_shell_path_quotes_everything_but_a_leading_tilde(tmp_path):
    assert artifacts.shell_path("~/hf trained/") == "~/'hf trained'"
    assert artifacts.shell_path("/dev/shm/x/hf-trained/") == "/dev/shm/x/hf-trained"
    assert artifacts.shell_path("/tmp/$(touch pwned)") == "'/tmp/$(touch pwned)'"
    assert artifacts.shell_path("~") == "~"
    echoed = subprocess.run(
        ["bash", "-c", f"echo {artifacts.shell_path('~/a b/$(touch pwned)')}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"HOME": "/home/someone"},
    )
    assert echoed.stdout == "/home/someone/a b/$(touch pwned)\n"
    assert not (tmp_path / "pwned").exists()

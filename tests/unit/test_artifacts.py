"""Saving a model, without a host: the save script takes its folders as they are named, a leading `~/` as the home
(the rest runs against a throwaway host: tests/host/test_artifacts.py)."""

from __future__ import annotations

import subprocess

from tpu_grpo.host import artifacts


def test_a_save_takes_its_folders_as_named_and_a_leading_tilde_as_the_home(tmp_path):
    home = tmp_path / "home"
    source = home / "a b" / "$(touch pwned)"
    source.mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"weights")
    saved = subprocess.run(
        ["bash", "-c", artifacts.save_script("~/a b/$(touch pwned)/", "~/saved 'it'/")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )
    assert saved.returncode == 0, saved.stderr
    assert (home / "saved 'it'" / "model.safetensors").read_bytes() == b"weights"
    assert (home / "saved 'it'" / artifacts.SUMS).read_text().endswith("  model.safetensors\n")
    assert not (tmp_path / "pwned").exists() and not (home / "pwned").exists()

"""What `invoke status` says of the TPU chips, from tpu-info's answers (the host's side: tests/host/test_chips.py)."""

from __future__ import annotations

from tpu_grpo.host import chips


def test_the_summary_says_whether_a_workload_holds_the_chips():
    assert (
        chips.summary({"chip": "v6e", "chips": 8, "owners": [4242], "usage": []})
        == "TPU: 8 v6e chips, held by pid 4242"
    )
    assert "idle (no process holds them" in chips.summary({"chip": "v6e", "chips": 8, "owners": [], "usage": []})
    assert (
        chips.summary({"chip": None, "chips": 0, "owners": [], "usage": []})
        == "TPU: tpu-info sees no TPU chips on this host"
    )

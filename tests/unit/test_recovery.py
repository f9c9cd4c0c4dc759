"""`invoke pipeline --recover N`, the loop at its seams: how many lost VMs are brought back, and what a run that
succeeds after a loss returns (the loss itself, on throwaway hosts: tests/host/test_recovery.py)."""

from __future__ import annotations

import json

import pytest

# ---------------------------------------------------------------- the recovery loop itself, at its seams


@pytest.mark.parametrize("recover", [0, 1, 3])
def test_recover_n_brings_back_at_most_n_lost_vms_and_the_next_loss_fails(tmp_path, monkeypatch, recover):
    """Every attempt loses the VM: N losses are brought back, the (N+1)th ends the run with its error; the
    timeline holds each loss and resume, with the steps redone exactly (last step printed - checkpoint)."""
    from tpu_grpo.jobs import recovery, vm_jobs

    monkeypatch.setenv("TPU_GRPO_STATE", str(tmp_path))
    attempts, brought = [], []

    def attempt():
        attempts.append(1)
        raise vm_jobs.VmGone(f"lost {len(attempts)}", "TERMINATED")

    def bring_back():
        brought.append(1)
        return 10 * len(brought), 10 * len(brought) + 7  # the newest checkpoint, the last step printed

    timeline = recovery.RecoveryLog.of("r")
    said = []
    with pytest.raises(vm_jobs.VmGone, match=f"lost {recover + 1}"):
        recovery.keep_going(attempt, None, bring_back, recover, lambda: timeline, said.append)
    assert (len(attempts), len(brought)) == (recover + 1, recover)
    entries = [json.loads(line) for line in timeline.path.read_text().splitlines()] if recover else []
    assert [entry["event"] for entry in entries] == ["lost", "resumed"] * recover
    for number, resumed in enumerate(entries[1::2], 1):
        assert (resumed["from_checkpoint"], resumed["last_step_before"], resumed["steps_redone"]) == (
            10 * number,
            10 * number + 7,
            7,
        )
    assert len([line for line in said if line.startswith("the VM is lost (TERMINATED)")]) == recover


def test_a_run_that_succeeds_after_a_loss_returns_its_outcome(tmp_path, monkeypatch):
    from tpu_grpo.jobs import recovery, vm_jobs

    monkeypatch.setenv("TPU_GRPO_STATE", str(tmp_path))
    results = iter([vm_jobs.VmGone("lost", "DELETED"), "done"])

    def attempt():
        outcome = next(results)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    timeline = recovery.RecoveryLog.of("r")
    assert recovery.keep_going(attempt, None, lambda: (None, 3), 1, lambda: timeline, lambda line: None) == "done"
    [lost, resumed] = [json.loads(line) for line in timeline.path.read_text().splitlines()]
    assert lost["state"] == "DELETED" and (resumed["from_checkpoint"], resumed["steps_redone"]) == (None, 0)

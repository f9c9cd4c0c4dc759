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


def test_a_run_resumed_after_a_lost_vm_still_chooses_by_the_scores_taken_before_the_loss(monkeypatch):
    """The lost VM's training scored batch 10 at 80%; the training that resumed it, batch 20 at 20%: the export
    converts checkpoint 10 (every training job of the run is read, the lost one's log from the data disk)."""
    import dataclasses

    from tests.tutorial import RUN
    from tpu_grpo.jobs import pipeline, vm_jobs

    def scored(step: int, accuracy: float) -> str:
        return (
            f"W1206 10:00:00.000000 1 hooks.py:98] Intermediate Eval (step={step}): corr=1, total=4, "
            f"accuracy={accuracy}%, partial_accuracy={accuracy}%, format_accuracy=100.0%, mean_reward=1.0000"
        )

    run = dataclasses.replace(RUN, batches=20, run_name="durable")
    jobs = [
        vm_jobs.Job("20261206-100000.000-train", "train", "durable", "lost", None, 0.0, None, 0),
        vm_jobs.Job("20261206-110000.000-train", "train", "durable", "finished", 0, 1.0, 2.0, 0),
        vm_jobs.Job("20261206-120000.000-train", "train", "other", "finished", 0, 1.0, 2.0, 0),
    ]
    logs = {jobs[0].id: scored(10, 80.0), jobs[1].id: scored(20, 20.0), jobs[2].id: scored(20, 99.0)}
    monkeypatch.setattr(vm_jobs, "list_jobs", lambda connection: jobs)
    monkeypatch.setattr(vm_jobs, "read_log", lambda connection, job_id: logs[job_id].encode())
    monkeypatch.setattr(pipeline, "checkpoint_steps", lambda connection, run: [10, 20])
    assert pipeline.scored(None, run).export_step == 10

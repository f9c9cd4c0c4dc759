"""The host's job records, without a host (job ids sort by start time), and the contract of where jobs run."""

from __future__ import annotations

from tpu_grpo.jobs import vm_jobs


def test_job_ids_sort_by_start_time_even_within_one_second():
    """A step that fails at once lets the next start in the same second; "export" < "train" must
    not make the job list (and so "the newest job" of logs and status) put export first."""
    second = 1796315554.0  # 2026-12-03 16:32:34 UTC
    train, export, again = (
        vm_jobs.new_id("train", second + 0.25),
        vm_jobs.new_id("export", second + 0.7),
        vm_jobs.new_id("export", second + 0.701),
    )
    assert (train, export, again) == (
        "20261203-163234.250-train",
        "20261203-163234.700-export",
        "20261203-163234.701-export",
    )
    assert sorted([again, export, train]) == [train, export, again]


def test_a_vm_job_and_a_slice_job_are_one_record_shape():
    """`status --json` gives the same keys on both targets; a VM job that finished non-zero reads as failed, as a
    slice's does."""
    import calendar
    from dataclasses import fields

    from tpu_grpo.jobs.job_records import JobRecord
    from tpu_grpo.jobs.slice_jobs import SliceJob

    start = calendar.timegm((2026, 12, 4, 10, 15, 0))
    vm = vm_jobs.Job(
        "20261204-101500.250-train", "train", "r1", "finished", 3, start + 0.25, start + 60, 10, {"total_steps": 8}
    ).record()
    pod = SliceJob("tpu-grpo-train-r1", "train", "r1", "failed", 3, "2026-12-04T10:15:00Z", None, 8).record()
    assert vm.to_json().keys() == pod.to_json().keys() == {field.name for field in fields(JobRecord)}
    assert (vm.state, vm.started, vm.finished, vm.total_steps) == (
        "failed",
        "2026-12-04T10:15:00Z",
        "2026-12-04T10:16:00Z",
        8,
    )
    assert (pod.id, pod.state, pod.started, pod.finished) == (
        "tpu-grpo-train-r1",
        "failed",
        "2026-12-04T10:15:00Z",
        None,
    )


def test_the_target_and_source_contracts_are_written_and_kept_by_both_kinds():
    """Each operation of the two interfaces says what it promises (a docstring on the protocol), the VM's and the
    slice's classes implement every one with its signature, and what they return is frozen data a task renders."""
    import dataclasses
    import inspect

    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    for protocol, kinds in (
        (targets.Target, (targets.VmTarget, targets.SliceTarget)),
        (sources.Source, (sources.VmSource, sources.SliceSource)),
    ):
        operations = [name for name, value in vars(protocol).items() if inspect.isfunction(value) and name[0] != "_"]
        assert len(operations) >= 4
        for name in operations:
            promised = getattr(protocol, name)
            assert (promised.__doc__ or "").strip(), f"{protocol.__name__}.{name} says nothing of what it promises"
            for kind in kinds:
                made = getattr(kind, name, None)
                assert made is not None, f"{kind.__name__} lacks {name}"
                assert list(inspect.signature(made).parameters) == list(inspect.signature(promised).parameters)
    for record in (targets.Started, targets.Status, targets.Finished):
        assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen  # type: ignore[attr-defined]

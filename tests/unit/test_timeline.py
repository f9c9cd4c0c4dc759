"""`invoke timeline`: the phases of a VM's hours, built from what the tasks record; the training's inside from
MaxText's real recorded log (tests/data/maxtext-0.2.3). Gathered from a real host: tests/host/test_timeline.py."""

from __future__ import annotations

from datetime import datetime

from tests.support import FIXTURES
from tpu_grpo.jobs import vm_jobs
from tpu_grpo.results import timeline

LOG = (FIXTURES / "train_rl.cpu-rehearsal.log").read_text().splitlines()


def _at(clock: str) -> float:
    """A time of the recorded run (2026-12-02, the log's clock) as seconds."""
    return datetime(2026, 12, 2, *map(int, clock.split(":")[:2])).timestamp() + float(clock.split(":")[2])


def test_a_training_splits_into_start_up_step_ranges_and_evaluations_by_its_logs_clock():
    started, log_end, ended = _at("14:22:40"), _at("14:23:22.246774"), _at("14:23:23")
    phases = timeline.training_phases("smoke", started, ended, log_end, LOG)
    assert [(phase.kind, phase.label) for phase in phases] == [
        ("startup", "smoke: start"),
        ("startup", "smoke: weights"),
        ("startup", "smoke: vLLM start and compile"),
        ("eval", "smoke: evaluation before training"),
        ("train", "smoke: GRPO steps 1-2"),
        ("eval", "smoke: evaluation at step 2"),
        ("train", "smoke: GRPO steps 3-4"),
        ("eval", "smoke: evaluation at step 4"),
        ("eval", "smoke: evaluation after training"),
    ]
    starts = {phase.label: (round(phase.start - started, 3), round(phase.seconds, 3)) for phase in phases}
    # from the log's own times: MaxText's start-up lines (the reference model at 14:22:51.400, the RL cluster at
    # 14:23:03.846, the trainer at 06.554), Starting RL training at 07.531, step 2 at 21.594, eval 2 at 21.663, ...
    assert starts["smoke: start"] == (0.0, round(_at("14:22:51.400292") - started, 3))
    assert starts["smoke: weights"][1] == round(_at("14:23:03.845697") - _at("14:22:51.400292"), 3)
    assert starts["smoke: vLLM start and compile"][1] == round(_at("14:23:06.553774") - _at("14:23:03.845697"), 3)
    assert starts["smoke: evaluation before training"] == (
        round(_at("14:23:06.553774") - started, 3),
        round(_at("14:23:07.531409") - _at("14:23:06.553774"), 3),
    )
    assert starts["smoke: GRPO steps 1-2"] == (
        round(_at("14:23:07.531409") - started, 3),
        round(_at("14:23:21.594429") - _at("14:23:07.531409"), 3),
    )
    assert starts["smoke: evaluation at step 2"][1] == round(_at("14:23:21.662907") - _at("14:23:21.594429"), 3)
    assert starts["smoke: GRPO steps 3-4"][1] == round(_at("14:23:22.069841") - _at("14:23:21.662907"), 3)
    assert all(started <= phase.start <= phase.end <= ended for phase in phases)


def test_the_log_is_placed_by_its_last_line_and_kept_within_the_job():
    """A host whose clock zone is not the log's, or a replay: the log's last line is when the log was last
    written; a phase that would start before the job starts with it."""
    started = _at("14:23:20")  # the job started later than the log's first lines say
    phases = timeline.training_phases("r", started, started + 3, started + 2.5, LOG)
    assert phases[0].start == started and all(started <= p.start <= p.end <= started + 3 for p in phases)
    assert phases[-1].end == started + 2.5


def test_idle_gaps_and_the_share_of_the_paid_time_that_trained():
    booted = 1_000_000.0
    job = vm_jobs.Job("20261204-000000.000-train", "train", "r", "finished", 0, booted + 600, booted + 3600, 10, {})
    found = {
        "boot": booted,
        "sshd": booted + 30,
        "now": booted + 7200,
        "provisioning": [{"steps": [{"step": "MaxText", "status": "changed", "started": booted + 60, "seconds": 240}]}],
        "downloads": [{"model": "meta-llama/Llama-3.1-8B-Instruct", "started": booted + 70, "finished": booted + 400}],
        "saves": [],
        "jobs": [job],
        "logs": {},
    }
    built = timeline.build("u@vm", found, [{"run": "r", "started": booted + 5000, "finished": booted + 5100}])
    kinds = [(phase.kind, phase.start - booted, phase.end - booted) for phase in built.phases]
    assert ("idle", 400, 600) in kinds and ("idle", 3600, 5000) in kinds and ("idle", 5100, 7200) in kinds
    assert ("train", 600, 3600) in kinds and ("fetch", 5000, 5100) in kinds and ("vm", 0, 30) in kinds
    assert built.to_json()["training_share"] == round(3000 / 7200, 4)


def test_the_search_for_chips_that_made_the_vm_comes_before_its_boot():
    """`invoke up`'s attempts (tpu_grpo/cloud/search.py's record) are phases before the boot: the newest search that
    began before it, never an older one, and the paid time still counts from the boot."""
    booted = 3_000_000.0

    def attempt(zone: str, started: float, seconds: float, kind: str | None) -> dict:
        refusal = {"kind": kind, "message": "..."} if kind else None
        return {"place": {"zone": zone, "capacity": "spot"}, "started": started, "seconds": seconds, "refusal": refusal}

    older = {"attempts": [attempt("us-east5-b", booted - 90_000, 30, None)]}
    newest = {
        "attempts": [
            attempt("us-east5-b", booted - 200, 40, "stockout"),
            attempt("us-east5-a", booted - 150, 160, None),
        ]
    }
    later = {"attempts": [attempt("us-east5-a", booted + 500, 10, None)]}  # an `up` after the boot: not this VM's
    found = {
        "boot": booted,
        "now": booted + 600,
        "provisioning": [],
        "downloads": [],
        "saves": [],
        "jobs": [],
        "logs": {},
    }
    built = timeline.build("u@vm", found, [], [older, newest, later])
    searched = [
        (phase.label, phase.start - booted, phase.end - booted) for phase in built.phases if phase.kind == "search"
    ]
    assert searched == [
        ("chips: spot in us-east5-b, refused: stockout", -200, -160),
        ("chips: spot in us-east5-a, got chips", -150, 10),
    ]
    assert built.paid_s == 600


def test_idle_is_only_where_nothing_ran_when_phases_overlap():
    """The base model's download runs beside the provisioning steps, and outlasts them: no idle is shown while
    it still runs, only after it (and before the training)."""
    booted = 2_000_000.0
    job = vm_jobs.Job("20261204-010000.000-train", "train", "r", "finished", 0, booted + 2500, booted + 3000, 10, {})
    found = {
        "boot": booted,
        "sshd": booted + 30,
        "now": booted + 3000,
        "provisioning": [
            {
                "steps": [
                    {"step": "uv", "status": "changed", "started": booted + 60, "seconds": 20},
                    {"step": "MaxText", "status": "changed", "started": booted + 100, "seconds": 200},
                ]
            }
        ],
        "downloads": [{"model": "meta-llama/Llama-3.1-8B-Instruct", "started": booted + 70, "finished": booted + 2000}],
        "saves": [],
        "jobs": [job],
        "logs": {},
    }
    built = timeline.build("u@vm", found, [])
    idle = [(phase.start - booted, phase.end - booted) for phase in built.phases if phase.kind == "idle"]
    assert idle == [(2000, 2500)]


def test_the_paid_hours_are_priced_at_the_capacity_of_the_vms_newest_job():
    """The timeline carries the chip-hours since boot and their cost at the capacity's price, with its source; before
    any job says the machine and capacity, it says nothing of a cost."""
    from tpu_grpo.catalog.capacity import CAPACITIES

    booted = 1796000000.0
    meta = {"capacity": "flex-start", "inputs": {"machine": "ct6e-standard-4t"}}
    job = vm_jobs.Job("20261204-000000.000-convert", "convert", "r", "finished", 0, booted + 60, booted + 600, 10, meta)
    found = {
        "boot": booted,
        "now": booted + 2 * 3600,
        "provisioning": [],
        "downloads": [],
        "saves": [],
        "logs": {},
        "jobs": [job],
    }
    built = timeline.build("u@vm", found, [])
    assert (built.chips, built.capacity, built.chip_hours) == (4, "flex-start", 8.0)
    assert built.cost == (
        round(8 * CAPACITIES["flex-start"].usd_per_chip_hour, 2),
        CAPACITIES["flex-start"].price_source,
    )
    data = built.to_json()
    assert (data["chip_hours"], data["cost_usd"], data["price_source"]) == (8.0, built.cost[0], built.cost[1])
    assert timeline.build("u@vm", {**found, "jobs": []}, []).cost is None
    # a VM made anew on other capacity and machine since an older job: the newest job's say what is paid now
    older = vm_jobs.Job(
        "20261203-000000.000-train",
        "train",
        "r",
        "finished",
        0,
        booted - 9000,
        booted - 8000,
        10,
        {"capacity": "reservation", "inputs": {"machine": "ct6e-standard-8t"}},
    )
    both = timeline.build("u@vm", {**found, "jobs": [older, job]}, [])
    assert (both.chips, both.capacity, both.chip_hours) == (4, "flex-start", 8.0)


def test_only_the_stacks_own_searches_are_its_vms(tmp_path, monkeypatch):
    """Two stacks on one laptop: a VM of `dev` shows dev's search for chips, never prod's (made the same minute);
    a VM named by --host alone, which no stack's search is known to have made, shows none."""
    from tpu_grpo.config import laptop_paths

    monkeypatch.setenv(laptop_paths.STATE_ENV, str(tmp_path))
    for stack, started in (("dev", 100.0), ("prod", 110.0)):
        attempt = {"place": {"zone": "us-east5-b", "capacity": "spot"}, "started": started, "seconds": 5.0}
        laptop_paths.write_record(
            tmp_path / "searches" / f"{stack}-{started:.3f}.json",
            {"stack": stack, "attempts": [{**attempt, "refusal": None}]},
        )
    assert [record["stack"] for record in timeline.searches("dev")] == ["dev"]
    assert timeline.searches(None) == []


def test_damaged_laptop_records_say_nothing_rather_than_fail(tmp_path, monkeypatch):
    """Records edited by hand or cut short (round 6: `{"attempts": [1]}`, `[{}]`, `"x"`, a fetch with `started` and no
    `run`) are left out of the timeline, which is built from the rest."""
    from tpu_grpo.config import laptop_paths

    monkeypatch.setenv(laptop_paths.STATE_ENV, str(tmp_path))
    good = {"place": {"zone": "us-east5-b", "capacity": "spot"}, "started": 100.0, "seconds": 5.0, "refusal": None}
    damaged = [{"attempts": [1]}, {"attempts": [{}]}, {"attempts": [{**good, "started": True}]}, {"attempts": "x"}]
    for number, record in enumerate([*damaged, {"attempts": [good]}]):
        laptop_paths.write_record(tmp_path / "searches" / f"dev-{number}.json", {"stack": "dev", **record})
    (tmp_path / "searches" / "dev-9.json").write_text('"x"')
    laptop_paths.write_record(tmp_path / "fetched" / "a.json", {"started": 100.0, "finished": 200.0})
    laptop_paths.write_record(tmp_path / "fetched" / "b.json", {"run": "r", "started": 100.0, "finished": 200.0})
    searched, fetched = timeline.searches("dev"), timeline.fetches()
    assert searched == [{"stack": "dev", "attempts": [good]}] and [record["run"] for record in fetched] == ["r"]
    found = {"boot": 150.0, "now": 300.0, "provisioning": [], "downloads": [], "jobs": [], "saves": [], "logs": {}}
    built = timeline.build("u@vm", found, fetched, searched)
    assert [phase.label for phase in built.phases if phase.kind in ("fetch", "search")] == [
        "chips: spot in us-east5-b, got chips",
        "fetch r",
    ]

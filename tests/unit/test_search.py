"""The search for chips (tpu_grpo/cloud/search.py): `invoke up` and a recovery against the Pulumi CLI double answering
each place with a refusal quoted from its cited source (tests/doubles/pulumi_cli.REFUSALS), and properties of the
search over generated places and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.doubles.pulumi_cli import ANOTHER_RESOURCES_ERROR, PulumiCli
from tests.support import invoke
from tpu_grpo.cloud import search
from tpu_grpo.config.keys import Place


@pytest.fixture(scope="module", autouse=True)
def state_of_this_module(tmp_path_factory):
    """The properties below search in this process, whose state folder would be the checkout's own (.tpu-grpo):
    their records go to a folder of the module's instead."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPU_GRPO_STATE", str(tmp_path_factory.mktemp("state")))
        yield


def stack_config(stack_dir) -> dict:
    return yaml.safe_load((stack_dir / "Pulumi.dev.yaml").read_text())["config"]


def state_of(cli: PulumiCli) -> dict[str, dict]:
    """The double's state after the updates, by resource type's last part."""
    resources = json.loads((cli.folder / "state.json").read_text())["deployment"]["resources"]
    return {resource["type"].rsplit(":", 1)[-1]: resource["inputs"] for resource in resources}


def ups(cli: PulumiCli) -> int:
    return sum(call.startswith("up ") for call in cli.calls())


def test_three_places_whose_first_two_are_out_of_chips_end_with_a_vm_in_the_third(spot_stack, cloud):
    stack_dir, _ = spot_stack
    cli, env = cloud
    cli.answer_at("us-east5-b", "spot", "stockout")
    cli.answer_at("us-east5-a", "spot", "stockout")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith(("spot in", "on-demand in"))]
    assert len(said) == 3 == ups(cli)
    assert said[0].startswith("spot in us-east5-b: no chips there now (ZONE_RESOURCE_POOL_EXHAUSTED), ")
    assert said[0].endswith("; next: another place")
    assert said[1].startswith("spot in us-east5-a: no chips there now (ZONE_RESOURCE_POOL_EXHAUSTED)")
    assert said[2].startswith("on-demand in us-central1-b: got chips, ")
    assert "the VM is in us-central1-b (on-demand), recorded as tpu-grpo:placed" in result.stdout
    assert json.loads(stack_config(stack_dir)["tpu-grpo:placed"]) == {"zone": "us-central1-b", "capacity": "on-demand"}
    made = state_of(cli)
    assert made["Instance"]["zone"] == made["Disk"]["zone"] == "us-central1-b"
    assert made["Instance"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert made["Subnetwork"]["region"] == "us-central1"  # the VM's subnet follows it; the stack's bucket does not
    settings_now = json.loads(invoke("settings", "--json", cwd=stack_dir, env=env).stdout)["settings"]
    assert settings_now["gcp:zone"]["value"] == "us-east5-b"  # the stack's own first choice stays as written
    [record] = (Path(env["TPU_GRPO_STATE"]) / "searches").glob("dev-*.json")
    attempts = json.loads(record.read_text())["attempts"]
    assert [a["refusal"] and a["refusal"]["kind"] for a in attempts] == ["stockout", "stockout", None]

    again = invoke("up", "--yes", cwd=stack_dir, env=env)  # where the VM is comes first: one attempt
    assert again.returncode == 0, again.stderr
    assert ups(cli) == 4
    assert "on-demand in us-central1-b: got chips" in again.stdout
    assert "replaces:" not in again.stdout


def test_a_stockout_reported_after_another_resources_error_moves_the_search_on(spot_stack, cloud):
    """The engine reports every error of an update: one no marker knows (another resource's) before the VM's stockout
    is still a stockout, and the search tries the next place rather than ending."""
    stack_dir, _ = spot_stack
    cli, env = cloud
    cli.answer_at("us-east5-b", "spot", "stockout", after=ANOTHER_RESOURCES_ERROR)
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith(("spot in", "on-demand in"))]
    assert said[0].startswith("spot in us-east5-b: no chips there now (ZONE_RESOURCE_POOL_EXHAUSTED), ")
    assert said[1].startswith("spot in us-east5-a: got chips, ") and ups(cli) == 2


def test_a_regional_quota_rules_out_its_region_for_that_quota_only(spot_stack, cloud):
    stack_dir, values = spot_stack
    cli, env = cloud
    values["tpu-grpo:fallback"] = [
        {"zone": "us-east5-a"},  # the same region and quota: skipped
        {"zone": "us-east5-a", "capacity": "on-demand"},  # another quota: tried
    ]
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli.answer_at("us-east5-b", "spot", "quota")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert ups(cli) == 2
    assert "spot in us-east5-b: a quota of the project is too low (quota TPUS_PER_TPU_FAMILY), " in result.stdout
    assert "next: a place outside us-east5 or of another quota" in result.stdout
    assert "on-demand in us-east5-a: got chips" in result.stdout
    assert "spot in us-east5-a" not in result.stdout


def test_a_permission_refusal_ends_the_search_at_once(spot_stack, cloud):
    stack_dir, _ = spot_stack
    cli, env = cloud
    cli.answer_at("us-east5-b", "spot", "permission")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255
    assert ups(cli) == 1
    assert "spot in us-east5-b: not allowed (IAM_PERMISSION_DENIED), " in result.stdout
    assert "; fix: grant the account Pulumi uses the roles docs/settings.md#roles lists, then uv run invoke up" in (
        result.stdout
    )
    assert "tpu-grpo:placed" not in stack_config(stack_dir)  # the stack's own place: nothing to record


def test_a_stack_without_fallback_is_one_attempt_and_its_file_is_never_written(stack_dir, cloud):
    cli, env = cloud
    before = (stack_dir / "Pulumi.dev.yaml").read_text()
    cli.answer_at("us-east5-b", "reservation", "stockout")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255
    assert ups(cli) == 1
    assert result.stderr.startswith("what went wrong: the zone has no capacity outside reservations")
    assert (stack_dir / "Pulumi.dev.yaml").read_text() == before
    assert not any(call.startswith("config set") for call in cli.calls())


def test_a_data_disk_nobody_can_vouch_for_is_not_made_anew_elsewhere(spot_stack, cloud):
    """The VM was made in us-east5-b; its zone is out of chips and the VM does not answer (lost): what only its data
    disk holds is unknown, so the search stops before it deletes it, and the stack file still says us-east5-b."""
    stack_dir, values = spot_stack
    cli, env = cloud
    cli.deployed(values)
    cli.answer_at("us-east5-b", "spot", "stockout")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 1, result.stderr
    assert ups(cli) == 1
    assert result.stderr.startswith("error: refusing to update stack 'dev': the update deletes the data disk, and ")
    assert "replaces: Disk tpu-grpo-data (zone us-east5-b -> us-east5-a)" in result.stdout
    assert "the VM does not answer" in result.stderr
    # the search's next place, not a change to the stack file: no "undo the change", no `up` where it just failed
    assert result.stderr.rstrip().endswith(
        "fix: pass --move-disk, which copies the disk to us-east5-a (the search tries it again), or run "
        "`uv run invoke up` once spot in us-east5-b has chips"
    )
    assert "tpu-grpo:placed" not in stack_config(stack_dir)
    assert state_of(cli)["Disk"]["zone"] == "us-east5-b"


def test_a_recovery_whose_zone_has_no_chips_moves_to_the_next_place_with_its_data(
    spot_stack, cloud, monkeypatch, tmp_path
):
    """`pipeline --recover`'s bring_back: the lost VM's zone is out of chips, so the next place is tried, the data
    disk moved there (a snapshot: what the run wrote comes along), never made anew empty."""
    from tpu_grpo.config import settings as stack_settings
    from tpu_grpo.jobs import recovery

    stack_dir, values = spot_stack
    cli, env = cloud
    cli.deployed(values)
    cli.answer_at("us-east5-b", "spot", "stockout")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(stack_dir)
    monkeypatch.setattr(recovery, "provision_again", lambda values, found, say: say("provisioned"))
    said: list[str] = []
    recovery.bring_back(stack_settings.load("dev"), lambda: [], {}, said.append)
    attempts = [line for line in said if line.startswith("spot in")]
    assert attempts[0].startswith("spot in us-east5-b: no chips there now")
    assert attempts[1].startswith("spot in us-east5-a: got chips")
    assert said[-1] == "provisioned"
    assert state_of(cli)["Snapshot"]["zone"] == "us-east5-b"
    assert json.loads(stack_config(stack_dir)["tpu-grpo:placed"])["movedFrom"] == "us-east5-b"


def test_plan_lists_the_places_in_the_order_up_tries_them_with_their_prices(spot_stack, cloud):
    from tpu_grpo.catalog.capacity import CAPACITIES, SNAPSHOT_USD_PER_GB_MONTH

    stack_dir, values = spot_stack
    _, env = cloud
    places = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)["places"]
    snapshot = round(500 * SNAPSHOT_USD_PER_GB_MONTH, 2)
    assert [(p["zone"], p["capacity"], p["here"], p["move_snapshot_usd_per_month"]) for p in places] == [
        ("us-east5-b", "spot", True, None),
        ("us-east5-a", "spot", False, snapshot),
        ("us-central1-b", "on-demand", False, snapshot),
    ]
    assert places[2]["usd_per_hour"] == 8 * CAPACITIES["on-demand"].usd_per_chip_hour
    assert places[0]["draws_on"] == "preemptible TPU v6e quota of us-east5"
    assert places[2]["draws_on"] == "TPU v6e quota of us-central1"
    shown = invoke("plan", cwd=stack_dir, env={**env, "COLUMNS": "250"}).stdout
    assert "Places to get chips, in the order `invoke up` tries them" in shown and "on-demand in us-central1-b" in shown


def test_the_places_in_the_data_disks_zone_come_first_then_the_stacks_order():
    places = [Place("us-east5-b", "spot"), Place("us-east5-a", "spot"), Place("us-east5-a", "on-demand")]
    assert search.order(places, "us-east5-a") == [places[1], places[2], places[0]]
    assert search.order(places, None) == places


# Properties over generated places and refusals.
ZONES = ("us-east5-a", "us-east5-b", "us-central1-b", "europe-west4-a")
CAPACITIES = ("spot", "on-demand", "flex-start", "reservation")
KINDS = {  # a refusal's message for each class, quoted from tests/unit/test_refusals.py's cited cases
    "stockout": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "regional quota": "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-west1.",
    "global quota": "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 1.0 globally.",
    "reservation": "Insufficient reserved capacity.",
    "permission": "Policy update access denied.",
    "unknown": "error: something new",
    "chips": None,
}
places_strategy = st.lists(
    st.builds(Place, st.sampled_from(ZONES), st.sampled_from(CAPACITIES)), min_size=1, max_size=6, unique=True
)


QUOTA_OF = {"spot": "preemptible", "flex-start": "preemptible", "on-demand": "standard", "reservation": "standard"}


def ruled_out(kind: str, tried: Place, other: Place) -> bool:
    """What each class of refusal rules out, as docs/capacity.md's table says it (the oracle: not search.rules_out)."""
    return {
        "stockout": other == tried,
        "regional quota": other.region == tried.region
        and QUOTA_OF[str(other.capacity)] == QUOTA_OF[str(tried.capacity)],
        "global quota": True,
        "reservation": other == tried,  # a reservation is zonal
        "permission": True,
        "unknown": True,
        "chips": True,  # nothing after a success
    }[kind]


@settings(max_examples=200, deadline=None)
@given(places=places_strategy, answers=st.lists(st.sampled_from(sorted(KINDS)), min_size=6, max_size=6))
def test_the_search_never_tries_a_ruled_out_place_and_says_one_line_per_attempt(places, answers):
    answer_of = {place: answers[index] for index, place in enumerate(places)}
    tried: list[Place] = []
    lines: list[str] = []

    def attempt(place):
        tried.append(place)
        message = KINDS[answer_of[place]]
        return (0, []) if message is None else (255, [message])

    attempts = search.search(places, attempt, lines.append)
    assert [a.place for a in attempts] == tried
    assert len(lines) == len(attempts) and all(line.startswith(f"{a.place}: ") for a, line in zip(attempts, lines))
    for index, place in enumerate(places):  # in order: tried exactly when no place tried before rules it out
        before = [earlier for earlier in tried if places.index(earlier) < index]
        assert (place in tried) == (not any(ruled_out(answer_of[earlier], earlier, place) for earlier in before))


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(st.sampled_from(["stockout", "chips", "regional quota"]), min_size=3, max_size=3),
    move=st.booleans(),
    unsaved=st.booleans(),
)
def test_no_search_deletes_a_data_disk_that_holds_unsaved_runs(spot_stack_values, answers, move, unsaved):
    """The disk is in us-east5-b with runs (unsaved or not); whatever the places answer, an `up` that makes it anew
    elsewhere comes only after the guard passed, or moves it (a snapshot), and never after the guard refused; and
    only then is the protected disk released for that update (without it, Pulumi's engine refuses)."""
    import contextlib

    from tpu_grpo.results.sources import DataDiskAtRisk

    chosen, cloud = spot_stack_values
    places = chosen.candidates
    disk = {"zone": "us-east5-b", "original": True}
    events: list[str] = []

    @contextlib.contextmanager
    def released(stack_name, why, say, stdout=None):
        events.extend(f"released {urn.rsplit('::', 1)[-1]}" for urn in why)
        yield

    def keep_data(at):
        events.append("guard")
        if unsaved:
            raise DataDiskAtRisk("runs only on the disk")

    def up(at, **_):
        lost = disk["original"] and at.zone != disk["zone"]
        assert not lost or at.here.moved_from == "us-east5-b" or "guard" in events
        assert not lost or events[-1] == "released tpu-grpo-data"  # the engine refuses otherwise
        events.append(f"up {at.here}")
        disk.update(zone=at.zone, original=disk["original"] and not lost)
        message = KINDS[answers[[p.same(at.here) for p in places].index(True)]]
        return (0, []) if message is None else (255, [message])

    def preview(at, declared, replace, env):
        return 0, [DiskChange()] if at.zone != disk["zone"] else [], []

    try:
        with cloud(up, preview, released):
            search.find_chips(chosen, yes=True, move=move, keep_data=keep_data, say=lambda line: None)
    except DataDiskAtRisk:
        assert unsaved and not move
        assert events[-1] == "guard"
    assert disk["original"] or move or not unsaved


class DiskChange:
    type = "gcp:compute/disk:Disk"
    action = "replace"
    name = "tpu-grpo-data"

    def because(self) -> str:
        return "zone"


@pytest.fixture(scope="module")
def spot_stack_values(tmp_path_factory):
    """The spot stack's settings, and a context that stands in for the cloud's side of find_chips (the Pulumi CLI)
    with functions, for properties that run a search many times."""
    import contextlib
    import subprocess
    from unittest import mock

    from infra import offline
    from tpu_grpo.cloud import stack
    from tpu_grpo.config import settings as stack_settings

    folder = tmp_path_factory.mktemp("stack")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "key")], check=True)
    raw = {
        "gcp:project": "grpo-lab-123",
        "gcp:zone": "us-east5-b",
        "tpu-grpo:capacity": "spot",
        "tpu-grpo:sshPublicKeyPath": str(folder / "key.pub"),
        "tpu-grpo:sshSourceRanges": ["203.0.113.7/32"],
        "tpu-grpo:fallback": [{"zone": "us-east5-a"}, {"zone": "us-central1-b", "capacity": "on-demand"}],
    }

    @contextlib.contextmanager
    def cloud(up, preview, released):
        disk = {"type": DiskChange.type, "urn": f"urn:pulumi:dev::tpu-grpo::x${DiskChange.type}::tpu-grpo-data"}
        with contextlib.ExitStack() as patches:
            for owner, name, function in [
                (stack, "up", up),
                (stack, "engine_changes", preview),
                (stack, "state_resources", lambda name: [{**disk, "inputs": {"zone": "us-east5-b"}, "protect": True}]),
                (stack, "released", released),
                (search, "record_place", lambda name, place: None),
                (search, "read_stack_file", lambda name, root: dict(raw)),
                (search, "project_root", lambda: folder),
                (offline, "run", lambda raw, name, **_: (stack_settings.parse(raw, name, folder), [], {})),
            ]:
                patches.enter_context(mock.patch.object(owner, name, function))
            yield

    return stack_settings.parse(raw, "dev", folder), cloud


def test_a_search_where_every_place_refused_records_no_place(spot_stack, cloud):
    """Each attempt's place reaches the program as that update's input; the stack file records a place only once it
    has chips, so a search that found none leaves the stack where it was, not pinned to the last place tried (the
    dearest here, on-demand)."""
    stack_dir, values = spot_stack
    cli, env = cloud
    for zone, capacity in (("us-east5-b", "spot"), ("us-east5-a", "spot"), ("us-central1-b", "on-demand")):
        cli.answer_at(zone, capacity, "stockout")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 255
    assert ups(cli) == 3
    last = [line for line in result.stdout.splitlines() if line.startswith("on-demand in us-central1-b: ")]
    assert last[0].endswith("; no place of the stack is left to try (Pulumi's error follows)")  # not "next: ..."
    # what the last attempt made before its VM was refused stays, named and priced, with the command that removes it
    from tpu_grpo.config import costs, settings

    there = settings.parse(
        {**values, "tpu-grpo:placed": {"zone": "us-central1-b", "capacity": "on-demand"}}, "dev", stack_dir
    )
    [disk] = [d for d in costs.disks(there) if d["disk"] == "data disk"]
    left = next(line for line in result.stdout.splitlines() if line.startswith("left by the search"))
    assert left.startswith("left by the search in us-central1-b: ") and "Disk" in left and "Subnetwork" in left
    assert f"the data disk costs ${disk['usd_per_hour']:.3f} an hour while it exists" in left
    assert left.endswith(
        "remove them: uv run invoke down --force (this search made the disk: it holds nothing), or run "
        "`uv run invoke up` again later"
    )
    removed = invoke("down", "--force", "--yes", cwd=stack_dir, env=env)  # as printed, the prompt answered
    assert removed.returncode == 0, removed.stderr
    assert json.loads((cli.folder / "state.json").read_text())["deployment"]["resources"] == []
    assert "tpu-grpo:placed" not in stack_config(stack_dir)
    assert not any(call.startswith("config set") for call in cli.calls())


def test_a_rerun_keeps_the_running_vm_where_it_is_and_never_replaces_it_to_try_the_first_place(
    stack_dir, stack_values, cloud
):
    """The VM runs on-demand at the stack's second place, in its first place's zone; spot there has chips again. A
    rerun of `up` tried spot first (places ordered by zone alone) and replaced the running VM for it, losing what ran
    (and, with spot stocked out again, ending with no VM). The place of the running VM is the one it tries."""
    values = {key: value for key, value in stack_values.items() if key != "tpu-grpo:reservation"}
    values.update({"tpu-grpo:capacity": "spot", "tpu-grpo:fallback": [{"zone": "us-east5-b", "capacity": "on-demand"}]})
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli, env = cloud
    cli.answer_at("us-east5-b", "spot", "stockout")
    first = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert first.returncode == 0, first.stderr
    assert state_of(cli)["Instance"]["scheduling"]["provisioningModel"] == "STANDARD"
    (cli.folder / "places.json").write_text("{}")  # spot has chips again
    again = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert again.returncode == 0, again.stderr
    assert "the VM runs in us-east5-b (on-demand), one of the stack's places: `up` keeps it there" in again.stdout
    assert "replaces:" not in again.stdout and ups(cli) == 3
    assert state_of(cli)["Instance"]["scheduling"]["provisioningModel"] == "STANDARD"


def test_a_reservation_refused_in_one_zone_is_tried_in_the_next(stack_dir, stack_values, cloud):
    """A reservation is zonal: one of that name in us-east5-b with no chips (or none there at all) says nothing of
    the stack's next place, a reservation in us-east5-a, which the search ruled out with it."""
    values = {**stack_values, "tpu-grpo:fallback": [{"zone": "us-east5-a"}]}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli, env = cloud
    cli.answer_at("us-east5-b", "reservation", "reservation")
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    assert ups(cli) == 2 and "reservation in us-east5-a: got chips" in result.stdout
    assert state_of(cli)["Instance"]["zone"] == "us-east5-a"


def test_after_down_the_next_search_starts_again_from_the_stacks_first_place(spot_stack, cloud):
    """The last search ended on on-demand in us-central1-b, two and a half times spot's price, recorded as placed.
    Once `down` took the VM and its disk, nothing holds the stack there: the next `up` tries spot in us-east5-b
    first, which has chips again, instead of sticking to the dear place."""
    stack_dir, _ = spot_stack
    cli, env = cloud
    cli.answer_at("us-east5-b", "spot", "stockout")
    cli.answer_at("us-east5-a", "spot", "stockout")
    assert invoke("up", "--yes", cwd=stack_dir, env=env).returncode == 0
    assert json.loads(stack_config(stack_dir)["tpu-grpo:placed"])["capacity"] == "on-demand"
    down = invoke("down", "--force", "--yes", cwd=stack_dir, env=env)
    assert down.returncode == 0, down.stderr
    # the stack file no longer says the stack is where nothing of it is: plan reads gcp:zone and capacity again
    assert "tpu-grpo:placed" not in stack_config(stack_dir)
    assert "tpu-grpo:placed is out of stack 'dev': the next `uv run invoke up` starts at gcp:zone" in down.stdout
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)
    assert (plan["cost"]["zone"], plan["cost"]["capacity"]) == ("us-east5-b", "spot")
    (cli.folder / "places.json").write_text("{}")  # every place has chips now
    again = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert again.returncode == 0, again.stderr
    assert [line.split(":")[0] for line in again.stdout.splitlines() if " in us-" in line.split(":")[0]] == [
        "spot in us-east5-b"
    ]
    assert state_of(cli)["Instance"]["scheduling"]["provisioningModel"] == "SPOT"


def test_a_search_parses_the_settings_once_whatever_its_attempts(spot_stack, cloud, monkeypatch):
    """Three places, the first two out of chips: the stack file is parsed once for the whole search (a parse per
    place, each checked as the stack's own would be), not once again for each attempt's place."""
    from tpu_grpo.config import settings

    stack_dir, values = spot_stack
    cli, env = cloud
    for zone in ("us-east5-b", "us-east5-a"):
        cli.answer_at(zone, "spot", "stockout")
    monkeypatch.chdir(stack_dir)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    chosen = settings.parse(values, "dev", stack_dir)
    parsed = []
    real = settings._parse
    monkeypatch.setattr(settings, "_parse", lambda *args, **kwargs: parsed.append(args[0]) or real(*args, **kwargs))
    outcome = search.find_chips(chosen, yes=True, move=False, keep_data=lambda at: None, say=lambda line: None)
    assert outcome.code == 0 and len(outcome.attempts) == 3
    assert sorted((raw["gcp:zone"], raw["tpu-grpo:capacity"]) for raw in parsed) == [
        ("us-central1-b", "on-demand"),
        ("us-east5-a", "spot"),
        ("us-east5-b", "spot"),
    ]


def test_what_a_search_left_beside_an_older_disk_is_named_without_a_forced_down(stack_dir, stack_values):
    """A new vmName's search got no chips and left its empty disk beside the older one, which may hold runs:
    `down --force` would delete that one too, so the line names what was left and offers no --force."""
    from tpu_grpo.config.settings import parse

    at = parse({k: v for k, v in stack_values.items() if v is not None}, "dev", stack_dir)
    disk = "gcp:compute/disk:Disk"
    older = {"urn": f"urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost${disk}::tpu-grpo-data", "type": disk}
    new = {"urn": f"urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost${disk}::tpu-other-data", "type": disk}
    said = search.left_behind(at, [older], [older, new])
    assert said is not None and said.startswith("left by the search in us-east5-b: Disk (the data disk costs $")
    assert "--force" not in said and "checking the runs of its older disk first" in said
    assert search.left_behind(at, [older], [older]) is None

"""A stack's life as sequences: a Hypothesis state machine over what a user does (edit a setting, a VM switched to a
slice and back, `up` with or without `--move-disk`, one interrupted by Ctrl-C or whose disk or VM the cloud refuses,
train, fetch, an idle stop, a preemption, upgrading tpu-grpo over a stack an earlier release made, `down`), against a
stateful double of Pulumi's engine and the cloud written from their sources (tests/doubles/cloud.py: protect, pending
creates, 409s), with tpu-grpo's own program, search and guards deciding. After every step:

- no run that only the data disk holds is deleted without `--force`;
- nothing billed exists outside the state (a VM a timed-out create left behind);
- nothing tpu-grpo did not create is removed (another cluster's node role), and every grant the state holds is
  granted in the cloud;
- what `plan` said (tpu_grpo/cloud/stack.py's preview: infra/replacements.py) is what `up` did;
- a running VM is replaced only for a setting the user changed, never by a search for chips elsewhere (the cloud
  runs out of chips at a place, and `tpu-grpo:fallback` lists other places).

Each defect of issue 60 is one this machine finds when its guard is taken away (a smaller disk, a renamed grant, the
project-wide role, the 20-minute create timeout); with tpu-grpo's own disk guard taken away, the engine's protect still
keeps every run (issue 77), and a release that did not wait for the check loses one. A fixed seed and budget here; a
larger one with
`TPU_GRPO_LIFECYCLE_EXAMPLES=2000 uv run pytest tests/unit/test_lifecycle.py`."""

from __future__ import annotations

import contextlib
import json
import os
from unittest import mock

import pytest
import yaml
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from infra import replacements
from infra.offline import run as RUN_THE_PROGRAM  # before a test patches it (StackLife.up)
from tests.doubles import provider
from tests.doubles.cloud import Cloud, Engine
from tests.support import ROOT
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.config.keys import DEFAULT_ACCOUNT
from tpu_grpo.config.settings import PLACED

EXAMPLES = int(os.environ.get("TPU_GRPO_LIFECYCLE_EXAMPLES", "0"))
#: Another GKE cluster of the project already relies on GKE's node role for the default compute account.
OTHERS_NODE_ROLE = (
    "gcp:projects:grpo-lab-123",
    "roles/container.defaultNodeServiceAccount",
    f"serviceAccount:{DEFAULT_ACCOUNT}",
)
SLICE = {
    "tpu-grpo:slice": "v6e-16",
    "tpu-grpo:usePathways": "true",
    "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
    "tpu-grpo:bucket": "true",
}
#: What a user may write with `pulumi config set`, key by key: valid values only (a bad one is refused before
#: anything happens, which tests/unit/test_fuzz.py holds).
EDITS = {
    "tpu-grpo:dataDiskGb": ["100", "500", "1000"],
    "gcp:zone": ["us-east5-b", "us-east5-a"],
    "tpu-grpo:vmName": ["tpu-grpo", "tpu-other"],
    "tpu-grpo:serviceAccount": [None, "sa@grpo-lab-123.iam.gserviceaccount.com"],
    "capacity": list(CAPACITIES),
    "shape": ["vm", "slice"],
    "tpu-grpo:fallback": [
        None,
        [{"zone": "us-east5-a", "capacity": "on-demand"}],
        [{"zone": "us-east5-b", "capacity": "on-demand"}],
    ],
}
#: Where Google may be out of chips: (zone, capacity).
PLACES = [(zone, capacity) for zone in ("us-east5-b", "us-east5-a") for capacity in CAPACITIES]
#: The program's resources on each stack file seen, or None where the settings are refused.
PROGRAM_RUNS: dict[str, list | None] = {}
CAPACITY = {
    "reservation": {"tpu-grpo:reservation": "v6e-8-calendar"},
    "spot": {"tpu-grpo:capacity": "spot"},
    "flex-start": {"tpu-grpo:capacity": "flex-start", "tpu-grpo:maxRunHours": "24"},
    "on-demand": {"tpu-grpo:capacity": "on-demand"},
}


def previous_release(engine: Engine, release: int = 0) -> None:
    """The state an earlier release of the program left (0: the one before this, 1: the one before that): its names
    (infra/common.py's RENAMED, backwards), and only the bucket kept on delete."""
    from infra.common import RENAMED
    from infra.replacements import BUCKET, CLUSTER, INSTANCE
    from tests.doubles.cloud import Entry

    vm = next(name for (type_, name) in engine.state if type_ in (INSTANCE, CLUSTER))
    older = {now.format(vm=vm): olds[min(release, len(olds) - 1)].format(vm=vm) for now, olds in RENAMED.items()}
    state = {}
    for (type_, name), entry in engine.state.items():
        old = older.get(name, name)
        state[(type_, old)] = Entry(type_, old, entry.inputs, entry.retain and type_ == BUCKET, parent=entry.parent)
        if old != name and (type_, name) in engine.cloud.resources:
            engine.cloud.resources.discard((type_, name))
            engine.cloud.resources.add((type_, old))
    engine.state = state


@pytest.fixture(scope="module", autouse=True)
def state_of_this_module(tmp_path_factory):
    """The machine searches in this process, whose state folder would be the checkout's own (.tpu-grpo), which every
    worker shares: the records of its searches (one name a second) go to a folder of the module's instead."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPU_GRPO_STATE", str(tmp_path_factory.mktemp("state")))
        yield


class StackLife(RuleBasedStateMachine):
    """One user's stack, from an empty project where another cluster already relies on the node role."""

    public_key = ""  # set by the test: a real public key file
    #: tpu-grpo's own guards of the data (`up`'s and `down`'s checks, its table of what replaces what) at work
    guards = True

    def __init__(self):
        super().__init__()
        base = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
        self.values = {
            **base,
            "gcp:project": "grpo-lab-123",
            "tpu-grpo:reservation": "v6e-8-calendar",
            "tpu-grpo:sshSourceRanges": ["203.0.113.7/32"],
            "tpu-grpo:sshPublicKeyPath": self.public_key,
        }
        self.cloud = Cloud(bindings={OTHERS_NODE_ROLE})
        self.engine = Engine(self.cloud)
        self.fetched: set[str] = set()
        self.lost_unsaved: list[str] = []
        self.plan_and_up: list[tuple[set, set]] = []
        self.runs = 0
        self.asked = True  # a setting changed since the last up: a VM replaced for it was asked for
        self.running_replaced: list[str] = []
        self.unnamed: list[str] = []  # billed resources a failed up left in the state and did not name
        self.recorded_without_chips: list[str] = []  # places written to the stack file where no VM came
        self.placed_before = None
        self.user_values = dict(self.values)  # the stack file as the user last wrote it

    # ------------------------------------------------------------------ what the user does

    @initialize(
        shape=st.sampled_from(["vm", "slice"]),
        capacity=st.sampled_from(sorted(CAPACITY)),
        flex_wait=st.integers(0, 120),
        fallback=st.sampled_from(EDITS["tpu-grpo:fallback"]),
        home_out=st.booleans(),
    )
    def a_first_up(self, shape, capacity, flex_wait, fallback, home_out):
        """The first `up`; with a fallback and no chips at the stack's own place, the VM starts at the fallback's."""
        self.edit("shape", shape)
        self.edit("capacity", capacity)
        self.edit("tpu-grpo:fallback", fallback)
        if home_out:
            self.cloud.stockouts.add((self.values["gcp:zone"], capacity))
        self.up(flex_wait, move=False)

    @rule(key=st.sampled_from(sorted(EDITS)), data=st.data())
    def edit_a_setting(self, key, data):
        self.edit(key, data.draw(st.sampled_from(EDITS[key]), label=key))

    def edit(self, key: str, value: str | None) -> None:
        self.asked = True
        self.placed_before = self.values.get(PLACED)
        if key == "capacity":
            for name in ("tpu-grpo:capacity", "tpu-grpo:reservation", "tpu-grpo:maxRunHours"):
                self.values.pop(name, None)
            self.values.update(CAPACITY[value])
        elif key == "shape":
            for name in SLICE:
                self.values.pop(name, None)
            if value == "slice":
                self.values.update(SLICE)
        elif value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value
        self.user_values = {k: v for k, v in self.values.items() if k != PLACED}

    def declared(self, values: dict | None = None) -> list | None:
        """The program on the stack file as it is now (or on `values`), or None where tpu-grpo refuses the settings
        (exit 2)."""
        return self.program(self.values if values is None else values)[1]

    @staticmethod
    def program(values: dict) -> tuple:
        """offline.run on these values: (settings, resources), or (None, None) where the settings are refused."""
        key = json.dumps(values, sort_keys=True)
        if key not in PROGRAM_RUNS:  # the same stack files recur across examples: the program is deterministic
            from tpu_grpo.config.errors import SettingsError

            try:
                PROGRAM_RUNS[key] = RUN_THE_PROGRAM(values, "dev")[:2]
            except SettingsError:
                PROGRAM_RUNS[key] = (None, None)
        return PROGRAM_RUNS[key]

    @rule(
        flex_wait=st.integers(0, 120),
        move=st.booleans(),
        fault=st.sampled_from([None, None, None, "interrupt", replacements.DISK, replacements.INSTANCE]),
    )
    def up(self, flex_wait, move, fault=None):
        """`invoke up [--move-disk]`: refresh, then tpu-grpo's own search (tpu_grpo/cloud/search.py: its data disk
        guard and the release of what it protects) with the engine double as Pulumi's CLI, its preview the double's."""
        from infra import offline, replacements
        from tpu_grpo.cloud import search, stack
        from tpu_grpo.config.errors import UserError

        chosen, _ = self.program(self.values)
        if chosen is None:
            return
        with self.engine_as_pulumi((stack, "_pulumi_json", lambda *args: self.engine.export_with_pending())):
            for urn, id_ in stack.pending_creates("dev"):  # select_and_refresh's refresh adopts them
                assert id_, urn
                self.engine.import_pending(urn)
        assert not self.engine.pending, "a create an interrupt left pending was not settled"
        self.engine.refresh()
        for urn in stack.unmarked_retained(self.engine.export()):  # select_and_refresh's forget_unmarked
            self.engine.state_delete(urn)
        with self.engine_as_pulumi():
            stack.protect_unmarked("dev")  # and its protect_unmarked
        ran: dict = {}

        def run_program(raw, name, **_):
            ran["declared"] = self.declared(raw)
            return (*self.program(raw), {})

        def pulumi_up(at, **_):
            declared = ran["declared"]
            changes = replacements.diff(self.engine.export(), declared)  # what `invoke plan` estimates offline
            stopped = {
                (replacements.INSTANCE, name)
                for name in self.cloud.stopped  # `up` replaces them (--replace)
                if (replacements.INSTANCE, name) in self.engine.state
                and any((r.type, r.name) == (replacements.INSTANCE, name) for r in declared)
            }
            said = (
                {(c.type, c.name) for c in changes if c.action == "replace"} | stopped,
                {(c.type, c.name) for c in changes if c.action == "delete"},
            )
            before = self.disk_runs()
            running = self.engine.state.get((replacements.INSTANCE, self.vm() or ""))
            wanted = next((r for r in declared if r.type == replacements.INSTANCE), None)
            done = self.engine.up(declared, flex_wait, fault)
            if (
                running
                and running.name not in self.cloud.stopped
                and not self.asked
                and (replacements.INSTANCE, running.name) in done.replaced | done.deleted
                and (wanted is None or Cloud.place_of(wanted.inputs) != Cloud.place_of(running.inputs))
            ):  # the running VM went for another place the user did not ask for
                self.running_replaced.append(f"{Cloud.place_of(running.inputs)}: {sorted(self.cloud.stockouts)}")
            self.note_lost(before)
            if done.error == "update canceled":
                raise stack.Cancelled(done.error)  # run_pulumi, after Pulumi's cancel
            if done.error:
                return 255, [done.error]
            self.plan_and_up.append((said, (done.replaced, done.deleted)))
            return 0, []

        def keep_data(at):
            if self.unsaved():
                raise UserError("runs only the data disk holds")  # sources.keep_what_only_the_data_disk_holds

        def engine_preview(at, declared, replace, env):  # the engine's own preview, from the provider's schemas
            return 0, provider.changes(self.engine.export(), declared), []

        with self.engine_as_pulumi(
            (stack, "up", pulumi_up),
            (stack, "engine_changes", engine_preview),
            (offline, "run", run_program),
            (search, "record_place", lambda name, place: self.values.update({PLACED: place.to_json()})),
            (search, "read_stack_file", lambda name, root: dict(self.values)),
            (search, "updating", lambda name: contextlib.nullcontext()),
        ):
            said: list[str] = []
            billed_before = self.billed_in_state()
            try:
                outcome = search.find_chips(chosen, yes=True, move=move, keep_data=keep_data, say=said.append)
            except UserError:
                return  # refused: a grant it declares would go, or runs only the disk holds
        if outcome.code == 0:
            self.asked = False  # the stack now is what its file says
        else:  # what an up that got no VM made and the state keeps is named, with what removes it
            left = next((line for line in said if line.startswith("left by the search")), "")
            made = self.billed_in_state() - billed_before
            if not any(kind == replacements.INSTANCE for kind, _ in made):
                self.unnamed += [f"{kind} {name}" for kind, name in made if kind.rsplit(":", 1)[-1] not in left]
        placed = self.values.get(PLACED)
        vm_shape = not self.values.get("tpu-grpo:slice")  # a slice's place is its pools'
        if vm_shape and placed and placed != self.placed_before and self.vm_zone() != placed["zone"]:
            self.recorded_without_chips.append(str(placed))
        self.placed_before = placed

    @rule(place=st.sampled_from(PLACES), out=st.booleans())
    def google_runs_out_of_chips(self, place, out):
        """A stockout at one place, or its end."""
        (self.cloud.stockouts.add if out else self.cloud.stockouts.discard)(place)

    def engine_as_pulumi(self, *patches) -> contextlib.ExitStack:
        """The engine double answering tpu_grpo/cloud/stack.py's reads and edits of the state, and `patches`."""
        from tpu_grpo.cloud import stack

        def state_edit(command, name, urns, stdout=None):
            for urn in urns:
                self.engine.set_protect(urn, command == "protect")
            return 0

        exits = contextlib.ExitStack()
        for owner, name, function in [
            (stack, "state_resources", lambda name: self.engine.export()),
            (stack, "_state_edit", state_edit),
            *patches,
        ]:
            exits.enter_context(mock.patch.object(owner, name, function))
        return exits

    @rule()
    def train_and_save(self):
        """`invoke pipeline`: a run saved on the data disk of the stack's VM."""
        disk = self.data_disk()
        if disk is not None and not self.values.get("tpu-grpo:slice"):
            self.runs += 1
            self.cloud.disks[disk].add(f"run-{self.runs}")

    @rule()
    def fetch(self):
        disk = self.data_disk()
        if disk is not None:
            self.fetched |= self.cloud.disks[disk]

    @rule()
    def idle_stop(self):
        vm = self.vm()
        if vm:
            self.cloud.stopped.add(vm)

    @rule()
    def preemption(self):
        """A spot VM preempted, a flex-start or reservation VM at its end: Compute Engine deletes it."""
        from infra.replacements import INSTANCE

        self.cloud.resources = {(t, n) for t, n in self.cloud.resources if t != INSTANCE}
        self.cloud.stopped.clear()

    @precondition(lambda self: any(type_.endswith(("Instance", "Cluster")) for type_, _ in self.engine.state))
    @rule(release=st.integers(0, 1))
    def made_by_an_earlier_release(self, release):
        previous_release(self.engine, release)

    @rule(force=st.booleans())
    def down(self, force):
        """`invoke down`: refused while a run is only on the data disk, unless --force; then what the program keeps
        and the state does not mark is forgotten, and Pulumi destroys the rest."""
        from tpu_grpo.cloud import stack

        if self.guards and self.unsaved() and not force:
            return
        for urn in stack.unmarked_retained(self.engine.export()):  # destroy's forget_unmarked
            self.engine.state_delete(urn)
        if force:
            self.fetched |= self.unsaved()  # deleting them was asked for
        protected = {  # what down's check (passed, or --force) releases; without tpu-grpo's guards, nothing
            entry["urn"]: "down's check" for entry in self.engine.export() if entry.get("protect") and self.guards
        }
        with self.engine_as_pulumi(), stack.released("dev", protected, lambda line: None):
            self.engine.destroy()

    # ------------------------------------------------------------------ what must hold after every step

    def vm(self) -> str | None:
        from infra.replacements import INSTANCE

        return next((name for type_, name in self.cloud.resources if type_ == INSTANCE), None)

    def data_disk(self) -> str | None:
        return next(iter(self.cloud.disks), None)

    def disk_runs(self) -> set[str]:
        """The runs the data disk holds, or a move's snapshot while the disk made from it is not made yet."""
        return {run for held in (*self.cloud.disks.values(), *self.cloud.snapshots.values()) for run in held}

    def unsaved(self) -> set[str]:
        return self.disk_runs() - self.fetched

    def note_lost(self, before: set[str]) -> None:
        self.lost_unsaved += sorted(before - self.disk_runs() - self.fetched)

    @invariant()
    def no_unsaved_run_is_deleted(self):
        assert not self.lost_unsaved, f"runs only the data disk held were deleted: {self.lost_unsaved}"

    @invariant()
    def nothing_billed_is_outside_the_state(self):
        """Every VM is in the state, or in its pending operations, which the next `up` settles."""
        outside = self.cloud.resources - set(self.engine.state) - set(self.engine.pending)
        assert not {key for key in outside if key[0].startswith("gcp:compute/instance")}, outside

    @invariant()
    def nothing_of_others_is_removed_and_every_grant_held(self):
        from tests.doubles.cloud import IAM_TYPES

        assert OTHERS_NODE_ROLE in self.cloud.bindings, "another cluster's node role was removed"
        for entry in self.engine.state.values():
            if entry.type in IAM_TYPES:
                assert self.cloud.binding(entry.type, entry.inputs) in self.cloud.bindings, entry.name

    def billed_in_state(self) -> set[tuple[str, str]]:
        return {key for key in self.engine.state if key[0] in (replacements.DISK, replacements.INSTANCE)}

    def vm_zone(self) -> str | None:
        vm = next((e for e in self.engine.state.values() if e.type == replacements.INSTANCE), None)
        return vm.inputs["zone"] if vm else None

    @invariant()
    def nothing_billed_is_left_unnamed(self):
        """A failed `up` names what it made and left (a data disk billed while it exists), with what removes it."""
        assert not self.unnamed, self.unnamed

    @invariant()
    def the_stack_file_changes_only_as_asked(self):
        """Only the user's edits change the stack file, and `up` records a place only where it got chips."""
        assert {k: v for k, v in self.values.items() if k != PLACED} == self.user_values
        assert not self.recorded_without_chips, self.recorded_without_chips

    @invariant()
    def a_running_vm_is_never_replaced_by_a_search(self):
        """Only a setting the user changed may replace a running VM; a search for chips elsewhere (a fallback place
        tried before the one the VM is in) never does (issue 79)."""
        assert not self.running_replaced, self.running_replaced

    @invariant()
    def what_plan_said_is_what_up_did(self):
        """`invoke plan`'s offline estimate (infra/replacements.py's table) is what the engine did, by the
        provider's own schemas (tests/doubles/provider.py): two readings of the provider, written apart."""
        for said, did in self.plan_and_up if self.guards else ():
            assert said == did, (said, did)


@pytest.fixture
def life(key_pair):
    StackLife.public_key = str(key_pair[1])
    return StackLife


def test_a_stacks_life_loses_nothing(life):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        life,
        settings=hypothesis_settings(
            max_examples=EXAMPLES or 400, stateful_step_count=20, deadline=None, derandomize=not EXAMPLES, database=None
        ),
    )


def test_with_its_own_disk_guard_removed_the_engine_still_keeps_the_data(life, monkeypatch):
    """tpu-grpo's guards gone (its table of what replaces what emptied, `up`'s check never sees the data disk go,
    `down` checks nothing, so nothing is released): every update or destroy that would delete or replace the
    protected disk is refused by Pulumi's engine, and no run is lost."""
    from hypothesis.stateful import run_state_machine_as_test

    from tpu_grpo.cloud import stack

    monkeypatch.setattr(replacements, "FORCE_NEW", {})
    monkeypatch.setattr(replacements, "FORCE_NEW_IF", {})
    monkeypatch.setattr(stack, "data_disk_lost", lambda changes: False)
    monkeypatch.setattr(life, "guards", False)
    run_state_machine_as_test(
        life,
        settings=hypothesis_settings(
            max_examples=EXAMPLES or 600, stateful_step_count=20, deadline=None, derandomize=not EXAMPLES, database=None
        ),
    )


def test_the_lifecycle_walks_every_capacity_of_the_table():
    """A capacity added to the catalogue is walked here too (its stack settings in CAPACITY), not silently left out."""
    assert set(CAPACITY) == set(CAPACITIES)


def test_a_switch_between_one_vm_and_a_slice_keeps_what_both_declare(stack_values):
    """A URN holds its parent's type: the network, the subnet and the bucket of a stack switched from one VM to a
    slice are the same resources only through their alias under the other component; without it the engine makes
    them anew under a name the project holds (a 409), the old ones still there."""
    import dataclasses

    from tpu_grpo.cloud import stack

    shared = {"tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs", "tpu-grpo:bucket": "true"}
    vm = {k: v for k, v in {**stack_values, **shared}.items() if v is not None}
    slice_ = {**vm, **SLICE}
    engine = Engine(Cloud())
    assert not engine.up(RUN_THE_PROGRAM(vm, "dev")[1]).error
    for urn in stack.releasable(
        replacements.diff(engine.export(), RUN_THE_PROGRAM(slice_, "dev")[1]),
        engine.export(),
        "every run on it is fetched",
    ):
        engine.set_protect(urn, False)  # the data disk goes with the VM: `up`'s check passed
    without_aliases = [
        dataclasses.replace(r, options=dataclasses.replace(r.options, alias_parents=()))
        for r in RUN_THE_PROGRAM(slice_, "dev")[1]
    ]
    refused = Engine(Cloud(set(engine.cloud.resources)), dict(engine.state)).up(without_aliases)
    # the first of them the engine meets (the program registers its resources concurrently: any order)
    assert "409" in refused.error and any(
        name in refused.error for name in ("tpu-grpo-net", "tpu-grpo-subnet", "grpo-lab-runs")
    )
    done = engine.up(RUN_THE_PROGRAM(slice_, "dev")[1])
    assert not done.error, done.error
    kept = {name for (type_, name) in engine.state if type_.endswith(("Network", "Subnetwork", "Bucket"))}
    assert kept == {"tpu-grpo-net", "tpu-grpo-subnet", "store"}
    assert all(entry.parent == "tpu-grpo:index:TpuSlice" for entry in engine.state.values())
    assert not any(type_.endswith(("Network", "Subnetwork", "Bucket")) for type_, _ in done.replaced | done.deleted)


def test_a_disk_moved_twice_keeps_its_runs(life):
    """The machine's find (at 2,000 random examples): moved to us-east5-a and back with --move-disk before any other
    `up`. Were the second move's snapshot a replacement of the first's, the engine would delete the disk first, as a
    dependent of the snapshot it was made from, before snapshotting it: each move's snapshot is its own resource."""
    machine = life()
    machine.a_first_up("vm", "reservation", 0, None, False)
    machine.edit("gcp:zone", "us-east5-a")
    machine.train_and_save()
    machine.up(0, move=True)
    machine.edit("gcp:zone", "us-east5-b")
    machine.up(0, move=True)
    assert machine.disk_runs() == {"run-1"} and not machine.lost_unsaved
    assert machine.cloud.disks and next(iter(machine.cloud.disks.values())) == {"run-1"}

"""The search for chips over a stack's places (`tpu-grpo:fallback`): `invoke up` and a recovery try each place in
turn, classify each refusal (refusals.py) and skip every place it rules out, one line per attempt, and record the
place that got chips in the stack file (`tpu-grpo:placed`), which every later task and `up` read, and which `down`
takes out again: the program reads its place from the stack's config on every update, a plain `pulumi up` too.

The data disk is zonal: a place in another zone either makes it anew (allowed when the disk holds nothing that is
not saved elsewhere: the caller's guard, `down`'s), or moves it (a snapshot, then the new zone's disk made from it:
infra/tpu_host.py). A place where the data disk already is comes first, so that no search moves it needlessly and
none comes back to a zone it moved out of.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.cloud import stack
from tpu_grpo.cloud.refusals import (
    CAPACITY,
    EVERYWHERE,
    MEANINGS,
    PERMISSION,
    PROTECTED,
    REGION,
    UNKNOWN,
    ZONE,
    Refusal,
    classify,
)
from tpu_grpo.config import laptop_paths
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.keys import Place
from tpu_grpo.config.settings import PLACE_ENV, PLACED, Settings, every_place
from tpu_grpo.config.stack_file import project_root, read_stack_file

#: An attempt's `replaces:` line for a data disk an earlier attempt of the same search made, which holds nothing (or
#: what a move's snapshot holds, which stays).
NEW_DISK = "the data disk an earlier attempt made (empty, or from the move's snapshot, which stays) is made anew here"
#: Why an attempt may delete the data disk (stack.releasable): an earlier attempt of this search made it; `keep_data`
#: found every run on it saved elsewhere; the update moves it (a snapshot first).
MADE_BY_THIS_SEARCH = "an earlier attempt of this search made it, and nothing ran on it since"
SAVED_ELSEWHERE = "every run on it is fetched or published"
MOVED = "the update copies it to a snapshot first (--move-disk)"
MOVING = "copied whole: a snapshot of it first, the disk there made from the snapshot, then the old one deleted"
#: The laptop's locks, one a stack (`updating`).
LOCKS = "locks"
#: The laptop's records of searches (`invoke timeline` shows the one that made the VM).
SEARCHES = "searches"


#: What the search does after a refusal, by what it rules out.
NEXT = {
    ZONE: "another place",
    REGION: "a place outside {0.region} or of another quota",
    CAPACITY: "a place of another capacity than {0.capacity}",
    EVERYWHERE: "none, no other place can do better",
}


#: What mends a refusal no other place can do better than, by its kind.
FIXES = {
    PERMISSION: "grant the account Pulumi uses the roles docs/settings.md#roles lists, then uv run invoke up",
    UNKNOWN: "mend what Pulumi's error below says, then uv run invoke up",
}


@dataclass(frozen=True)
class Attempt:
    """One place tried: when, for how long, and the refusal (None: it got chips)."""

    place: Place
    started: float
    seconds: float
    refusal: Refusal | None

    def line(self, places_left: bool) -> str:
        """Where, what, why and how long, in plain words: `spot in us-east5-b: no chips there now
        (ZONE_RESOURCE_POOL_EXHAUSTED), 41 s; next: another place`; the last attempt says what is left to do."""
        took = f"{self.seconds:.0f} s"
        refusal = self.refusal
        if refusal is None:
            return f"{self.place}: got chips, {took}"
        said = f"{self.place}: {MEANINGS[refusal.kind]} ({refusal.said}), {took}"
        if refusal.rules_out == EVERYWHERE and refusal.kind in FIXES:
            return f"{said}; fix: {FIXES[refusal.kind]}"
        if not places_left:
            return f"{said}; no place of the stack is left to try (Pulumi's error follows)"
        return f"{said}; next: {NEXT[refusal.rules_out].format(self.place)}"

    def to_json(self) -> dict:
        refusal = self.refusal
        return {
            "place": self.place.to_json(),
            "started": round(self.started, 3),
            "seconds": round(self.seconds, 3),
            "refusal": None if refusal is None else {"kind": refusal.kind, "message": refusal.message},
        }


def rules_out(attempt: Attempt, other: Place) -> bool:
    """Whether the refusal of `attempt` rules out `other` too: the same zone and capacity (a stockout), the same
    region and quota (a regional quota), the same capacity anywhere (a reservation's trouble), or every place."""
    refusal, tried = attempt.refusal, attempt.place
    if refusal is None:
        return False
    if refusal.rules_out == ZONE:
        return other.same(tried)
    if refusal.rules_out == REGION:
        return other.region == tried.region and CAPACITIES[str(other.capacity)].quota == (
            CAPACITIES[str(tried.capacity)].quota
        )
    if refusal.rules_out == CAPACITY:
        return other.capacity == tried.capacity
    return True


def ends_the_search(refusal: Refusal) -> bool:
    """A refusal after which no place can do better: one that rules out every place (a permission, a global quota,
    an error no marker knows, which would recur everywhere)."""
    return refusal.rules_out == EVERYWHERE


def running_place(chosen: Settings, resources: list[dict]) -> Place | None:
    """The place of the VM the state holds running, where `invoke up` recorded it (`tpu-grpo:placed`) and the stack
    still lists it: a search would try the stack's first place before it, and replacing a running VM there to try
    another capacity (spot before its on-demand) loses what runs, /dev/shm and all, for chips it may not get."""
    placed = chosen.placed
    vm = next((r for r in resources if r.get("type") == stack.INSTANCE_TYPE), None)
    if placed is None or vm is None or chosen.tpu_slice or stack.stopped_vm(chosen, resources):
        return None
    listed = next((place for place in chosen.candidates if place.same(placed)), None)
    return listed if listed and stack.zone_of([vm], stack.INSTANCE_TYPE) == placed.zone else None


def order(places: Sequence[Place], first_zone: str | None) -> list[Place]:
    """The places in the stack's order, those in `first_zone` (the data disk's) first."""
    return sorted(places, key=lambda place: place.zone != first_zone)


def search(
    places: Sequence[Place], attempt: Callable[[Place], tuple[int, list[str]]], say: Callable[[str], None]
) -> list[Attempt]:
    """Try each place in turn until one gets chips (exit 0) or a refusal ends the search, never a place an earlier
    refusal ruled out; `say` one line per attempt. `attempt(place)` is Pulumi's exit code and error messages."""
    attempts: list[Attempt] = []

    def ruled_out(place: Place) -> bool:
        return any(rules_out(earlier, place) for earlier in attempts)

    for number, place in enumerate(places):
        if ruled_out(place):
            continue
        started = time.time()
        code, messages = attempt(place)
        refusal = None if code == 0 else first_refusal(messages)
        attempts.append(Attempt(place, started, time.time() - started, refusal))
        say(attempts[-1].line(not all(map(ruled_out, places[number + 1 :]))))
        if refusal is None or ends_the_search(refusal):
            break
    return attempts


def first_refusal(messages: list[str]) -> Refusal:
    """The first of Pulumi's error messages that a marker knows, else the first (or none) as it is."""
    classified = [classify(message) for message in messages]
    known = [refusal for refusal in classified if refusal.kind != UNKNOWN]
    return (known or classified or [classify("")])[0]


def record_place(stack_name: str, place: Place) -> None:
    """Write `place` into the stack file as `tpu-grpo:placed` (`pulumi config set`, which wants the passphrase of a
    passphrase-protected stack, as `up` does: pulumi/pulumi#9612)."""
    done = subprocess.run(
        ["pulumi", "config", "set", PLACED, json.dumps(place.to_json()), "--stack", stack_name],
        cwd=project_root(),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise UserError(f"could not record {place} in stack '{stack_name}': {done.stderr.strip()}")


def forget_place(stack_name: str) -> str | None:
    """Take `tpu-grpo:placed` out of the stack file once `down` took what was there: nothing holds the stack at that
    place, so the next `up` and every task read gcp:zone and capacity again. What it says, or None (nothing to do)."""
    if PLACED not in read_stack_file(stack_name, project_root()):
        return None
    done = subprocess.run(
        ["pulumi", "config", "rm", PLACED, "--stack", stack_name], cwd=project_root(), capture_output=True, text=True
    )
    if done.returncode:
        return f"{PLACED} stays in stack '{stack_name}' ({done.stderr.strip()}); fix: pulumi config rm {PLACED}"
    return f"{PLACED} is out of stack '{stack_name}': the next `uv run invoke up` starts at gcp:zone and capacity"


def record_search(chosen: Settings, attempts: list[Attempt]) -> None:
    """The search, on the laptop, for `invoke timeline`."""
    if attempts:
        path = laptop_paths.state() / SEARCHES / f"{chosen.stack}-{attempts[0].started:.3f}.json"
        laptop_paths.write_record(path, {"stack": chosen.stack, "attempts": [each.to_json() for each in attempts]})


@dataclass
class Outcome:
    """How a search ended: Pulumi's exit code, the last attempt's error messages and settings, and the attempts."""

    code: int
    messages: list[str]
    settings: Settings
    attempts: list[Attempt]

    @property
    def explanations(self) -> list[str]:
        return stack.explanations(self.settings, self.messages) if self.code else []


def find_chips(
    chosen: Settings,
    *,
    yes: bool,
    move: bool,
    keep_data: Callable[[Settings], None],
    say: Callable[[str], None],
    stdout=None,
) -> Outcome:
    """`pulumi up` at each of the stack's places in turn (search), the stack selected and refreshed already, one
    update of the stack at a time from this laptop (`updating`). An attempt that would make the data disk anew
    elsewhere first calls `keep_data` (which raises while the disk holds what is saved nowhere else), unless `move`:
    then the disk follows, made from a snapshot of the old one. A move whose new disk was never made (its create
    failed after the old disk went) left the snapshot as the only copy: every place makes the disk from it. The data
    disk and that snapshot are protected (infra/tpu_host.py): only the check that passed releases them, for the one
    update it checked. A stack with no fallback is one attempt, and its file is written only to record a move."""
    with updating(chosen.stack):
        return _search_for_chips(chosen, yes=yes, move=move, keep_data=keep_data, say=say, stdout=stdout)


def _search_for_chips(chosen: Settings, *, yes: bool, move: bool, keep_data, say, stdout) -> Outcome:
    from infra import offline, replacements
    from infra.tpu_host import data_disk_name

    resources = stack.state_resources(chosen.stack)
    # a disk moves only where the same VM goes: a slice has none, and a new vmName is a new disk
    disk = data_disk_name(chosen.vm_name)
    own = [r for r in resources if r["urn"].endswith(f"${replacements.DISK}::{disk}")]
    movable = bool(own) and not chosen.tpu_slice
    disk_zone = stack.zone_of(own or resources, replacements.DISK)  # none on a slice, whose state holds no disk
    stranded = None if disk_zone else stack.zone_of(resources, replacements.SNAPSHOT)
    last: dict = {"code": 0, "messages": [], "settings": chosen, "tried": False}
    # why the data disk may go, once known: none in the state at the start, so any later one is this search's own
    checked, recorded = (MADE_BY_THIS_SEARCH if disk_zone is None else None), chosen.placed or chosen.home

    raw = read_stack_file(chosen.stack, project_root())
    every = every_place(raw, chosen.stack, project_root())  # parsed once

    def attempt(place: Place) -> tuple[int, list[str]]:
        nonlocal checked, recorded
        moving = move and movable and place.zone != disk_zone
        placed = Place(place.zone, place.capacity, disk_zone if moving else stranded)
        pinned = bool(chosen.fallback or chosen.placed or placed.moved_from)
        there = every[place.zone, str(place.capacity)]
        at = dataclasses.replace(there, placed=placed) if pinned else there
        at, declared, _ = offline.run({**raw, **({PLACED: placed.to_json()} if pinned else {})}, chosen.stack, at=at)
        last["settings"] = at
        now = stack.state_resources(chosen.stack) if last["tried"] else resources  # as the attempt before left it
        last["tried"] = True
        env = {PLACE_ENV: json.dumps(placed.to_json())} if pinned else {}  # the place reaches the program
        stopped = stack.stopped_vm(at, now)
        if stopped:
            say(
                f"the {at.capacity} VM is {stopped[1]} (stopped when idle, or preempted), and a TPU VM is never "
                "started again: creating it anew around the same data disk"
            )
        replace = ["--replace", stopped[0]] if stopped else []
        code, changes, errors = stack.engine_changes(at, declared, replace, env)
        if code and not any(PROTECTED in error for error in errors):  # the cloud refused already
            last.update(code=code, messages=errors)
            return code, errors
        for change in changes:
            new_disk = checked == MADE_BY_THIS_SEARCH and change.type == replacements.DISK
            if moving and change.type == replacements.DISK:
                say(f"moves: the data disk from {disk_zone} to {place.zone}, {MOVING}")
            else:
                say(f"replaces: {NEW_DISK if new_disk else stack.describe(change)}")
        if stack.strips_a_grant(changes):
            raise UserError(
                f"refusing to update stack '{chosen.stack}': it would delete a grant it declares under another "
                "name (see `replaces:` above); fix: undo the change to vmName, `uv run invoke up` (which adopts "
                "the renamed resources), then change it again"
            )
        if stack.data_disk_lost(changes) and not moving and checked is None:
            keep_data(at)
            checked = SAVED_ELSEWHERE
        why = stack.releasable(changes, now, MOVED, disk) if moving else stack.releasable(changes, now, checked)
        with stack.released(chosen.stack, why, say, stdout):
            code, messages = stack.up(
                at, yes=yes, say=say, stdout=stdout, replace=replace, env=env, checked=changes, declared=declared
            )
        if code == 0 and pinned and recorded != placed:  # recorded once it has chips
            record_place(chosen.stack, placed)
            recorded = placed
        last.update(code=code, messages=messages)
        return code, messages

    running = running_place(chosen, resources)
    if running:  # a rerun keeps what runs: the other places would replace the VM (the user asks by removing its place)
        say(f"the VM runs in {running.zone} ({running.capacity}), one of the stack's places: `up` keeps it there")
    # where a data disk is, first (moving it is slow and needs --move-disk); else the stack's own order: a search never
    # sticks to the place the last one found (the dearest, maybe) once nothing of the stack is there
    places = [running] if running else order(chosen.candidates, disk_zone)
    attempts = search(places, attempt, say if chosen.fallback else lambda line: None)
    if attempts and attempts[-1].refusal is not None:  # with or without a fallback
        left = left_behind(last["settings"], resources, stack.state_resources(chosen.stack))
        if left:
            say(left)
    if chosen.fallback:
        record_search(chosen, attempts)
        if attempts and attempts[-1].refusal is None and len(attempts) > 1:
            say(f"the VM is in {attempts[-1].place.zone} ({attempts[-1].place.capacity}), recorded as {PLACED}")
    return Outcome(last["code"], last["messages"], last["settings"], attempts)


def left_behind(at: Settings, before: list[dict], after: list[dict]) -> str | None:
    """What a search that got no chips made and left (the last place's data disk, network and firewall rule, made
    before its VM was refused), with what it costs and the command that removes it; None when it left nothing."""
    from infra.replacements import DISK
    from tpu_grpo.config import costs

    urns = {resource["urn"] for resource in before}
    made = [
        resource for resource in after if resource["urn"] not in urns and resource.get("type", "").startswith("gcp:")
    ]
    if not made:
        return None
    names = ", ".join(resource["type"].rsplit(":", 1)[-1] for resource in made)
    disk = next((d for d in costs.disks(at) if d["disk"] == "data disk"), None)
    paid = (
        f"the data disk costs ${disk['usd_per_hour']:.3f} an hour while it exists, empty, "
        if disk and any(r["type"] == DISK for r in made)
        else ""
    )
    if any(resource["type"] == DISK for resource in before):  # --force would delete that older disk too
        return (
            f"left by the search in {at.zone}: {names} ({paid}the rest is free); they stay until `uv run invoke up` "
            "gets chips, or `uv run invoke down` removes the stack (checking the runs of its older disk first)"
        )
    return (
        f"left by the search in {at.zone}: {names} ({paid}the rest is free); remove them: uv run invoke down --force "
        "(this search made the disk: it holds nothing), or run `uv run invoke up` again later"
    )


class StackBusy(UserError):
    """Another `invoke up` or recovery of this laptop is updating the stack: nothing was done, nothing is wrong."""

    exit_code = 1


@contextmanager
def updating(stack_name: str) -> Iterator[None]:
    """One update of a stack at a time from this laptop: its place recorded and `pulumi up` run by one `invoke up`
    or recovery while another waits for neither (an flock on a file of the laptop's state folder, released by the
    system when the process ends, however it ends)."""
    path = laptop_paths.state() / LOCKS / f"{stack_name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise StackBusy(
                f"stack '{stack_name}' is being updated from this laptop already ({holder}); fix: wait for that "
                "`uv run invoke up` (or `pipeline --recover`) to end, then run this again"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield

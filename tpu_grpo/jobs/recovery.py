"""Keeping a pipeline going through lost VMs (`invoke pipeline --recover N`).

When the host stops answering, the cloud is asked what became of the VM, through a Pulumi
refresh of the stack: it reads the VM from the Compute Engine API with the credentials and the
resource identity `pulumi up` already uses, and tells a deleted VM (gone from the state) from a
stopped one, with no second client library or credential path on the laptop. A VM that still
runs is a network problem, left to the follow's own reconnection; a stopped, preempted or deleted
one is brought back (`invoke up`: created anew around the same data disk, never started again),
provisioned (fast: the caches are on the data disk), and the same pipeline runs again, which
skips the steps done and lets MaxText resume training after its newest checkpoint.

Every loss and resume is printed and appended to the run's timeline on the laptop
(`.tpu-grpo/runs/RUN/timeline.jsonl`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpu_grpo.cloud import stack
from tpu_grpo.config import laptop_paths, stack_file
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.settings import Settings
from tpu_grpo.host import facts, hosts
from tpu_grpo.jobs import maxtext, pipeline, vm_jobs

#: Compute Engine's states of a VM that is not coming back by itself (a preempted VM is
#: TERMINATED, or deleted with instance_termination_action DELETE); DELETED: gone from the state.
LOST = (*stack.STOPPED, "DELETED")


class RecoveryError(UserError):
    """The VM could not be brought back; one line with the fix."""

    exit_code = 1


def vm_state(chosen: Settings) -> str:
    """What Compute Engine says of the stack's VM after a refresh: RUNNING, TERMINATED, ... or DELETED."""
    subprocess.run(
        ["pulumi", "refresh", "--yes", "--skip-preview", "--stack", chosen.stack],
        capture_output=True,
        cwd=stack_file.project_root(),
    )
    found = stack.instance_state(chosen.stack)
    return found[1] if found else "DELETED"


def gone(chosen: Settings) -> str | None:
    """The VM's state when it is lost (stopped, preempted, deleted); None while it runs."""
    state = vm_state(chosen)
    return state if state in LOST else None


@dataclass
class RecoveryLog:
    """The run's record of losses and resumes, one JSON object a line."""

    path: Path

    @classmethod
    def of(cls, run_name: str) -> RecoveryLog:
        return cls(laptop_paths.run_folder(run_name) / laptop_paths.RECOVERY_TIMELINE)

    def add(self, event: str, **fields) -> dict:
        entry = {"at": round(time.time(), 3), "event": event, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as timeline:
            timeline.write(json.dumps(entry) + "\n")
        return entry


class LastStepPrinted(facts.Fact):
    """The last step the run's newest training printed, or None."""

    script = staticmethod(
        lambda run_name: (
            f"for dir in $(ls -1d {vm_jobs.JOBS}/*-train 2>/dev/null | sort -r); do "
            f'grep -q \'"run": "{run_name}"\' $dir/job.json && '
            "{ grep -ao 'Train step [0-9]*' $dir/log | tail -1; break; }; done; true"
        )
    )
    parse = staticmethod(lambda answer, run_name: int(answer.stdout.split()[-1]) if answer.stdout.split() else None)


def where_training_stands(connection, run: maxtext.Run) -> tuple[int | None, int | None]:
    """(the newest checkpoint step in the run's store, the last step the lost training printed)."""
    steps = pipeline.checkpoint_steps(connection, run)
    return (steps[-1] if steps else None), LastStepPrinted.read(connection, run.name)


def keep_going(
    attempt: Callable[[], object],
    chosen: Settings,
    bring_back: Callable[[], tuple[int | None, int | None]],
    recover: int,
    log: Callable[[], RecoveryLog],
    say: Callable[[str], None],
):
    """Run `attempt` (the pipeline) until it finishes, bringing the VM back up to `recover` times
    after it was lost. Anything else (a failed step, bad input, a VM that runs but does not answer)
    ends it as without --recover. `bring_back()` returns where the training stands."""
    losses = 0
    while True:
        try:
            return attempt()
        except hosts.ConnectError as error:
            if losses >= recover:
                raise
            state = error.state if isinstance(error, vm_jobs.VmGone) else gone(chosen)  # the follow asked already
            if not state:
                raise
            losses += 1
            lost_at = time.time()
            log().add("lost", state=state, error=str(error))  # the run's, named by then (its first attempt asks)
            say(
                f"the VM is lost ({state}); bringing it back ({losses} of {recover}): invoke up, provision, then "
                "the same pipeline"
            )
            newest, printed = bring_back()
            redone = printed - newest if newest is not None and printed is not None and printed > newest else 0
            entry = log().add(
                "resumed",
                gone_s=round(time.time() - lost_at, 1),
                from_checkpoint=newest,
                last_step_before=printed,
                steps_redone=redone,
            )
            say(
                f"the VM is back after {entry['gone_s']:g} s; training resumes after "
                + (f"checkpoint {newest} ({redone} steps to redo)" if newest else "no checkpoint (from the start)")
            )


def bring_back(
    chosen: Settings,
    targets: Callable[[], list[hosts.Host]],
    provisioning: dict,
    say: Callable[[str], None],
    stdout=None,
) -> None:
    """`invoke up`, then provisioning with the `provisioning` values. The VM is always new (deleted, or stopped
    and replaced), with a new host key and perhaps a new address (Compute Engine's ephemeral IP), so the keys
    recorded for its `targets` before and after the update (the outputs resolved again once the VM is up) are
    forgotten first (the next connection records the new one and says so). Nobody is there to answer Pulumi's
    question, so the update goes ahead unasked (`--yes`), but never one that deletes the data disk (the stack file
    changed since the run began): that waits for a person. With tpu-grpo:fallback, a place with no chips is
    followed by the next, the data disk moved there (a snapshot: what the run wrote comes along)."""
    from tpu_grpo.cloud.search import find_chips

    def refuse(at: Settings) -> None:
        raise RecoveryError(
            "the stack file now deletes the data disk (gcp:zone or vmName changed since the run "
            "began), which a recovery never does; fix: undo that change, or run uv run invoke "
            "up yourself, then the same pipeline again"
        )

    try:
        lost = targets()  # where the lost VM was, as the stack's outputs still say before the update
    except UserError:
        lost = []
    code, meanings = stack.select_and_refresh(chosen, stdout=stdout), list[str]()
    if code == 0:
        move = bool(chosen.fallback)  # a zone the stack lists, never one it was changed to while the run went on
        outcome = find_chips(chosen, yes=True, move=move, keep_data=refuse, say=say, stdout=stdout)
        code, meanings = outcome.code, outcome.explanations
    if code != 0:
        raise RecoveryError(
            f"pulumi up failed (exit {code}) while bringing the VM back"
            + "".join(f"; {meaning}" for meaning in meanings)
            + "; fix: uv run invoke up, then run the same pipeline again"
        )
    found = targets()
    for target in [*lost, *(target for target in found if target not in lost)]:  # the old VM's, the new one's
        hosts.forget_host_key(target)
    provision_again(provisioning, found, say)


def provision_again(values: dict, targets: list[hosts.Host], say: Callable[[str], None]) -> None:
    """Provision a VM brought back, as `invoke provision` would (waiting while it boots), with the `--var`s given."""
    from tpu_grpo.provision import engine, playbook

    report = engine.apply(playbook.load(), values, targets, wait_s=600)
    counts = report.hosts[0].counts()
    say(f"provisioned {targets[0].name}: {counts['changed']} changed, {counts['ok']} ok")
    if report.failed:
        problem = report.hosts[0].error or next(
            f"'{r.step}' failed: {r.output[-300:]}" for r in report.hosts[0].steps if r.status == "failed"
        )
        raise RecoveryError(
            f"provisioning the VM brought back failed ({problem}); fix: uv run invoke provision, "
            "then run the same pipeline again"
        )

"""The real Pulumi CLI side: what `pulumi up` needs on this laptop, running it, reading the
stack's outputs and state, and explaining the Compute Engine errors a TPU VM runs into.

Everything is checked before the CLI starts, so a missing piece is named in one place
instead of surfacing as a provider error halfway through an update.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tpu_grpo.capacity import CAPACITIES, DEFAULT, Capacity
from tpu_grpo.errors import UserError
from tpu_grpo.kubeconfig import AUTH_PLUGIN
from tpu_grpo.settings import Settings, project_root

INSTANCE_TYPE = "gcp:compute/instance:Instance"
#: Compute Engine states of a VM that is not running: a TPU VM in them is created anew, never started
#: again (tpu_grpo/capacity.py, `after_stop`).
STOPPED = ("TERMINATED", "STOPPED", "SUSPENDED")
#: What a settings change replaces (stack output -> what it is called): the one VM (what Compute Engine
#: changes only on a stopped VM: infra/tpu_host.py, REPLACED_ON_CHANGES), or a slice's node pools.
REPLACING = {"machine_type": "machine type", "zone": "zone", "capacity": "capacity", "max_run_hours": "maxRunHours",
             "service_account": "service account"}
REPLACING_POOLS = {"slice": "slice", "zone": "zone", "capacity": "capacity"}

#: Compute Engine errors seen when creating a reservation-bound VM, and what to do about them.
KNOWN_ERRORS = (
    ("does not have sufficient capacity",
     "the reservation has no free chips: another VM already uses them, or it reserves fewer "
     "than this machine type has (gcloud compute reservations describe RESERVATION --zone ZONE)"),
    ("is incorrect for the requested resources",
     "the reservation is for another machine type or zone: match tpu-grpo:machineType and gcp:zone to it"),
    ("Could not find the given reservation",
     "no reservation of that name in this project and zone: check tpu-grpo:reservation and gcp:zone "
     "(gcloud compute reservations list)"),
    ("requires reservation to be in READY state",
     "the reservation is not active yet (a calendar-mode reservation starts at its start time): "
     "run `invoke up` again once it is READY"),
    ("must exist in the same project as the instance",
     "the reservation belongs to another project: set gcp:project to the reservation's project"),
    ("specificReservationRequired",
     "the reservation was not created with specificReservationRequired (--require-specific-reservation): "
     "only such a reservation can be named by a VM; create it so, or ask its owner to"),
    ("Quota",
     "a project quota is too low for this VM or its disks: raise it under IAM & Admin > Quotas"),
)


def google_credentials() -> str | None:
    """Where the Google provider would find credentials, or None (it tries these in order)."""
    for variable in ("GOOGLE_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN"):
        if os.environ.get(variable):
            return f"${variable}"
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:  # a path: credentials only when there is a file to read
        readable = os.access(path, os.R_OK) and Path(path).is_file()
        return f"$GOOGLE_APPLICATION_CREDENTIALS ({path})" if readable else None
    gcloud_dir = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    adc = gcloud_dir / "application_default_credentials.json"
    return str(adc) if adc.is_file() else None


def missing_for_up(settings: Settings) -> list[str]:
    """Each thing `pulumi up` still needs, as 'what: how to get it'; empty when ready."""
    missing = [f"setting {error}" for error in settings.pending]
    pulumi = shutil.which("pulumi")
    if not pulumi:
        missing.append("the Pulumi CLI: install it (pulumi.com/docs/install) and put `pulumi` on PATH")
    elif subprocess.run([pulumi, "whoami"], capture_output=True).returncode != 0:
        missing.append("a Pulumi backend login: run `pulumi login` (or `pulumi login --local`)")
    if not google_credentials():
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        missing.append(f"Google Cloud credentials: $GOOGLE_APPLICATION_CREDENTIALS names {named}, which is no readable "
                       "file: point it at your key file, or unset it and run `gcloud auth application-default login`"
                       if named else "Google Cloud credentials: run `gcloud auth application-default login`")
    if settings.tpu_slice and not shutil.which(AUTH_PLUGIN):
        missing.append(f"GKE's credential plugin, with which Pulumi and the tasks reach the slice's cluster: "
                       f"gcloud components install {AUTH_PLUGIN} (or apt-get install google-cloud-cli-{AUTH_PLUGIN})")
    return missing


def error_messages(event_log: Path) -> list[str]:
    """The error diagnostics of a Pulumi engine event log (`--event-log`, one JSON event a line)."""
    messages = []
    for line in event_log.read_text().splitlines() if event_log.is_file() else []:
        try:
            diagnostic = json.loads(line).get("diagnosticEvent") or {}
        except json.JSONDecodeError:
            continue  # the last line may be cut short if the CLI was killed
        if diagnostic.get("severity") == "error":
            messages.append(diagnostic.get("message", ""))
    return messages


def explain(messages: list[str], obtained: Capacity = CAPACITIES[DEFAULT]) -> list[str]:
    """What each known Compute Engine error in these messages means, once each; a zone out of capacity means
    what it means for the capacity `obtained` (ZONE_RESOURCE_POOL_EXHAUSTED holds the marker too)."""
    found = []
    known = (*KNOWN_ERRORS, ("RESOURCE_POOL_EXHAUSTED", obtained.no_capacity))
    for message in messages:
        for marker, meaning in known:
            if marker in message:
                if meaning not in found:
                    found.append(meaning)
                break
    return found


def _pulumi_json(*args: str):
    """The JSON a read-only Pulumi CLI command prints, or None (no CLI, no stack, nothing made yet)."""
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        return None
    done = subprocess.run([pulumi, *args], capture_output=True, text=True, cwd=project_root())
    try:
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    except json.JSONDecodeError:
        return None


def outputs(stack: str) -> dict:
    """The stack's outputs from its last update (`pulumi stack output --json`); {} when there are none."""
    return _pulumi_json("stack", "output", "--json", "--stack", stack) or {}


def instance_state(stack: str) -> tuple[str, str] | None:
    """(URN, Compute Engine status) of the stack's VM as its state records it, or None."""
    state = _pulumi_json("stack", "export", "--stack", stack) or {}
    for resource in state.get("deployment", {}).get("resources", []):
        if resource.get("type") == INSTANCE_TYPE:
            return resource["urn"], (resource.get("outputs") or {}).get("currentStatus", "")
    return None


def replacements(settings: Settings) -> list[str]:
    """One line for each setting whose change replaces the existing VM (or a slice's TPU node pools), or []
    (nothing made yet, no CLI)."""
    before = outputs(settings.stack)
    now = {"machine_type": settings.machine_type, "slice": settings.slice, "zone": settings.zone,
           "capacity": settings.capacity, "max_run_hours": settings.max_run_hours,
           "service_account": settings.service_account}
    keys, effect = ((REPLACING_POOLS, "new TPU node pools, and for a zone a new cluster (a running job stops); the "
                                      "runs stay in the bucket") if settings.tpu_slice else
                    (REPLACING, "a new VM and boot disk (provisioning again, /dev/shm emptied); the data disk stays"))
    return [f"{what} {before[key] or '(default)'} -> {now[key] or '(default)'}: {effect}" for key, what in keys.items()
            if key in before and before[key] != now[key]]


def up(settings: Settings, say=print, stdout=None) -> tuple[int, list[str]]:
    """Select (or create) the stack and run `pulumi up --refresh` on it, attached to this terminal: the
    refresh notices a VM that Compute Engine deleted (preempted, a reservation or flex-start run that
    ended) and creates it again. A stopped VM (an idle stop, a preemption) is replaced: no TPU VM is
    started again, whatever its capacity.

    Returns the exit code and, when it failed, what the known errors in it mean. The CLI's output goes
    to this terminal, or to `stdout` (a file: stderr when this process's stdout is JSON).
    """
    stack = settings.stack
    selected = subprocess.run(["pulumi", "stack", "select", "--create", stack], stdout=stdout)
    if selected.returncode != 0:
        return selected.returncode, []
    for line in replacements(settings):
        say(f"replaces: {line}")
    replace: list[str] = []
    if not settings.tpu_slice:
        subprocess.run(["pulumi", "refresh", "--yes", "--skip-preview", "--stack", stack], stdout=stdout)
        found = instance_state(stack)
        if found and found[1] in STOPPED:
            say(f"the {settings.capacity} VM is {found[1]} (stopped when idle, or preempted), and a TPU VM is never "
                "started again: creating it anew around the same data disk")
            replace = ["--replace", found[0]]
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-") as folder:
        event_log = Path(folder) / "events.jsonl"
        code = subprocess.run(["pulumi", "up", "--refresh", "--stack", stack, *replace,
                               "--event-log", str(event_log)], stdout=stdout).returncode
        return code, explain(error_messages(event_log), settings.obtained) if code else []


def require_cli() -> None:
    if not shutil.which("pulumi"):
        raise UserError("no pulumi CLI on PATH; fix: install it (pulumi.com/docs/install)")


def destroy(stack: str) -> int:
    """`pulumi destroy` on the stack, attached to this terminal (it asks before deleting)."""
    return subprocess.run(["pulumi", "destroy", "--stack", stack]).returncode

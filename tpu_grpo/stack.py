"""The real Pulumi CLI side: what `pulumi up` needs on this laptop, running it, and
explaining the Compute Engine errors a reservation-bound VM runs into.

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

from tpu_grpo.errors import UserError
from tpu_grpo.settings import Settings

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
    ("ZONE_RESOURCE_POOL_EXHAUSTED",
     "the zone has no capacity outside reservations: a reservation-bound VM must land in its "
     "reservation, so check that the reservation is active and in gcp:zone"),
    ("RESOURCE_POOL_EXHAUSTED",
     "no capacity for this request right now: check that the reservation is active and in gcp:zone"),
    ("Quota",
     "a project quota is too low for this VM or its disks: raise it under IAM & Admin > Quotas"),
)


def google_credentials() -> str | None:
    """Where the Google provider would find credentials, or None (it tries these in order)."""
    for variable in ("GOOGLE_CREDENTIALS", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN"):
        if os.environ.get(variable):
            return f"${variable}"
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
        missing.append("Google Cloud credentials: run `gcloud auth application-default login`")
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


def explain(messages: list[str]) -> list[str]:
    """What each known Compute Engine error in these messages means, once each."""
    found = []
    for message in messages:
        for marker, meaning in KNOWN_ERRORS:
            if marker in message:
                if meaning not in found:
                    found.append(meaning)
                break
    return found


def up(stack: str) -> tuple[int, list[str]]:
    """Select (or create) the stack and run `pulumi up` on it, attached to this terminal.

    Returns the exit code and, when it failed, what the known errors in it mean.
    """
    selected = subprocess.run(["pulumi", "stack", "select", "--create", stack])
    if selected.returncode != 0:
        return selected.returncode, []
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-") as folder:
        event_log = Path(folder) / "events.jsonl"
        code = subprocess.run(["pulumi", "up", "--stack", stack, "--event-log", str(event_log)]).returncode
        return code, explain(error_messages(event_log)) if code else []


def require_cli() -> None:
    if not shutil.which("pulumi"):
        raise UserError("no pulumi CLI on PATH; fix: install it (pulumi.com/docs/install)")


def destroy(stack: str) -> int:
    """`pulumi destroy` on the stack, attached to this terminal (it asks before deleting)."""
    return subprocess.run(["pulumi", "destroy", "--stack", stack]).returncode

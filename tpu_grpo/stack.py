"""The real Pulumi CLI side: what `pulumi up` needs on this laptop, and running it.

Everything here is checked before the CLI is started, so a missing piece is named in one
place instead of surfacing as a provider error halfway through an update.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tpu_grpo.settings import Settings


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


def up(stack: str) -> int:
    """Select (or create) the stack and run `pulumi up` on it, attached to this terminal."""
    selected = subprocess.run(["pulumi", "stack", "select", "--create", stack])
    if selected.returncode != 0:
        return selected.returncode
    return subprocess.run(["pulumi", "up", "--stack", stack]).returncode

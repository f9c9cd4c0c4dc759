"""The Pulumi program's body: read the stack settings through `pulumi.Config`, declare the
TPU host, return its outputs. `__main__.py` exports them; the offline plan and the tests
run the same function under Pulumi's mocks."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.tpu_host import TpuHost
from tpu_grpo.settings import KEYS, Settings, parse, project_root


def read_settings(*, lenient: bool = False) -> Settings:
    """The stack's settings as `pulumi.Config` sees them, validated before anything is declared."""
    raw = {key.name: pulumi.Config(key.namespace).get(key.short) for key in KEYS}
    return parse(raw, pulumi.get_stack(), project_root(), lenient=lenient)


def declare(settings: Settings) -> dict[str, Any]:
    return TpuHost(settings).outputs

"""The Pulumi program's body: read the stack settings through `pulumi.Config`, declare the
TPU host (or slice), return its outputs. `__main__.py` exports them; the offline plan and the tests
run the same function under Pulumi's mocks."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pulumi

from infra.tpu_host import TpuHost
from infra.tpu_slice import TpuSlice
from tpu_grpo.config.keys import KEYS, PROJECT
from tpu_grpo.config.settings import PLACE_ENV, PLACED, Settings, parse
from tpu_grpo.config.stack_file import project_root


def read_settings(*, lenient: bool = False, configured: Iterable[str] | None = None) -> Settings:
    """The stack's settings as `pulumi.Config` sees them, validated before anything is declared.

    `configured` names every key the stack sets, so that a misspelled `tpu-grpo:*` key is refused
    rather than silently dropped; by default those the Pulumi engine hands the program in
    $PULUMI_CONFIG, as every language host does."""
    names = {key.name for key in KEYS}
    names |= {
        name
        for name in (pulumi.runtime.get_config_env() if configured is None else configured)
        if name.startswith(f"{PROJECT}:")
    }
    raw = {}
    for name in sorted(names):
        namespace, short = name.split(":", 1)
        raw[name] = pulumi.Config(namespace).get(short)
    if os.environ.get(PLACE_ENV):  # the place of this update, which `invoke up` tries before it records it
        raw[PLACED] = os.environ[PLACE_ENV]
    return parse(raw, pulumi.get_stack(), project_root(), lenient=lenient)


def declare(settings: Settings) -> dict[str, Any]:
    """The one VM, or a multi-host slice's GKE cluster (`tpu-grpo:slice`)."""
    return (TpuSlice(settings) if settings.tpu_slice else TpuHost(settings)).outputs

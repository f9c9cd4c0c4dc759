"""Shared test fixtures: a valid stack (with a real key pair), and paths to the shared docs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TUTORIAL = SHARED / "docs" / "tutorial.md"


@pytest.fixture(autouse=True)
def no_pulumi_env(monkeypatch):
    """Pulumi falls back to PULUMI_CONFIG* env vars: keep the developer's out of the tests."""
    for name in list(os.environ):
        if name.startswith("PULUMI_CONFIG"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def key_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A real ed25519 key pair in OpenSSH format: (private key path, public key path)."""
    folder = tmp_path_factory.mktemp("keys")
    key = ed25519.Ed25519PrivateKey.generate()
    private = folder / "id_ed25519"
    private.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    private.chmod(0o600)
    public = folder / "id_ed25519.pub"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b" test@tpu-grpo\n")
    return private, public


@pytest.fixture
def stack_values(key_pair) -> dict:
    """The committed example stack (Pulumi.dev.yaml) with its placeholders filled in."""
    config = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    config.update({
        "gcp:project": "grpo-lab-123",
        "tpu-grpo:reservation": "v6e-8-calendar",
        "tpu-grpo:sshSourceRanges": ["203.0.113.7/32", "198.51.100.0/24"],
        "tpu-grpo:sshPublicKeyPath": str(key_pair[1]),
    })
    return config


@pytest.fixture
def stack_dir(tmp_path, stack_values) -> Path:
    """A project folder holding the real Pulumi.yaml and a filled-in Pulumi.dev.yaml."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": stack_values}))
    return tmp_path

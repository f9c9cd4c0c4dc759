"""Shared test fixtures: a valid stack (with a real key pair), and paths to the shared docs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import sys
from dataclasses import dataclass
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


# ---------------------------------------------------------------- real SSH hosts (tests/sshd.py)

TEST_TOKEN = "hf_" + "T0kenNeverShown" + "x7Qp2Lm9Zr"  # a made-up token the tests scan every output for


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, key_pair):
    """One real sshd on 127.0.0.1 for all host tests; root's home made traversable for Python 3.12."""
    from tests import sshd as harness

    folder = Path(tempfile.mkdtemp(prefix="tpu-grpo-sshd-"))  # pytest's tmp is 0700: sshd reads keys as the user
    folder.chmod(0o755)
    authorized = folder / "authorized_keys"
    authorized.write_text(key_pair[1].read_text())
    with harness.root_home_traversable():
        server = harness.Sshd(folder / "loopback", authorized).start()
        yield server
        server.stop()
    shutil.rmtree(folder)


@dataclass
class TestHost:
    """A fresh host on the test sshd: its own user (home = the host's state) and its own data disk."""
    sshd: object
    user: object
    disk: object
    key: Path
    state: Path

    @property
    def spec(self) -> str:
        return f"{self.user.name}@{self.sshd.address}:{self.sshd.port}"

    @property
    def vars(self) -> list[str]:
        """What this machine allows: no apt upgrade, uv from PyPI, a small real package for MaxText."""
        from tests.sshd import TEST_VARS

        return [*TEST_VARS, f"data_device={self.disk.device}", f"data_mount={self.disk.mount}"]

    def invoke(self, task: str, *args: str, vars: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
        """Run `invoke TASK --host ... --identity ...` for real, as a user would."""
        argv = [sys.executable, "-m", "invoke", "-r", str(ROOT), task, "--host", self.spec, "--identity", str(self.key)]
        for item in self.vars if vars else []:
            argv += ["--var", item]
        env = {**os.environ, "TPU_GRPO_STATE": str(self.state), "HF_TOKEN": TEST_TOKEN, "COLUMNS": "200"}
        return subprocess.run([*argv, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)

    def run_as_user(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/sbin/runuser", "-u", self.user.name, "--", "bash", "-c", command],
                              capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(self.user.home),
                                   "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"})


@pytest.fixture
def make_host(sshd, key_pair, tmp_path_factory):
    """Factory of fresh hosts on the session's sshd; each is removed (user, mount, loop device) after the test."""
    from tests import sshd as harness

    made = []

    def make() -> TestHost:
        user = harness.make_user()
        disk = harness.LoopDisk(tmp_path_factory.mktemp("disk") / "data.img").attach()
        disk.mount = f"/mnt/tpu-grpo-test/{user.name}"
        state = tmp_path_factory.mktemp("state")
        (state / "known_hosts").write_text(sshd.known_hosts_line)
        made.append(TestHost(sshd, user, disk, key_pair[0], state))
        return made[-1]

    yield make
    for host in made:
        host.disk.detach()
        harness.forget_mount(host.disk.mount)
        harness.remove_user(host.user)

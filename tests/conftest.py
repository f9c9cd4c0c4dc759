"""The tiers (tests/unit, tests/host: which runs where) and the fixtures both use: a valid stack (with a real key
pair), the Cloud Storage emulator, xpk. The host tier's own fixtures are in tests/host/conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.host import rootfs
from tests.support import MAXTEXT_VENV, ROOT, built_once

#: The host tier: the tests that make real test hosts (users, sudo, mounts, namespaces: root only) or run
#: something as root on this machine itself.
HOST_TIER = ROOT / "tests" / "host"
HOST_TIER_COMMAND = "sudo tests/run"
MAXTEXT_TIER = ROOT / "tests" / "maxtext"


def missing_host_packages() -> list[str]:
    """The Debian packages of tests/host-packages.txt whose command is not on this machine."""
    rows = [
        line.split()
        for line in (ROOT / "tests/host-packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [package for package, command in rows if not shutil.which(command, path=path)]


def host_tier_missing() -> str | None:
    """Why the host tier cannot run here, in one line with the command that fixes it, or None."""
    if os.geteuid() != 0:
        return (
            f"the host tier (real SSH hosts, with users, sudo, mounts and namespaces) needs root; run it with: "
            f"{HOST_TIER_COMMAND}"
        )
    missing = missing_host_packages()
    if missing:
        return (
            f"the host tier needs the Debian packages {', '.join(missing)}; install them: "
            "tests/install-host-packages (or run the tests with tests/run)"
        )
    return None


def maxtext_tier_missing() -> str | None:
    """Why the MaxText tier cannot run here, in one line with the command that fixes it, or None."""
    if os.geteuid() != 0:
        return (
            "the MaxText tier runs each script in a mount namespace of its own (the host's /dev/shm): it needs "
            f"root; run it with: {HOST_TIER_COMMAND}"
        )
    if not (MAXTEXT_VENV / "bin/python").exists():
        return f"the MaxText tier needs MaxText 0.2.3's venv at {MAXTEXT_VENV}; install it: tests/maxtext/install"
    return None


def pytest_collection_modifyitems(config, items):
    """Without root, or without what a tier needs, run the unit tier and skip that tier, with the reason."""
    for tier, why in ((HOST_TIER, host_tier_missing()), (MAXTEXT_TIER, maxtext_tier_missing())):
        if why is not None:
            for item in items:
                if tier in Path(item.path).parents:
                    item.add_marker(pytest.mark.skip(reason=why))


def pytest_terminal_summary(terminalreporter):
    """A tier whose tests this session skipped for want of root, packages or a venv: one line why, and the fix."""
    skipped = [report.nodeid for report in terminalreporter.stats.get("skipped", [])]
    host = sum(nodeid.startswith("tests/host/") for nodeid in skipped)
    why = host_tier_missing()
    if why and host:
        terminalreporter.write_line(f"ran the unit tier only ({host} skipped): {why}")
    why = maxtext_tier_missing()
    if why and any(nodeid.startswith("tests/maxtext/") for nodeid in skipped):
        terminalreporter.write_line(f"skipped the MaxText tier: {why}")


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
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public = folder / "id_ed25519.pub"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + b" test@tpu-grpo\n"
    )
    return private, public


@pytest.fixture
def stack_values(key_pair) -> dict:
    """The committed example stack (Pulumi.dev.yaml) with its placeholders filled in."""
    config = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    config.update(
        {
            "gcp:project": "grpo-lab-123",
            "tpu-grpo:reservation": "v6e-8-calendar",
            "tpu-grpo:sshSourceRanges": ["203.0.113.7/32", "198.51.100.0/24"],
            "tpu-grpo:sshPublicKeyPath": str(key_pair[1]),
        }
    )
    return config


@pytest.fixture
def stack_dir(tmp_path, stack_values) -> Path:
    """A project folder holding the real Pulumi.yaml and a filled-in Pulumi.dev.yaml."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": stack_values}))
    return tmp_path


@pytest.fixture
def home(tmp_path):
    """An empty home for a task run (its environment): no Google credentials, no Pulumi login."""
    folder = tmp_path / "home"
    folder.mkdir()
    return {"HOME": str(folder)}


@pytest.fixture(scope="session", autouse=True)
def machine_unchanged():
    """After the whole suite, the machine that ran it has the same packages, users, /etc, /usr/local
    and mounts as before: everything the tests provisioned went to their throwaway hosts. (As a
    non-root user nothing here can change the machine, and the host tier does not run.)"""
    if host_tier_missing():
        yield
        return
    rootfs.base_root()  # built (or found) before the snapshot: it lives in its cache folder
    before = rootfs.machine_state()
    yield
    after = rootfs.machine_state()
    changed = {key: rootfs.difference(before[key], value) for key, value in after.items() if value != before[key]}
    assert not changed, f"the test suite changed this machine: {changed}"


@pytest.fixture(scope="session")
def storage_emulator() -> str:
    """A local Cloud Storage (gcp-storage-emulator, in memory, with the generation headers: tests/doubles/storage.py)
    for the gs:// store: its URL, as STORAGE_EMULATOR_HOST gives it to Google's client library and MaxText."""
    from tests.host.sshd import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.doubles.storage", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def bucket(storage_emulator, monkeypatch) -> str:
    """A fresh bucket in the emulator, which this process's client library uses too."""
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_emulator)
    name = f"tpu-grpo-{os.urandom(4).hex()}"
    storage.Client().create_bucket(name)
    return name


XPK_VERSION = "1.16.0"


@pytest.fixture(scope="session")
def xpk() -> Path:
    """xpk, the tool MaxText's multi-host tutorial launches Pathways workloads with, in a venv of its own in
    the test cache (its pins, pyyaml==6.0.2 and urllib3<2.6 among them, would hold this project's back)."""

    def install(folder: Path) -> None:
        subprocess.run(["uv", "venv", "--quiet", "--python", sys.executable, str(folder)], check=True)
        subprocess.run(
            ["uv", "pip", "install", "--quiet", "--python", str(folder / "bin" / "python"), f"xpk=={XPK_VERSION}"],
            check=True,
        )

    return built_once(rootfs.CACHE / f"xpk-{XPK_VERSION}", install) / "bin" / "xpk"

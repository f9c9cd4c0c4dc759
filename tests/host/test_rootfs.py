"""The throwaway hosts themselves (tests/host/rootfs.py): a host sees only itself, and losing it is real."""

from __future__ import annotations

import os
import time
from pathlib import Path

import fabric
import pytest

from tests.host import rootfs


@pytest.fixture
def host(throwaway_host):
    yield throwaway_host
    throwaway_host.remove()  # again: removing is idempotent, and leaves nothing behind
    assert not throwaway_host.folder.exists()
    assert str(throwaway_host.root) not in Path("/proc/self/mounts").read_text()


def connect(host, key_pair, tmp_path) -> fabric.Connection:
    known = tmp_path / "known_hosts"
    known.write_text(host.known_hosts_line)
    connection = fabric.Connection(
        host.address,
        user=rootfs.USER,
        port=host.port,
        config=fabric.Config(overrides={"run": {"in_stream": False}}),
        connect_kwargs={"key_filename": str(key_pair[0])},
    )
    connection.client.load_host_keys(str(known))
    return connection


def test_a_host_has_its_own_root_users_processes_and_shm(host, key_pair, tmp_path):
    connection = connect(host, key_pair, tmp_path)
    try:
        assert connection.run("id -un", hide=True).stdout.strip() == rootfs.USER
        assert connection.run("sudo -n cat /etc/sudoers.d/tpu-grpo-test", hide=True).ok
        processes = connection.run("ps -e -o pid=,comm=", hide=True).stdout.split("\n")
        assert processes[0].split() == ["1", "sshd"]  # its PID 1 is its own sshd: nothing of this machine's
        connection.run("echo shm > /dev/shm/marker && echo etc | sudo -n tee /etc/tpu-grpo-marker", hide=True)
    finally:
        connection.close()
    assert (host.root / "etc/tpu-grpo-marker").read_text() == "etc\n"
    assert not Path("/etc/tpu-grpo-marker").exists() and not Path("/dev/shm/marker").exists()


def test_losing_the_host_ends_every_process_on_it(host, key_pair, tmp_path):
    connection = connect(host, key_pair, tmp_path)
    connection.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > ~/sleeper", hide=True)
    first = host.first_process()
    assert first and Path(f"/proc/{first}").exists()
    inside = int((host.user.home / "sleeper").read_text())  # its PID in the host's own namespace
    assert inside > 1
    host.lose()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{first}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{first}").exists()
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _in_root(pid, host.root)]
    with pytest.raises(Exception):  # noqa: B017 - whichever error paramiko gives for a server that is gone
        connection.run("true", hide=True)
    connection.close()


def _in_root(pid: str, root: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/root") == str(root)
    except OSError:
        return False

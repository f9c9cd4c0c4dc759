"""Provisioning under faults, against throwaway hosts: a connection killed in the middle of each
step, a host cut off while another is provisioned beside it, and host keys that change.

What must hold: the run names the host and step it lost, and the next run picks up from the
host's real state and converges; one host's failure never stops the other's provisioning.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.host import rootfs
from tests.host import sshd as harness
from tests.host.kill_points import KILL_POINTS
from tests.host.rootfs import TEST_VARS
from tests.support import ROOT, TEST_TOKEN
from tpu_grpo.host import hosts
from tpu_grpo.provision import engine, playbook

# mkfs.ext4 formats the test's small loop disk in about 15 ms, less than one scan of /proc on a busy
# machine (a scan missed it once under load): for these steps the program is held at its exec until
# the connection has been dropped, so the kill lands in it every time.
HELD_AT_EXEC = {"data disk"}
# Steps whose work may still complete after the kill: sudo's command runs on as root (as it
# would after a dead link). The rest must be redone.
MAY_FINISH = {"build tools", "data disk"}
CACHED_FILES = 1500  # an existing Hugging Face cache, so that moving it takes a while


def statuses(report: dict, host: int = 0) -> dict[str, str]:
    return {step["step"]: step["status"] for step in report["hosts"][host]["steps"]}


def _uids_and_parent(pid: int) -> tuple[int, int, int]:
    """(real uid, effective uid, parent pid) of a process."""
    with open(f"/proc/{pid}/status") as handle:
        fields = {key: value.split() for key, _, value in (line.partition(":") for line in handle)}
    return int(fields["Uid"][0]), int(fields["Uid"][1]), int(fields["PPid"][0])


def _runs_for(uid: int, pid: int) -> bool:
    """Whether the process or an ancestor runs as the user (sudo keeps the user's real uid)."""
    while pid > 1:
        real, effective, pid = _uids_and_parent(pid)
        if uid in (real, effective):
            return True
    return False


def programs_running(uid: int, prefix: str, words: str) -> list[tuple[int, int, str]]:
    """(pid, effective uid, command line) of the programs run for the user `uid`, its sudo's
    included, whose command line starts with `prefix` and holds `words`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace")
            if command.startswith(prefix) and words in command and _runs_for(uid, int(entry.name)):
                found.append((int(entry.name), _uids_and_parent(int(entry.name))[1], command))
        except (OSError, KeyError, IndexError, ValueError):  # the process ended while being read
            continue
    return found


def wait_for_sudo_to_end(uid: int, timeout_s: float = 120) -> None:
    """A dead link leaves sudo's command running on the host; the next run comes once it has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and _uids_and_parent(int(entry.name))[0] == uid:
                    running.append(int(entry.name))
            except (OSError, KeyError, IndexError, ValueError):
                continue
        if not running:
            return
        assert time.monotonic() < deadline, f"the user's processes {running} still run {timeout_s} s after the kill"
        time.sleep(0.1)


class ExecGate:
    """Holds every exec of one program file until it is let go (fanotify's FAN_OPEN_EXEC_PERM): a
    program that runs for milliseconds is caught before it starts."""

    _EVENT = struct.Struct(
        "=IBBHQii"
    )  # struct fanotify_event_metadata: len, vers, reserved, metadata_len, mask, fd, pid
    _FAN_CLASS_CONTENT, _FAN_CLOEXEC, _FAN_MARK_ADD, _FAN_OPEN_EXEC_PERM, _FAN_ALLOW = 0x4, 0x1, 0x1, 0x40000, 0x1

    def __init__(self, path: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        self.fd = libc.fanotify_init(self._FAN_CLASS_CONTENT | self._FAN_CLOEXEC, os.O_RDONLY | os.O_CLOEXEC)
        path = str(path)
        if (
            self.fd < 0
            or libc.fanotify_mark(self.fd, self._FAN_MARK_ADD, self._FAN_OPEN_EXEC_PERM, -100, path.encode()) < 0
        ):  # -100: AT_FDCWD
            error = ctypes.get_errno()
            if self.fd >= 0:
                os.close(self.fd)
            raise OSError(error, f"fanotify on {path}: {os.strerror(error)}")

    def held(self, timeout_s: float) -> list[tuple[int, int]]:
        """(pid, event fd) of each exec now held, after waiting up to `timeout_s` for one."""
        if not select.select([self.fd], [], [], timeout_s)[0]:
            return []
        data, offset, found = os.read(self.fd, 4096), 0, []
        while offset < len(data):
            length, _, _, _, _, event_fd, pid = self._EVENT.unpack_from(data, offset)
            found.append((pid, event_fd))
            offset += length
        return found

    def let_go(self, event_fd: int) -> None:
        os.write(self.fd, struct.pack("=iI", event_fd, self._FAN_ALLOW))
        os.close(event_fd)

    def close(self) -> None:
        os.close(self.fd)  # lets go of whatever is still held


class KillWhileRunning:
    """Drops the user's SSH connection server-side (the user's processes, its sshd included) as soon
    as the step's program runs; a program of the user's own is stopped first, so it cannot finish
    between being seen and being killed. A program that already runs when the step starts (the
    user's SSH session) is caught in `start` itself, before the step sends anything. With
    `hold_at_exec`, the program is not looked for but held at its exec, from the step's start until the kill."""

    def __init__(
        self, vm: rootfs.ThrowawayHost, program: tuple[str, str], hold_at_exec: bool = False, wait_s: float = 60
    ):
        self.vm, self.program, self.hold_at_exec, self.wait_s = vm, program, hold_at_exec, wait_s
        self.uid = vm.user.uid
        self.landed_on: str | None = None
        self.step_done = threading.Event()
        self.thread: threading.Thread | None = None  # none when `start` caught the program itself

    def start(self) -> None:
        if self.hold_at_exec:
            name = self.program[0].strip()  # the gate is made here, so that it holds nothing before the step runs
            gate = ExecGate(
                next(
                    self.vm.root / folder / name
                    for folder in ("usr/sbin", "usr/bin")
                    if (self.vm.root / folder / name).exists()
                )
            )
            self.thread = threading.Thread(target=self._watch_execs, args=(gate,), daemon=True)
        elif self._catch():
            return
        else:
            self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def _watch_execs(self, gate: ExecGate) -> None:
        deadline = time.monotonic() + self.wait_s
        try:
            while time.monotonic() < deadline and self.landed_on is None and not self.step_done.is_set():
                for pid, event_fd in gate.held(0.05):
                    try:
                        if self.landed_on is None and _runs_for(self.uid, pid):
                            self.vm.kill_sessions()
                            self.landed_on = f"{self.program[0].strip()} (held at its exec, pid {pid})"
                    finally:
                        gate.let_go(event_fd)
        finally:
            gate.close()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline and not self.step_done.is_set():
            if self._catch():
                return
            time.sleep(0.001)

    def _catch(self) -> bool:
        found = programs_running(self.uid, *self.program)
        if found:
            for pid, effective, _ in found:
                if effective == self.uid:
                    os.kill(pid, signal.SIGSTOP)
            self.vm.kill_sessions()
            self.landed_on = found[0][2]
        return bool(found)


def remove_ninja(host) -> None:
    """Removes ninja-build from the host with its real apt, so that 'build tools' has work to do."""
    host.vm.chroot("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "-q", "ninja-build")


@pytest.mark.parametrize("step", list(KILL_POINTS))
def test_connection_killed_in_the_middle_of_a_step_then_rerun_converges(step, make_host, monkeypatch):
    """A link that dies mid-step must end that host's run naming the step, and leave a host the next run finishes."""
    host = make_host()
    if step == "build tools":
        remove_ninja(host)
    if step == "caches on the data disk":
        host.run_as_user(
            f"mkdir -p ~/.cache/huggingface/hub && cd ~/.cache/huggingface/hub && "
            f"for i in $(seq {CACHED_FILES}); do echo $i > f$i; done"
        )
    monkeypatch.setenv("TPU_GRPO_STATE", str(host.state))
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    target = hosts.Host(host.user.name, "127.0.0.1", host.vm.port, host.key)
    killer = KillWhileRunning(host.vm, KILL_POINTS[step], step in HELD_AT_EXEC)

    def on_event(kind, _host, name, _payload):
        if kind == "start" and name == step:
            killer.start()
        elif kind == "done" and name == step:
            killer.step_done.set()

    book = playbook.load()
    report = engine.apply(book, playbook.resolve(book, host.vars), [target], on_event=on_event, retry_delays=(0.1,))
    killer.join()
    wait_for_sudo_to_end(host.user.uid)

    assert killer.landed_on, f"'{step}' never ran a program like {KILL_POINTS[step]}"
    lost = report.hosts[0]
    assert report.failed
    assert lost.error == f"{target.name}: connection lost during '{step}'", lost
    names = [result.step for result in lost.steps]
    killed = lost.steps[names.index(step)]
    assert killed.status == "failed" and "connection lost" in killed.note and "re-run" in killed.note, killed
    assert {result.status for result in lost.steps[names.index(step) + 1 :]} <= {"skipped"}  # nothing ran after it

    again = host.invoke("provision", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # The kill stopped the step's own program before it finished: the re-run had the step's work to do.
    assert statuses(json.loads(again.stdout))[step] in ({"changed", "ok"} if step in MAY_FINISH else {"changed"})
    third = host.invoke("provision", "--json")
    assert third.returncode == 0, third.stderr
    assert set(statuses(json.loads(third.stdout)).values()) == {"ok", "skipped"}
    six = host.run_as_user("~/maxtext_venv/bin/python -c 'import six; print(six.__version__)'")
    assert six.stdout.strip() == "1.16.0", six.stderr
    if step == "caches on the data disk":  # the interrupted move lost nothing
        moved = host.vm.path(f"{host.disk.mount}/cache/huggingface/hub")
        assert (
            len(list(moved.iterdir())) == CACHED_FILES
            and (moved / f"f{CACHED_FILES}").read_text() == f"{CACHED_FILES}\n"
        )


def test_apt_waits_for_a_held_dpkg_lock_instead_of_failing(make_host, monkeypatch):
    """After boot unattended-upgrades holds the dpkg lock for minutes: 'build tools' must wait, not fail."""
    host = make_host()
    remove_ninja(host)
    monkeypatch.setenv("TPU_GRPO_STATE", str(host.state))
    lock = os.open(host.vm.root / "var/lib/dpkg/lock-frontend", os.O_RDWR)
    fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # dpkg's own kind of lock, as apt would hold it
    threading.Timer(3, os.close, [lock]).start()
    book = playbook.load()
    report = engine.apply(
        book,
        playbook.resolve(book, host.vars),
        [hosts.Host(host.user.name, "127.0.0.1", host.vm.port, host.key)],
        tags=["apt"],
        retry_delays=(),
    )
    build_tools = next(result for result in report.hosts[0].steps if result.step == "build tools")
    assert (build_tools.status, build_tools.seconds > 3) == ("changed", True), build_tools
    assert host.vm.chroot("dpkg-query", "-W", "-f=${Status}", "ninja-build").stdout == "install ok installed"


def other_ed25519_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode().split()[1]


# ---------------------------------------------------------------- host keys


def test_changed_host_key_is_refused_before_logging_in(make_host):
    """A host offering a key other than the recorded one may be an impostor: no login, and the fix is named."""
    host = make_host()
    name = f"[127.0.0.1]:{host.vm.port}"
    known_hosts = host.state / "known_hosts"
    known_hosts.write_text(f"{name} ssh-ed25519 {other_ed25519_key()}\n")
    # --wait retries a VM that refuses SSH while it boots; a changed key is refused at once, not
    # retried for ten minutes (the subprocess's own timeout would end the test first).
    result = host.invoke("provision", "--wait", "600", timeout=60)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "host key changed" in output
    assert f"ssh-keygen -R '{name}' -f {known_hosts}" in output
    assert host.vm.accepted(host.user.name) == 0
    assert host.user.commands() == []
    status = host.invoke("status", "--wait", "600", vars=False, timeout=60)  # a workload task, the same
    assert status.returncode == 1 and "host key changed" in status.stderr


def test_first_contact_records_the_host_key_and_says_so(make_host):
    """accept-new: the first connection trusts and records the key, tells the user, and later runs use it."""
    host = make_host()
    known_hosts = host.state / "known_hosts"
    known_hosts.unlink()
    first = host.invoke("provision", "--check", "--json")
    assert first.returncode == 0, first.stderr
    notices = json.loads(first.stdout)["hosts"][0]["notices"]
    assert len(notices) == 1 and "first contact" in notices[0] and host.vm.known_hosts_line.split()[0] in notices[0]
    assert known_hosts.read_text() == host.vm.known_hosts_line
    second = host.invoke("provision", "--check", "--json")
    assert second.returncode == 0 and json.loads(second.stdout)["hosts"][0]["notices"] == []
    assert known_hosts.read_text() == host.vm.known_hosts_line


def test_connections_ack_at_once_send_at_once_and_give_up_on_a_dead_link(make_host, monkeypatch):
    """TCP under SSH: no Nagle delay (TCP_NODELAY), immediate ACKs (TCP_QUICKACK after each read; sshd
    holds a small reply until it is ACKed, and Linux delays that ACK by 40 ms), TCP_USER_TIMEOUT."""
    host = make_host()
    monkeypatch.setenv("TPU_GRPO_STATE", str(host.state))
    connection = hosts.connect(hosts.parse(host.spec, host.key))
    try:
        sock = connection.transport.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == hosts.TCP_USER_TIMEOUT_MS
        assert isinstance(sock, hosts._QuickAckSocket)  # paramiko reads through its recv
        assert connection.run("echo quick", hide=True).stdout == "quick\n"
    finally:
        connection.close()


def test_connections_work_where_the_os_lacks_linuxs_tcp_options(make_host, monkeypatch):
    """macOS's Python has neither TCP_QUICKACK nor TCP_USER_TIMEOUT: a plain socket, keepalive alone."""
    host = make_host()
    monkeypatch.setenv("TPU_GRPO_STATE", str(host.state))
    monkeypatch.delattr(socket, "TCP_QUICKACK")
    monkeypatch.delattr(socket, "TCP_USER_TIMEOUT")
    connection = hosts.connect(hosts.parse(host.spec, host.key))
    try:
        assert type(connection.transport.sock) is socket.socket
        assert connection.transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert connection.run("echo plain", hide=True).stdout == "plain\n"
    finally:
        connection.close()


@pytest.fixture
def two_namespaced_hosts(make_host, tmp_path):
    """Hosts A and B: each its own network namespace, sshd on port 22, host key and user; no data
    disk; one laptop state folder that knows both."""
    bridge = harness.Bridge(("a", "b"))
    try:
        bridge.up()
        made = [
            make_host(disk_mb=0, address=bridge.address(label), port=22, netns=bridge.netns(label))
            for label in bridge.labels
        ]
        (tmp_path / "known_hosts").write_text("".join(host.vm.known_hosts_line for host in made))
        yield bridge, made, tmp_path
    finally:
        bridge.down()


# ---------------------------------------------------------------- two hosts in network namespaces


def test_one_host_cut_off_the_other_completes_and_the_run_fails_naming_it(two_namespaced_hosts, key_pair):
    """Hosts are provisioned in parallel and independently: losing B must neither stop nor hide A."""
    bridge, (a, b), state = two_namespaced_hosts
    argv = [
        sys.executable,
        "-m",
        "invoke",
        "-r",
        str(ROOT),
        "provision",
        "--host",
        a.spec,
        "--host",
        b.spec,
        "--identity",
        str(key_pair[0]),
        "--json",
    ]
    for item in [*TEST_VARS, "data_device="]:
        argv += ["--var", item]
    env = {**os.environ, "TPU_GRPO_STATE": str(state), "HF_TOKEN": TEST_TOKEN, "COLUMNS": "200"}
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not any("pip install --user" in command for command in b.user.commands()):
            assert run.poll() is None and time.monotonic() < deadline, "B never started installing uv"
            time.sleep(0.01)
        bridge.cut("b")  # B is in the middle of a step
        cut_at, a_commands_at_cut = time.monotonic(), len(a.user.commands())
        stdout, stderr = run.communicate(timeout=180)
        after_cut_s = time.monotonic() - cut_at
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()

    assert run.returncode != 0
    report = json.loads(stdout)
    assert report["failed"] is True
    by_name = {entry["host"]: entry for entry in report["hosts"]}
    assert set(by_name) == {a.spec, b.spec}
    assert by_name[a.spec]["error"] is None and by_name[a.spec]["failed"] == 0, by_name[a.spec]
    a_steps = statuses(report, list(by_name).index(a.spec))
    assert [a_steps[name] for name in ("uv (pip)", "venv", "MaxText")] == ["changed"] * 3, a_steps
    error = by_name[b.spec]["error"]
    assert error and error.startswith(b.spec) and "connection lost" in error and "'uv (pip)'" in error, error
    assert statuses(report, list(by_name).index(b.spec))["uv (pip)"] == "failed"
    assert after_cut_s < 45  # a dead link is noticed in seconds (keepalive, TCP_USER_TIMEOUT), not minutes
    six = a.run_as_user("~/maxtext_venv/bin/python -c 'import six; print(six.__version__)'")
    assert six.stdout.strip() == "1.16.0", six.stderr
    assert not (b.user.home / "maxtext_venv").exists()
    # In parallel: B's steps had started while A still had steps to run.
    assert len(a.user.commands()) > a_commands_at_cut

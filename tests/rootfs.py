"""Throwaway test hosts: a Debian root file system of their own, so that what a test provisions
(units in /etc/systemd, scripts in /usr/local, users, sudoers, /run) lands there and never on the
machine that runs the tests.

The base root is built once with mmdebstrap (about 40 s) and kept in a cache folder that later
sessions reuse; each host overlays it (overlayfs: an empty upper layer, so a host starts in an
instant and its changes go with it). Its sshd runs chrooted there, in mount and PID namespaces
of its own, with its own tmpfs /dev/shm and /proc: `ps` there sees only the host's processes,
and killing the namespace's first process ends all of them at once, as losing a VM does. The
network is the machine's (loopback, a port of the host's own).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.sshd import accepted, free_port, sh, start_sshd

SUITE = "bookworm"
PACKAGES = "openssh-server,sudo,python3,python3-venv,ca-certificates,iproute2,systemd"
CACHE = Path(os.environ.get("TPU_GRPO_TEST_CACHE") or Path.home() / ".cache" / "tpu-grpo-tests")
USER = "tpu"  # the host's own account: its /etc/passwd is its own, so the name never clashes


def base_root() -> Path:
    """The extracted base root file system, built on first use and reused (a lock keeps two sessions
    from building it at once)."""
    digest = hashlib.sha256(f"{SUITE} {PACKAGES}".encode()).hexdigest()[:10]
    folder = CACHE / f"rootfs-{SUITE}-{digest}"
    if (folder / ".complete").exists():
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            building = Path(tempfile.mkdtemp(prefix="rootfs-", dir=CACHE))
            sh("mmdebstrap", "--quiet", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(building / "root"))
            (building / "root").rename(folder)
            building.rmdir()
            (folder / ".complete").touch()
    return folder


@dataclass
class HostUser:
    name: str
    home: Path  # as the test machine sees it: under the host's root


@dataclass
class ThrowawayHost:
    """One host: its root (an overlay of the base), its sshd on 127.0.0.1:port, one sudo user."""

    folder: Path
    authorized_key: str
    address: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen | None = None
    user: HostUser = field(init=False)

    @property
    def root(self) -> Path:
        return self.folder / "root"

    @property
    def log(self) -> Path:
        return self.folder / "sshd.log"

    @property
    def known_hosts_line(self) -> str:
        key = (self.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]
        return f"[{self.address}]:{self.port} ssh-ed25519 {key}\n"

    def chroot(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command on the host's file system, as root (outside its namespaces)."""
        return sh("/usr/sbin/chroot", str(self.root), *argv, check=check)

    def start(self) -> "ThrowawayHost":
        base = base_root()
        for name in ("upper", "work", "root"):
            (self.folder / name).mkdir(parents=True)
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir={base},upperdir={self.folder / 'upper'},workdir={self.folder / 'work'}", str(self.root))
        self.chroot("ssh-keygen", "-q", "-A")
        self.chroot("useradd", "--create-home", "--shell", "/bin/bash", USER)
        self.chroot("usermod", "-p", "*", USER)
        (self.root / "etc/sudoers.d/tpu-grpo-test").write_text(f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
        (self.root / "etc/sudoers.d/tpu-grpo-test").chmod(0o440)
        ssh = self.root / "home" / USER / ".ssh"
        ssh.mkdir()
        (ssh / "authorized_keys").write_text(self.authorized_key)
        self.chroot("chown", "-R", f"{USER}:{USER}", f"/home/{USER}")
        self.user = HostUser(USER, self.root / "home" / USER)
        self.port = self.port or free_port()
        (self.root / "run/sshd").mkdir(exist_ok=True)
        (self.root / "etc/ssh/sshd_test_config").write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {self.address}", "HostKey /etc/ssh/ssh_host_ed25519_key",
            "PidFile /run/sshd-test.pid", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp", "LogLevel VERBOSE",
            "SetEnv PATH=/usr/local/bin:/usr/bin:/bin", ""]))
        inside = (f"mount -t tmpfs -o mode=1777 tmpfs {self.root}/dev/shm && "
                  f"exec /usr/sbin/chroot {self.root} /usr/sbin/sshd -D -e -f /etc/ssh/sshd_test_config")
        self.process = start_sshd(
            ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={self.root}/proc", "sh", "-c", inside], self.log)
        return self

    def accepted(self, user: str) -> int:
        return accepted(self.log, user)

    def first_process(self) -> int | None:
        """The PID (as the test machine sees it) of the host's PID 1: the child of `unshare --fork`."""
        if self.process is None or self.process.poll() is not None:
            return None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        return int(pids[0]) if pids else None

    def lose(self) -> None:
        """What losing the VM does: every process of the host ends at once (its /dev/shm goes too)."""
        pid = self.first_process()
        if pid:
            os.kill(pid, signal.SIGKILL)
        if self.process:
            self.process.wait(10)

    def remove(self) -> None:
        self.lose()
        sh("umount", str(self.root), check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def machine_state() -> dict[str, object]:
    """What the test machine must have exactly as before the throwaway hosts' tests: its packages,
    users and groups, every file of /etc and /usr/local (size, mode, mtime), and its mounts."""
    def tree(top: str) -> dict[str, tuple[int, int, int]]:
        found = {}
        for folder, _, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                found[path] = (info.st_size, info.st_mode, info.st_mtime_ns)
        return found

    return {"packages": sh("dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\n").stdout,
            "users": Path("/etc/passwd").read_text() + Path("/etc/group").read_text(),
            "etc": tree("/etc"), "usr_local": tree("/usr/local"),
            "mounts": sorted(line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines())}

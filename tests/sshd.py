"""Real OpenSSH test hosts: an sshd the tests start themselves, users with passwordless sudo,
loop devices as data disks, and network namespaces for several hosts (see test-harness.md).

Every test user's login shell records each command line sshd hands it, so tests can assert
what reached the host (one round trip, no secret) from the host's side.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import signal
import socket
import subprocess
import pwd
import time
import uuid
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SUDOERS = Path("/etc/sudoers.d/tpu-grpo-tests")
LOGIN_SHELL = Path("/usr/local/bin/tpu-grpo-test-shell")
COMMAND_LOG_DIR = Path("/var/tmp/tpu-grpo-test-commands")
#: playbooks/host.yml variables for what this machine allows: no apt upgrade, uv from PyPI, and a
#: small real package in place of MaxText (whose install needs the PyTorch index and GitHub).
TEST_VARS = ["apt_upgrade=false", "uv_source=pip", "maxtext_spec=six==1.16.0", "extra_deps=false"]


def python312_bin() -> str:
    """The folder of this machine's Python 3.12 (pyenv's), which uv finds on the hosts' PATH."""
    found = sorted(glob.glob("/root/.pyenv/versions/3.12*/bin")) or (
        [os.path.dirname(shutil.which("python3.12"))] if shutil.which("python3.12") else [])
    if not found:
        raise RuntimeError("no Python 3.12 on this machine: the test hosts need one for `uv python find 3.12`")
    return found[-1]


@contextmanager
def root_home_traversable():
    """chmod 711 /root while any test process needs pyenv's Python 3.12; the last one out restores the mode."""
    state = Path("/run/tpu-grpo-tests-root-home")
    with state.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users, mode = (state.read_text().split() if state.exists() else ("0", oct(os.stat("/root").st_mode & 0o777)))
        state.write_text(f"{int(users) + 1} {mode}")
        os.chmod("/root", 0o711)
    try:
        yield
    finally:
        with state.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            users, mode = state.read_text().split()
            if int(users) <= 1:
                os.chmod("/root", int(mode, 8))
                state.unlink()
            else:
                state.write_text(f"{int(users) - 1} {mode}")


def forget_mount(mount: str) -> None:
    """Remove the fstab line the data disk step wrote for an unmounted test mount, the mount point, and
    the folder of test mounts that holds it once empty (it stays while another test process has one there)."""
    fstab = Path("/etc/fstab")
    if fstab.exists():
        fstab.write_text("".join(line for line in fstab.read_text().splitlines(True) if f" {mount} " not in line))
    shutil.rmtree(mount, ignore_errors=True)
    with suppress(OSError):
        os.rmdir(os.path.dirname(mount))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kwargs)


def start_sshd(argv: list[str], log: Path) -> subprocess.Popen:
    """Start an sshd in the foreground (`-D -e`), its messages to `log`; returns once it listens."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    deadline = time.monotonic() + 10
    while "Server listening" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start ({' '.join(argv)}): {log.read_text()}")
        time.sleep(0.02)
    return process


def accepted(log: Path, user: str) -> int:
    """How many SSH connections an sshd has accepted for the user, from its log."""
    return log.read_text(errors="replace").count(f"Accepted publickey for {user} ")


def install_login_shell() -> None:
    """A bash that appends every `-c` command line it is given to the user's command log."""
    COMMAND_LOG_DIR.mkdir(mode=0o1777, exist_ok=True)
    COMMAND_LOG_DIR.chmod(0o1777)
    LOGIN_SHELL.write_text('#!/bin/bash\nif [ "$1" = "-c" ]; then printf "%s\\0" "$2" >> '
                           f'{COMMAND_LOG_DIR}/"$(id -un)"; fi\nexec /bin/bash "$@"\n')
    LOGIN_SHELL.chmod(0o755)


@dataclass
class TestUser:
    name: str
    home: Path

    @property
    def command_log(self) -> Path:
        return COMMAND_LOG_DIR / self.name

    def commands(self) -> list[str]:
        """Every command line sshd ran for this user so far."""
        if not self.command_log.exists():
            return []
        return [command for command in self.command_log.read_text().split("\0") if command]


def make_user(prefix: str = "tg", record_commands: bool = True) -> TestUser:
    """A fresh account: unlocked for key login (UsePAM no), passwordless sudo, the recording shell
    (or, without `record_commands`, plain bash as on a VM)."""
    if record_commands:
        install_login_shell()
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    sh("useradd", "--create-home", "--shell", str(LOGIN_SHELL) if record_commands else "/bin/bash", name)
    sh("usermod", "-p", "*", name)
    with SUDOERS.open("a") as sudoers:
        sudoers.write(f"{name} ALL=(ALL) NOPASSWD:ALL\n")
    SUDOERS.chmod(0o440)
    return TestUser(name, Path(f"/home/{name}"))


@contextmanager
def offline(user: TestUser):
    """While inside, the user's processes reach nothing but loopback (nftables, by uid): a step that
    would download again fails at once instead of quietly succeeding over the network."""
    uid = pwd.getpwnam(user.name).pw_uid
    table = f"tpu_grpo_offline_{uid}"
    sh("nft", "add", "table", "inet", table)
    try:
        sh("nft", f"add chain inet {table} out {{ type filter hook output priority 0 ; }}")
        sh("nft", f"add rule inet {table} out meta skuid {uid} oifname != lo reject")
        yield
    finally:
        sh("nft", "delete", "table", "inet", table)


USERDEL_IN_USE, USERDEL_NO_SUCH_USER = 8, 6  # userdel's exit statuses (userdel(8))


def remove_user(user: TestUser, wait_s: float = 10) -> None:
    """Kill the user's processes and delete the user. pkill only sends the signals, so userdel
    can still see a dying process and refuse: retry that for a while, and warn (with userdel's
    own words) rather than leak the user silently."""
    deadline = time.monotonic() + wait_s
    while True:
        sh("pkill", "-KILL", "-u", user.name, check=False)
        deleted = sh("userdel", "--remove", user.name, check=False)
        if deleted.returncode != USERDEL_IN_USE or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if deleted.returncode not in (0, USERDEL_NO_SUCH_USER):
        warnings.warn(f"test user {user.name} not removed: userdel exited {deleted.returncode}: "
                      f"{deleted.stderr.strip()}", stacklevel=2)
    if SUDOERS.exists():
        SUDOERS.write_text("".join(line for line in SUDOERS.read_text().splitlines(True)
                                   if not line.startswith(user.name + " ")))
    user.command_log.unlink(missing_ok=True)


@dataclass
class LoopDisk:
    """A file-backed block device standing in for the VM's data disk."""
    image: Path
    device: str = ""
    mount: str = ""

    def attach(self, size_mb: int = 64) -> "LoopDisk":
        with self.image.open("wb") as image:
            image.truncate(size_mb * 1024 * 1024)
        self.device = sh("losetup", "--find", "--show", str(self.image)).stdout.strip()
        return self

    def detach(self) -> None:
        if self.mount:
            sh("umount", "--lazy", self.mount, check=False)
        if self.device:
            sh("losetup", "-d", self.device, check=False)
        self.image.unlink(missing_ok=True)


@dataclass
class Sshd:
    """One sshd in the foreground, on loopback or inside a network namespace."""
    folder: Path
    authorized_keys: Path
    address: str = "127.0.0.1"
    port: int = 0
    netns: str | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.folder / "sshd.log"

    @property
    def host_key_pub(self) -> str:
        return (self.folder / "ssh_host_ed25519_key.pub").read_text().split()[1]

    @property
    def known_hosts_line(self) -> str:
        return self.known_hosts_line_at(self.port)

    def known_hosts_line_at(self, port: int) -> str:
        """This server's key as known_hosts records it for `port` (also a relay's in front of it)."""
        name = self.address if port == 22 else f"[{self.address}]:{port}"
        return f"{name} ssh-ed25519 {self.host_key_pub}\n"

    def start(self) -> "Sshd":
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        Path("/run/sshd").mkdir(exist_ok=True)
        key = self.folder / "ssh_host_ed25519_key"
        if not key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        path = f"{python312_bin()}:/usr/local/bin:/usr/bin:/bin"
        (self.folder / "sshd_config").write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {self.address}", f"HostKey {key}",
            f"PidFile {self.folder}/sshd.pid", f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "Subsystem sftp internal-sftp", "LogLevel VERBOSE", "MaxStartups 100",
            f"SetEnv SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PATH={path}", ""]))
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.process = start_sshd([*prefix, SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")], self.log)
        return self

    def accepted(self, user: str) -> int:
        """How many SSH connections this sshd has accepted for the user."""
        return accepted(self.log, user)

    def kill_sessions(self, user: str) -> None:
        """Drop every live connection of the user, as a dead link would: its sshd and what runs under it."""
        sh("pkill", "-KILL", "-u", user, check=False)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class Bridge:
    """A bridge with one network namespace per host on veth links (test-harness.md), reaching the
    package registries through this machine (forwarding and masquerade) as a real VM would."""
    namespaces: tuple[str, ...]
    name: str = "tgb0"
    subnet: str = "10.231.0"
    forwarding: str = ""

    def address(self, namespace: str) -> str:
        return f"{self.subnet}.{self.namespaces.index(namespace) + 2}"

    @staticmethod
    def veth(namespace: str) -> str:
        return f"{namespace}-br"

    def up(self) -> "Bridge":
        self.down()  # whatever a killed earlier run left behind
        self.forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        sh("ip", "link", "add", self.name, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.name)
        sh("ip", "link", "set", self.name, "up")
        sh("nft", "-f", "-", input=f"table ip {self.name}_nat {{\n  chain postrouting {{\n"
                   f"    type nat hook postrouting priority srcnat;\n"
                   f'    ip saddr {self.subnet}.0/24 oifname != "{self.name}" masquerade;\n  }}\n}}\n')
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        for namespace in self.namespaces:
            sh("ip", "netns", "add", namespace)
            sh("ip", "link", "add", self.veth(namespace), "type", "veth", "peer", "name", "eth0",
                       "netns", namespace)
            sh("ip", "link", "set", self.veth(namespace), "master", self.name, "up")
            for command in (["addr", "add", f"{self.address(namespace)}/24", "dev", "eth0"],
                            ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"],
                            ["route", "add", "default", "via", f"{self.subnet}.1"]):
                sh("ip", "-n", namespace, *command)
        return self

    def cut(self, namespace: str) -> None:
        """A partition: the namespace's link goes down, so nothing reaches it any more."""
        sh("ip", "link", "set", self.veth(namespace), "down")

    def mend(self, namespace: str) -> None:
        """The link comes back, as after a network blip."""
        sh("ip", "link", "set", self.veth(namespace), "up")

    def down(self) -> None:
        for namespace in self.namespaces:
            for pid in sh("ip", "netns", "pids", namespace, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", namespace, check=False)
            sh("ip", "link", "del", self.veth(namespace), check=False)
        sh("ip", "link", "del", self.name, check=False)
        sh("nft", "delete", "table", "ip", f"{self.name}_nat", check=False)
        if self.forwarding:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self.forwarding)
            self.forwarding = ""

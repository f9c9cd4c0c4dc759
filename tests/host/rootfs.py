"""Throwaway test hosts: a Debian root file system of their own, so that what a test provisions
(units in /etc/systemd, scripts in /usr/local, users, sudoers, /run) lands there and never on the
machine that runs the tests.

The base root is built once with mmdebstrap (about 40 s) and kept in a cache folder that later
sessions reuse; each host overlays it (overlayfs: an empty upper layer, so a host starts in an
instant and its changes go with it). Its sshd runs chrooted there, in mount and PID namespaces
of its own, with its own tmpfs /dev/shm, terminals (devpts) and /proc: `ps` there sees only the host's processes,
and killing the namespace's first process ends all of them at once, as losing a VM does. The
network is the machine's (loopback, a port of the host's own), or a network namespace's on a
bridge (tests/host/sshd.py) for the tests that cut a host's link.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.host.sshd import SESSION, accepted, free_port, machine_lock, sh, start_sshd
from tests.support import built_once

SUITE = "bookworm"
#: What a TPU VM's image has that the tests rely on; build-essential, cmake and ninja-build are there
#: already so that "build tools" is ok at once (a test removes ninja-build to see it install); git
#: for the packages MaxText's extra deps script installs from git.
PACKAGES = (
    "openssh-server,sudo,python3,python3-venv,ca-certificates,iproute2,systemd,procps,e2fsprogs,"
    "build-essential,cmake,ninja-build,git"
)
CACHE = Path(os.environ.get("TPU_GRPO_TEST_CACHE") or Path.home() / ".cache" / "tpu-grpo-tests")
HOST_PREFIX = "tpu-grpo-host-"  # the folders of the throwaway hosts (a temporary folder each)
MADE: set[Path] = set()  # this test process's hosts' folders
USER = "tpu"  # the host's own account: its /etc/passwd is its own, so the name never clashes


def base_root() -> Path:
    """The extracted base root file system, built on first use and reused."""
    digest = hashlib.sha256(f"{SUITE} {PACKAGES}".encode()).hexdigest()[:10]
    return built_once(
        CACHE / f"rootfs-{SUITE}-{digest}",
        lambda root: sh("mmdebstrap", "--quiet", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(root)),
    )


#: The machine's Python 3.12 (pyenv's build, linked to its libpython by absolute path): each host
#: sees it read-only at the same path, because `uv python install` cannot download here and Debian 12
#: has 3.11. What the machine's network needs goes in too: its CA bundle (the registries are reached
#: through a TLS proxy) and pip's configuration.
COPIED_FROM_MACHINE = ("etc/ssl/certs/ca-certificates.crt", "etc/pip.conf", "etc/resolv.conf")
LOGIN_SHELL = "/usr/local/bin/tpu-grpo-test-shell"
COMMAND_LOG_DIR = "var/tmp/tpu-grpo-test-commands"


def python312_bin() -> str:
    """The folder of the machine's Python 3.12, which uv finds on the hosts' PATH."""
    found = sorted(glob.glob("/root/.pyenv/versions/3.12*/bin")) or (
        [os.path.dirname(shutil.which("python3.12"))] if shutil.which("python3.12") else []
    )
    if not found:
        raise RuntimeError("no Python 3.12 on this machine: the test hosts need one for `uv python find 3.12`")
    return found[-1]


#: playbooks/host.yml variables for what this machine allows: no apt upgrade, uv from PyPI, and a
#: small real package in place of MaxText (whose install needs the PyTorch index and GitHub).
TEST_VARS = ["apt_upgrade=false", "uv_source=pip", "maxtext_spec=six==1.16.0", "extra_deps=false", "hf_model="]


@dataclass
class DataDisk:
    """A loop device standing in for the VM's data disk: the same device path on the machine and on the host."""

    device: str
    mount: str = "/mnt/disks/data"  # playbooks/host.yml's default

    @classmethod
    def attach(cls, image: Path, size_mb: int) -> DataDisk:
        with image.open("wb") as handle:
            handle.truncate(size_mb * 1024 * 1024)
        with machine_lock():  # another test process's --find would find the same free device
            return cls(
                subprocess.run(
                    ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
                ).stdout.strip()
            )

    def detach(self) -> None:
        subprocess.run(["losetup", "-d", self.device], capture_output=True)


@dataclass
class HostUser:
    """The host's one account. Its uid is unique on the machine, so that nftables (`offline`) and
    /proc scans on the machine can tell this host's processes from another's."""

    name: str
    uid: int
    home: Path  # as the test machine sees it: under the host's root
    root: Path

    def commands(self) -> list[str]:
        """Every command line sshd ran for this user so far (its login shell records them)."""
        log = self.root / COMMAND_LOG_DIR / self.name
        return [command for command in log.read_text().split("\0") if command] if log.exists() else []


@dataclass
class ThrowawayHost:
    """One host: its root (an overlay of the base), its sshd on address:port (in a network namespace
    when `netns` names one), one sudo user, and optionally a block device as its data disk."""

    folder: Path
    authorized_key: str
    address: str = "127.0.0.1"
    port: int = 0
    netns: str | None = None
    disk_device: str | None = None  # a loop device of the machine, given the same path on the host
    login_shell: str = LOGIN_SHELL  # records each command sshd runs; /bin/bash: as on a VM
    uid: int | None = None  # the user's; None: one no account of the machine has (a VM made anew from the
    # same image gives its user the same uid, which a data disk carried over needs)
    env: dict[str, str] = field(default_factory=dict)  # more of every SSH session's environment
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
        return self.known_hosts_line_at(self.port)

    def known_hosts_line_at(self, port: int) -> str:
        """This host's key as known_hosts records it for `port` (also a relay's in front of it)."""
        key = (self.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]
        name = self.address if port == 22 else f"[{self.address}]:{port}"
        return f"{name} ssh-ed25519 {key}\n"

    def chroot(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command on the host's file system, as root (outside its namespaces)."""
        return sh("/usr/sbin/chroot", str(self.root), *argv, check=check)

    def path(self, inside: str) -> Path:
        """A path of the running host as this machine reaches it: through its root as its own mount
        namespace has it (its data disk and /dev/shm included). An absolute symlink met on the way
        would lead back to this machine's files: name the real path."""
        return Path(f"/proc/{self.first_process()}/root") / inside.lstrip("/")

    def start(self) -> ThrowawayHost:
        return self.prepare().boot()

    def prepare(self) -> ThrowawayHost:
        """The host's disk as a VM's is before it boots: root, keys, user, sudoers, sshd's config."""
        base = base_root()
        MADE.add(self.folder)
        for name in ("upper", "work", "root"):
            (self.folder / name).mkdir(parents=True)
        sh(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={base},upperdir={self.folder / 'upper'},workdir={self.folder / 'work'}",
            str(self.root),
        )
        for name in COPIED_FROM_MACHINE:
            if Path("/", name).is_file():
                shutil.copyfile(Path("/", name), self.root / name)
        self.chroot("ssh-keygen", "-q", "-A")
        shell = self.root / LOGIN_SHELL.lstrip("/")
        shell.write_text(
            '#!/bin/bash\nif [ "$1" = "-c" ]; then printf "%s\\0" "$2" >> '
            f'/{COMMAND_LOG_DIR}/"$(id -un)"; fi\nexec /bin/bash "$@"\n'
        )
        shell.chmod(0o755)
        (self.root / COMMAND_LOG_DIR).mkdir(mode=0o1777)
        (self.root / COMMAND_LOG_DIR).chmod(0o1777)
        uid = self.uid or unused_uid()
        self.chroot("useradd", "--uid", str(uid), "--create-home", "--shell", self.login_shell, USER)
        self.chroot("usermod", "-p", "*", USER)
        (self.root / "etc/sudoers.d/tpu-grpo-test").write_text(f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
        (self.root / "etc/sudoers.d/tpu-grpo-test").chmod(0o440)
        ssh = self.root / "home" / USER / ".ssh"
        ssh.mkdir()
        (ssh / "authorized_keys").write_text(self.authorized_key)
        self.chroot("chown", "-R", f"{USER}:{USER}", f"/home/{USER}")
        self.user = HostUser(USER, uid, self.root / "home" / USER, self.root)
        (self.root / "root").chmod(0o711)  # the host's own /root: its users reach the Python 3.12 in it
        (self.root / python312_bin().lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        if self.disk_device:
            os.mknod(self.root / self.disk_device.lstrip("/"), 0o660 | stat.S_IFBLK, os.stat(self.disk_device).st_rdev)
        self.port = self.port or free_port()
        (self.root / "run/sshd").mkdir(exist_ok=True)
        (self.root / "etc/ssh/sshd_test_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.address}",
                    "HostKey /etc/ssh/ssh_host_ed25519_key",
                    "PidFile /run/sshd-test.pid",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    "MaxStartups 100",
                    "SetEnv SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
                    + f" PATH={python312_bin()}:/usr/local/bin:/usr/bin:/bin"
                    + "".join(f" {name}={value}" for name, value in self.env.items()),
                    "",
                ]
            )
        )
        return self

    def boot(self) -> ThrowawayHost:
        """Start the host: its namespaces, its /dev/shm and terminals, the Python 3.12 (read-only), its sshd."""
        python = os.path.dirname(python312_bin())
        inside = (
            f"mount -t tmpfs -o mode=1777 tmpfs {self.root}/dev/shm && "
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts {self.root}/dev/pts && "
            f"mount --bind {self.root}/dev/pts/ptmx {self.root}/dev/ptmx && "
            f"mount --bind {python} {self.root}{python} && mount -o remount,bind,ro {self.root}{python} && "
            f"exec /usr/sbin/chroot {self.root} /usr/sbin/sshd -D -e -f /etc/ssh/sshd_test_config"
        )
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.process = start_sshd(
            [*prefix, "unshare", "--mount", "--pid", "--fork", f"--mount-proc={self.root}/proc", "sh", "-c", inside],
            self.log,
        )
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

    def kill_sessions(self) -> None:
        """Drop every live connection of the user, as a dead link would: its sshd and what runs under it."""
        sh("pkill", "-KILL", "-U", str(self.user.uid), check=False)

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


def host_folder() -> Path:
    """A new folder for one throwaway host."""
    return Path(tempfile.mkdtemp(prefix=HOST_PREFIX))


#: Each pytest-xdist worker's hosts take uids of a range of their own: a uid is how `pkill -U`, nftables and /proc
#: scans on the machine tell one host's processes from another's.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def unused_uid() -> int:
    """A uid no account of the machine has (the host's account is only in the host's /etc/passwd), in this worker's
    range."""
    while True:
        uid = 20000 + 2000 * (WORKER % 20) + secrets.randbelow(2000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def difference(before, after) -> object:
    """What changed between two snapshots of one kind (a text, a list, or a tree of path -> stat)."""
    if isinstance(before, dict):
        return {
            path: (before.get(path), after.get(path))
            for path in sorted(before.keys() | after.keys())
            if before.get(path) != after.get(path)
        }
    lines = (before.splitlines(), after.splitlines()) if isinstance(before, str) else (before, after)
    return {"gone": sorted(set(lines[0]) - set(lines[1])), "new": sorted(set(lines[1]) - set(lines[0]))}


def machine_state() -> dict[str, object]:
    """What the test machine must have exactly as before the throwaway hosts' tests: its packages,
    users and groups, every file of /etc and /usr/local (size, mode, mtime), its mounts and the folders of its
    /dev/shm. Another
    test session's throwaway hosts and network namespaces, and the /run/netns that `ip netns` shares
    among all sessions, are not this session's to answer for."""

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

    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    ours = [str(folder) for folder in MADE]
    mounts = [
        mount
        for mount in mounts
        if mount != "/run/netns"
        and not (HOST_PREFIX in mount and not any(mount.startswith(folder + "/") for folder in ours))
        and not (mount.startswith("/run/netns/") and not mount.endswith(SESSION))
    ]
    return {
        "packages": sh("dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\n").stdout,
        "users": Path("/etc/passwd").read_text() + Path("/etc/group").read_text(),
        "etc": tree("/etc"),
        "usr_local": tree("/usr/local"),
        "mounts": sorted(mounts),
        "shm": sorted(entry.name for entry in os.scandir("/dev/shm") if entry.is_dir()),  # a script's /dev/shm/MODEL
    }

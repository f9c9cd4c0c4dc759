"""What the throwaway hosts (tests/host/rootfs.py) run on: their sshd in the foreground, the count of
connections it accepted, and the network between hosts (network namespaces on a bridge, and a
user cut off by nftables).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support import file_lock


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kwargs)


def start_sshd(argv: list[str], log: Path) -> subprocess.Popen:
    """Start an sshd in the foreground (`-D -e`), its messages to `log`; returns once it listens (this start's
    line: a host booted again appends to its log)."""
    started = log.read_text(errors="replace").count("Server listening") if log.exists() else 0
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    deadline = time.monotonic() + 10
    while log.read_text(errors="replace").count("Server listening") <= started:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start ({' '.join(argv)}): {log.read_text()}")
        time.sleep(0.02)
    return process


def accepted(log: Path, user: str) -> int:
    """How many SSH connections an sshd has accepted for the user, from its log."""
    return log.read_text(errors="replace").count(f"Accepted publickey for {user} ")


@contextmanager
def offline(uid: int):
    """While inside, the processes of the user `uid` reach nothing but loopback (nftables): a step
    that would download again fails at once instead of quietly succeeding over the network."""
    table = f"tpu_grpo_offline_{uid}"
    sh("nft", "add", "table", "inet", table)
    try:
        sh("nft", f"add chain inet {table} out {{ type filter hook output priority 0 ; }}")
        sh("nft", f"add rule inet {table} out meta skuid {uid} oifname != lo reject")
        yield
    finally:
        sh("nft", "delete", "table", "inet", table)


NETNS = Path("/run/netns")


#: Names of this test process's own (its pid): test processes at once (pytest-xdist's workers) never share a bridge.
SESSION = f"{os.getpid():x}"
#: What the bridges of every test process share: IPv4 forwarding and /run/netns, as the machine had them before the
#: first bridge (machine.json), and one file per bridge up (its pid inside); the last bridge down restores them.
SHARED = Path(tempfile.gettempdir()) / "tpu-grpo-bridges"


def machine_lock():
    """One test process at a time changes what all of them share: the bridges' forwarding, subnets and /run/netns,
    and the loop devices."""
    return file_lock(Path(tempfile.gettempdir()) / "tpu-grpo-machine.lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Bridge:
    """A bridge with one network namespace per host on veth links, reaching the package registries
    through this machine (forwarding and masquerade) as a real VM would. Hosts are named by a
    label ("a"); `netns(label)` is the namespace's name, unique to this test process, and the subnet one no other
    interface of the machine has."""

    labels: tuple[str, ...]
    name: str = f"tgb{SESSION}"
    subnet: str = ""

    @property
    def namespaces(self) -> list[str]:
        return [self.netns(label) for label in self.labels]

    @staticmethod
    def netns(label: str) -> str:
        return f"tg{label}{SESSION}"

    def address(self, label: str) -> str:
        return f"{self.subnet}.{self.labels.index(label) + 2}"

    @staticmethod
    def veth(namespace: str) -> str:
        return f"{namespace}-br"

    def up(self) -> Bridge:
        self.down()  # whatever a killed earlier run left behind
        with machine_lock():
            self._join()
            self.subnet = self._free_subnet()
            self._make()
        return self

    def _join(self) -> None:
        """Count this bridge among the machine's (not those of killed runs); the first saves what the machine had,
        which stays saved until the last bridge is down, a killed run's included."""
        SHARED.mkdir(exist_ok=True)
        for stale in SHARED.glob("tgb*"):
            if not _alive(int(stale.read_text())):
                stale.unlink()
        if not (SHARED / "machine.json").exists():
            (SHARED / "machine.json").write_text(
                json.dumps(
                    {
                        "forwarding": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
                        "netns_folder": NETNS.exists(),
                    }
                )
            )  # `ip netns add` makes it, and mounts it on itself
        (SHARED / self.name).write_text(str(os.getpid()))

    @staticmethod
    def _free_subnet() -> str:
        taken = sh("ip", "-4", "-o", "addr", "show").stdout
        return next(f"10.{n}.0" for n in range(100, 200) if f" 10.{n}.0." not in taken)

    def _make(self) -> None:
        sh("ip", "link", "add", self.name, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.name)
        sh("ip", "link", "set", self.name, "up")
        sh(
            "nft",
            "-f",
            "-",
            input=f"table ip {self.name}_nat {{\n  chain postrouting {{\n"
            f"    type nat hook postrouting priority srcnat;\n"
            f'    ip saddr {self.subnet}.0/24 oifname != "{self.name}" masquerade;\n  }}\n}}\n',
        )
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        for label, namespace in zip(self.labels, self.namespaces):
            sh("ip", "netns", "add", namespace)
            sh("ip", "link", "add", self.veth(namespace), "type", "veth", "peer", "name", "eth0", "netns", namespace)
            sh("ip", "link", "set", self.veth(namespace), "master", self.name, "up")
            for command in (
                ["addr", "add", f"{self.address(label)}/24", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
                ["link", "set", "lo", "up"],
                ["route", "add", "default", "via", f"{self.subnet}.1"],
            ):
                sh("ip", "-n", namespace, *command)

    def cut(self, label: str) -> None:
        """A partition: the host's link goes down, so nothing reaches it any more."""
        sh("ip", "link", "set", self.veth(self.netns(label)), "down")

    def mend(self, label: str) -> None:
        """The link comes back, as after a network blip."""
        sh("ip", "link", "set", self.veth(self.netns(label)), "up")

    def down(self) -> None:
        with machine_lock():
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
            self._leave()

    def _leave(self) -> None:
        """The last bridge down gives the machine back its forwarding and /run/netns as they were."""
        (SHARED / self.name).unlink(missing_ok=True)
        if not SHARED.is_dir() or any(SHARED.glob("tgb*")):
            return
        machine = json.loads((SHARED / "machine.json").read_text())
        Path("/proc/sys/net/ipv4/ip_forward").write_text(machine["forwarding"])
        if not machine["netns_folder"] and NETNS.exists() and not any(NETNS.iterdir()):
            sh("umount", str(NETNS), check=False)
            NETNS.rmdir()
        shutil.rmtree(SHARED)

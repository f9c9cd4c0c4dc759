"""Where the hosts are (stack outputs or `--host`) and SSH connections that are safe and notice failure.

Host keys are checked against a project-local known_hosts: the first contact records the
key (like `StrictHostKeyChecking=accept-new`) and says so; a changed key is refused. A dead
link fails within seconds (keepalive plus TCP_USER_TIMEOUT) instead of hanging for minutes.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shlex
import shutil
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tpu_grpo.config import host_paths, laptop_paths, settings, values
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.keys import PUBLIC_KEY_TYPES

# paramiko logs a failed connection with its traceback (Python's last-resort handler prints it on stderr);
# tpu-grpo says each failure itself, in one line with the fix.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

CONNECT_TIMEOUT_S = 5
KEEPALIVE_S = 2
TCP_USER_TIMEOUT_MS = 5000
RETRY_CONNECT_S = 2
_HOST_SPEC = re.compile(
    r"(?P<user>[a-z_][a-z0-9_.-]*)@(?P<address>[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>[0-9]{1,5}))?"
)


class HostError(UserError):
    """A host that cannot be named, reached or trusted; the message is one line with the fix."""


class ConnectError(HostError):
    """A well-named host that could not be reached or trusted: a failure, not bad input."""

    exit_code = 1


@dataclass(frozen=True)
class Host:
    user: str
    address: str
    port: int = 22
    identity: Path | None = None
    #: The stack's VM: what to do when it does not answer (it may have stopped); "" for --host's.
    unreachable_fix: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return f"{self.user}@{self.address}" + ("" if self.port == 22 else f":{self.port}")

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko file this host's key under."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def identity_file(identity: str | None) -> Path | None:
    """`--identity KEY` -> its path, checked to be a file."""
    if identity is None:
        return None
    try:
        path = values.existing_file(identity)
        with path.open("rb") as file:
            first = file.read(64).split(b" ", 1)[0].decode("ascii", "replace")
    except (values.Refused, OSError) as problem:
        raise HostError(
            f"--identity {identity!r} {problem}; fix: give the private key whose .pub is on the VM"
        ) from None
    if first in PUBLIC_KEY_TYPES:  # ssh would offer nothing with it
        private = identity.removesuffix(".pub") if identity.endswith(".pub") else "the key without .pub"
        raise HostError(
            f"--identity {identity!r} is a public key ({first}); fix: --identity {private}, its private half"
        )
    return path


def parse(spec: str, identity: Path | None = None) -> Host:
    """`USER@ADDR[:PORT]` -> Host (with the key `--identity` named), or a one-line HostError."""
    match = _HOST_SPEC.fullmatch(spec)
    try:
        if not match or not 0 < int(match["port"] or 22) < 65536:
            raise values.Refused("is not USER@ADDRESS[:PORT]")
        address = values.address(match["address"])
    except values.Refused as problem:
        raise HostError(f"--host {spec!r} {problem}; fix: e.g. --host ubuntu@203.0.113.7") from None
    return Host(match["user"], address, int(match["port"] or 22), identity)


@dataclass(frozen=True)
class HostFlags:
    """The host flags, checked once before anything connects (or before `invoke up` has made the VM): --host's
    hosts (none: the stack's VM), --identity's key, --wait's seconds, the stack."""

    given: tuple[Host, ...] = ()
    identity: Path | None = None
    wait_s: float = 0.0
    stack: str | None = None

    def hosts(self, chosen: settings.Settings | None = None) -> list[Host]:
        """--host's hosts, else the stack's VM (its address from the stack's outputs, asked now; `chosen`: the stack's
        settings, when already read)."""
        return list(self.given) or from_stack(chosen or settings.load(self.stack, lenient=True), self.identity)


def check_flags(
    specs: list[str] | None, identity: str | None, wait: str | None, stack: str | None = None, one: bool = True
) -> HostFlags:
    """The host flags checked; `one`: the task acts on one host (all but provisioning, which takes several)."""
    key = identity_file(identity)
    given = tuple(parse(spec, key) for spec in specs or [])
    if len({host.name for host in given}) != len(given):
        raise HostError(f"--host names the same host twice ({', '.join(specs or [])}); fix: give each host once")
    if one:
        only(list(given))
    return HostFlags(given, key, wait_seconds(wait), stack)


def only(hosts: list[Host]) -> list[Host]:
    """The hosts, refused when they are several: MaxText's jobs, a run's files and a VM's record are one VM's (a
    multi-host slice's jobs would need all its workers at once: docs/slices.md)."""
    if len(hosts) > 1:
        raise HostError(
            f"this task acts on one host, got {len(hosts)} ({', '.join(host.name for host in hosts)}); "
            "fix: pass one --host"
        )
    return hosts


def require_vm(chosen: settings.Settings) -> None:
    """A task that logs into the stack's VM refuses a slice's stack, which has none."""
    if chosen.tpu_slice:
        raise HostError(
            f"stack '{chosen.stack}' is slice {chosen.slice} on GKE, which has no VM to log into; "
            "fix: run this task on a one-VM stack (docs/slices.md)"
        )


def from_stack(chosen: settings.Settings, identity: Path | None = None) -> list[Host]:
    """The VM that `pulumi up` made: its external IP, SSH user and the private key of its public key."""
    from tpu_grpo.cloud.stack import outputs

    require_vm(chosen)
    if shutil.which("pulumi") is None:
        raise HostError(
            f"no --host given and no pulumi CLI to read stack '{chosen.stack}' outputs; "
            "fix: pass --host USER@ADDRESS (and --identity KEY), or install pulumi and run `invoke up`"
        )
    made = outputs(chosen.stack)
    if not made.get("external_ip"):
        raise HostError(
            f"stack '{chosen.stack}' has no VM (no external_ip output); "
            "fix: run `uv run invoke up`, or pass --host USER@ADDRESS"
        )
    key = identity or Path(str(chosen.ssh_public_key_path).removesuffix(".pub")).expanduser()
    return [
        Host(
            made.get("ssh_user") or chosen.ssh_user,
            made["external_ip"],
            22,
            key if key.is_file() else None,
            chosen.obtained.unreachable_fix(chosen.idle_stop_minutes),
        )
    ]


def wait_seconds(text: str | None) -> float:
    """`--wait SECONDS` -> seconds, or a one-line HostError."""
    if text is None:
        return 0.0
    return float(values.flag("--wait", text, values.whole(0, 99_999, " seconds; 0: no retries"), "120"))


def forget_key_command(host: Host) -> str:
    """The command that forgets the host's recorded key, quoted for pasting (a project folder may hold a space)."""
    return shlex.join(["ssh-keygen", "-R", host.known_hosts_name, "-f", str(known_hosts_path())])


def known_hosts_path() -> Path:
    return laptop_paths.known_hosts()


def openssh(ssh: str, host: Host, remote_command: str | None = None) -> list[str]:
    """OpenSSH's client (`ssh`, its path) on the host, the host key checked against the one tpu-grpo recorded
    (never accepted anew) and the user's own ssh config left out, as paramiko does: running `remote_command`
    without a terminal, or (None) a person's login shell on one."""
    argv = [
        ssh,
        "-F",
        "/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts_path()}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "ConnectTimeout=15",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        "LogLevel=ERROR",
        "-p",
        str(host.port),
        "-l",
        host.user,
    ]
    if host.identity:
        argv += ["-i", str(host.identity), "-o", "IdentitiesOnly=yes"]
    if remote_command is None:
        return [*argv, "-t", host.address]
    return [*argv, "-T", "-x", "-o", "BatchMode=yes", host.address, remote_command]


def forget_host_key(host: Host) -> None:
    """Drop the host's recorded key: only for a VM that `pulumi up` has just created anew (a new
    boot disk, so a new key), which the next connection then records afresh and says so."""
    path = known_hosts_path()
    if path.is_file():
        kept = [line for line in path.read_text().splitlines(True) if line.split(" ", 1)[0] != host.known_hosts_name]
        path.write_text("".join(kept))


def fingerprint(key) -> str:
    import base64
    import hashlib

    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class _RecordNewKey:
    """paramiko policy: trust and record a host seen for the first time (accept-new), and say so."""

    _lock = threading.Lock()

    def __init__(self, path: Path, notices: list[str]):
        self.path, self.notices = path, notices

    def missing_host_key(self, client, hostname, key):
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as known:
                known.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.notices.append(
            f"{hostname}: first contact, recorded host key {key.get_name()} {fingerprint(key)} in {self.path}"
        )


def connect(host: Host, notices: list[str] | None = None, wait_s: float = 0):
    """An open Fabric connection with a verified host key, or a one-line HostError.

    A VM that has just booted refuses SSH until sshd runs and the guest agent has made the
    user from the metadata key: with `wait_s`, such refusals are retried until it has passed.
    A changed host key is never retried."""
    import paramiko

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _open(host, _tcp_connect(host), notices if notices is not None else [])
        except (paramiko.AuthenticationException, OSError, paramiko.SSHException) as error:
            if isinstance(error, paramiko.BadHostKeyException) or time.monotonic() + RETRY_CONNECT_S > deadline:
                raise _explained(host, error) from None
            time.sleep(RETRY_CONNECT_S)


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (Linux's TCP_QUICKACK after each recv).

    sshd does not set TCP_NODELAY on command sessions, so a small reply it writes while an earlier
    one is unacknowledged waits for our ACK, which Linux delays by 40 ms: the first command after
    login paid that every time. Measured in one run (9 interleaved rounds, 2026-12-04): a no-op
    `invoke provision` took 0.332 s with it and 0.375 s without, 13 % more."""

    def recv(self, size: int, *flags) -> bytes:
        data = super().recv(size, *flags)
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data


def _tcp_connect(host: Host) -> socket.socket:
    """The TCP connection under SSH: connect timeout, no Nagle delay on our small packets, quick ACKs,
    and (Linux) TCP_USER_TIMEOUT so that unacknowledged data on a dead link fails it in seconds."""
    raw = socket.create_connection((host.address, host.port), timeout=CONNECT_TIMEOUT_S)
    sock = _QuickAckSocket(fileno=raw.detach()) if hasattr(socket, "TCP_QUICKACK") else raw
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux only; elsewhere the keepalive alone notices
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)
    return sock


def _open(host: Host, sock: socket.socket, notices: list[str]):
    try:
        import fabric
        from paramiko.config import SSHConfig

        known_hosts = known_hosts_path()
        config = fabric.Config(ssh_config=SSHConfig(), overrides={"run": {"in_stream": False}})
        connect_kwargs = {"sock": sock, "banner_timeout": CONNECT_TIMEOUT_S, "auth_timeout": 15}
        if host.identity:
            connect_kwargs.update(key_filename=str(host.identity), look_for_keys=False, allow_agent=False)
        connection = fabric.Connection(
            host.address, user=host.user, port=host.port, config=config, connect_kwargs=connect_kwargs
        )
        connection.client.get_host_keys().clear()
        if known_hosts.is_file():
            connection.client.load_host_keys(str(known_hosts))
        connection.client.set_missing_host_key_policy(_RecordNewKey(known_hosts, notices))
        connection.open()
    except BaseException:
        sock.close()
        raise
    connection.transport.set_keepalive(KEEPALIVE_S)
    return connection


class ConnectionLost(ConnectError):
    """The SSH connection dropped under a command (Fabric reports that as exit code -1)."""


def bash_command(script: str, become: bool = False) -> str:
    """The command line that runs a script: bash, as root through sudo when `become`."""
    return ("sudo -n bash -c " if become else "bash -c ") + shlex.quote(script)


def run(connection, command: str, **kwargs):
    """The one way commands run on a host: connection.run, except that a dropped connection raises
    ConnectionLost instead of passing for exit code -1, and is never reopened silently by Fabric
    (without keepalive) on the next call."""
    if not connection.is_connected:
        raise ConnectionLost(
            f"{connection.user}@{connection.host}: the connection had dropped; fix: run the same command again"
        )
    result = connection.run(command, **kwargs)
    if result.exited == -1:  # no exit status: the transport died, or a signal killed the command
        connection.transport.join(1)  # the transport thread drops its channels just before it ends
        if not connection.is_connected:
            raise ConnectionLost(
                f"{connection.user}@{connection.host}: the connection dropped while a command "
                "ran; fix: run the same command again"
            )
    return result


#: Linux's longest single argument (MAX_ARG_STRLEN, 32 pages): sshd hands the command to the login shell as one.
LONGEST_ARGUMENT = 32 * 4096


def run_script(connection, script: str, become: bool = False):
    """Run a bash script on the host and return its result, whatever its exit code (the caller judges it). A script
    too long for one argument (a pipeline's chain, its steps inside) goes over SFTP to a file only the user reads,
    which bash runs and then removes (Invoke feeds a command's standard input a byte at a time)."""
    command = bash_command(script, become)
    if len(command.encode()) < LONGEST_ARGUMENT:
        return run(connection, command, hide=True, warn=True, in_stream=False)
    sftp = connection.sftp()
    path = sftp.normalize(f".tpu-grpo-script-{uuid.uuid4().hex}.sh")
    with sftp.open(path, "w") as file:
        file.chmod(0o600)
        file.write(script)
    ran = f'bash {path}; code=$?; rm -f {path}; exit "$code"'
    return run(connection, bash_command(ran, become), hide=True, warn=True, in_stream=False)


@contextmanager
def busy(connection, what: str):
    """Keep the VM from stopping itself while this laptop works on it without the TPU lock or a terminal (a fetch,
    a provisioning run): a lease in host_paths.BUSY, touched every host_paths.LEASE_EVERY_S on a thread of its own and
    removed at the end. A laptop that goes away stops touching it, and the idle stop then counts from the last touch."""
    lease = f"{host_paths.BUSY}/{what}-{os.getpid()}-{threading.get_ident()}"
    done = threading.Event()

    def touch() -> None:
        while connection.is_connected:
            try:
                run_script(connection, f"mkdir -p {host_paths.BUSY} && touch {lease}")
            except Exception:  # noqa: BLE001 - a lost connection ends the lease; the work itself reports it
                return
            if done.wait(host_paths.LEASE_EVERY_S):
                return

    toucher = threading.Thread(target=touch, name=f"lease {what}", daemon=True)
    toucher.start()
    try:
        yield
    finally:
        done.set()
        toucher.join()
        if connection.is_connected:
            run_script(connection, f"rm -f {lease}")


def write_text(connection, path: str, text: str) -> None:
    """Write a small file on the host whole or not at all (a temporary file, then a rename)."""
    encoded = base64.b64encode(text.encode()).decode()
    run_script(
        connection, f'mkdir -p "$(dirname {path})" && echo {encoded} | base64 -d > {path}.tmp && mv {path}.tmp {path}'
    )


def _explained(host: Host, error: Exception) -> HostError:
    import paramiko

    if isinstance(error, paramiko.BadHostKeyException):
        return ConnectError(
            f"{host.name}: host key changed (recorded {fingerprint(error.expected_key)}, offered "
            f"{fingerprint(error.key)}); refusing to connect. If the VM was rebuilt, forget the old key: "
            f"{forget_key_command(host)}"
        )
    if isinstance(error, paramiko.AuthenticationException):
        return ConnectError(
            f"{host.name}: the key was refused; fix: pass --identity with the private key whose "
            "public key the VM has (sshPublicKeyPath), or --wait 120 if the VM has just booted"
        )
    stopped = f"{host.unreachable_fix}; else " if host.unreachable_fix else "check the VM is running, "
    return ConnectError(
        f"{host.name}: cannot connect ({error or type(error).__name__}); fix: {stopped}check its "
        "firewall admits your address, or --wait 120 if it has just booted"
    )

"""Trained models that survive the VM: MaxText exports to /dev/shm, which a restart empties and
`pulumi destroy` takes with the disks, so a model is copied to the data disk with SHA256SUMS and
fetched to the laptop, resumably, every file checked against those sums as it arrives.

A fetch streams each file over OpenSSH's own client, several files at once (paramiko's SFTP, in
pure Python, moved a 2 GB model at less than half the speed of `scp`); without `ssh` on the laptop
it uses paramiko's SFTP. Either way the host key is the one tpu-grpo recorded.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tpu_grpo.config import values
from tpu_grpo.config.errors import UserError
from tpu_grpo.host import hosts, remote

SUMS = "SHA256SUMS"
CHUNK = 1 << 20
MISSING_EXIT = 3
#: Files fetched at once, each over an OpenSSH connection of its own and hashed as it arrives.
STREAMS = 4


class ArtifactError(UserError):
    """A model that cannot be saved, listed or fetched; one line naming the bad value and the fix."""


class HostStateError(ArtifactError):
    """The flags were right, but the host has no such model: a failure, not bad input."""

    exit_code = 1


@dataclass
class FetchResult:
    local_dir: Path
    files: list[str] = field(default_factory=list)
    bytes_total: int = 0
    bytes_transferred: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "local_dir": str(self.local_dir),
            "files": self.files,
            "bytes_total": self.bytes_total,
            "bytes_transferred": self.bytes_transferred,
            "skipped": self.skipped,
        }


def save_script(source: str, dest: str, replace: bool = False) -> str:
    """Bash that copies folder `source` to `dest` via `dest.partial`, with SHA256SUMS of the source
    (hashed while the copy runs) that the copy is then checked against; a no-op when `dest` already
    holds files that match its SHA256SUMS, unless `replace`. Hashing and checking use every core (remote/save.sh)."""
    return remote.shell(
        "save",
        "sums",
        SRC=source.rstrip("/") or "/",
        DEST=dest.rstrip("/") or "/",
        REPLACE="true" if replace else "false",
        SUMS=SUMS,
        MISSING_EXIT=MISSING_EXIT,
    )


def _where(connection) -> str:
    return f"{connection.user}@{connection.host}"


def _relative(name: str, origin: str) -> str:
    """A manifest path that stays inside its folder, or ArtifactError."""
    name = name.removeprefix("./")
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or ".." in parts or name == SUMS:
        raise ArtifactError(f"{origin} lists {name!r}, not a file inside the folder; fix: save the model again")
    return name


def parse_sums(text: str, origin: str) -> dict[str, str]:
    """`sha256sum` output -> relative path -> digest."""
    sums = {}
    for line in text.splitlines():
        digest, name = line[:64], line[66:]
        if len(line) < 67 or line[64:66] not in ("  ", " *") or not all(c in "0123456789abcdef" for c in digest):
            raise ArtifactError(
                f"{origin} has a line that is not `SHA256  PATH`: {line[:100]!r}; fix: save the model again"
            )
        sums[_relative(name, origin)] = digest
    return sums


def _manifest(connection, folder: str) -> tuple[str, dict[str, tuple[int, str]]]:
    """The folder's absolute path and its files (path -> (size, sha256)), in one round trip."""
    script = remote.shell("manifest", "sums", FOLDER=folder.rstrip("/") or "/", SUMS=SUMS, MISSING_EXIT=MISSING_EXIT)
    where = f"{_where(connection)}:{folder}"
    result = hosts.run_script(connection, script)
    if result.exited == MISSING_EXIT:
        raise ArtifactError(
            f"{where} is missing or has no files; fix: save the model there first (or name the right folder)"
        )
    if result.exited != 0:
        raise ArtifactError(
            f"{where}: listing the files failed ({result.stderr.strip()[-300:]}); "
            "fix: check the folder on the host is readable"
        )
    absolute, _, rest = result.stdout.partition("\n")
    sums_text, _, sizes_text = rest.partition("--sizes\n")
    sizes = {name: int(size) for size, _, name in (line.partition(" ") for line in sizes_text.splitlines())}
    manifest = {}
    for name, digest in parse_sums(sums_text, f"{where}/{SUMS}").items():
        if name not in sizes:
            raise ArtifactError(f"{where}/{name} is listed in {SUMS} but missing; fix: save the model again")
        manifest[name] = (sizes[name], digest)
    if not manifest:
        raise ArtifactError(f"{where}/{SUMS} lists no files; fix: save the model again")
    return absolute, manifest


def remote_manifest(connection, folder: str) -> dict[str, tuple[int, str]]:
    """Relative path -> (size, sha256) of every file in the host's `folder`: from its SHA256SUMS,
    or hashed on the spot when it has none."""
    return _manifest(connection, folder)[1]


def check_destination(to: str | Path) -> Path:
    """Prove that `to` can be made and written, making nothing: run this before connecting, so that a fetch that
    cannot connect leaves no empty folder behind."""
    try:
        return values.new_folder(str(to))
    except values.Refused as problem:
        raise ArtifactError(
            f"--to {str(to)!r} {problem}; fix: --to somewhere you can write, e.g. --to models/gsm8k "
            "(or leave it out: models/RUN)"
        ) from None


def _make_folder(local_dir: Path) -> None:
    try:
        local_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ArtifactError(
            f"--to {str(local_dir)!r}: cannot create it ({error.strerror or error}); fix: --to somewhere you can write"
        ) from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _resume_point(part: Path, size: int, digest) -> int:
    """How much of the file the `.part` already holds (hashed into `digest`); a too long one is dropped."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        return 0
    if have:
        with part.open("rb") as prefix:
            while block := prefix.read(CHUNK):
                digest.update(block)
    return have


def _receive(source, part: Path, have: int, size: int, digest, progress: Callable[[int], None]) -> int:
    """Append what `source` gives to `part`, hashing it, up to `size`; returns the bytes read."""
    read = 0
    with part.open("ab") as sink:
        while have + read < size and (block := source.read(min(CHUNK, size - have - read))):
            sink.write(block)
            digest.update(block)
            read += len(block)
            progress(have + read)
        sink.flush()
        os.fsync(sink.fileno())
    return read


def _over_sftp(connection) -> Callable:
    """A file's download over paramiko's SFTP (one channel, prefetching): (remote, part, size, progress)
    -> (bytes read, the part's sha256)."""
    sftp = connection.sftp()

    def download(remote: str, part: Path, size: int, progress: Callable[[int], None]) -> tuple[int, str]:
        digest = hashlib.sha256()
        have = _resume_point(part, size, digest)
        with sftp.open(remote, "rb") as source:
            source.seek(have)
            source.prefetch(size)
            return _receive(source, part, have, size, digest, progress), digest.hexdigest()

    return download


def _over_openssh(host: hosts.Host) -> Callable | None:
    """A file's download as the output of `tail` on the host, through OpenSSH's client (its ciphers run
    in C, at the link's speed); None without `ssh` on this laptop."""
    ssh = shutil.which("ssh")
    if ssh is None:
        return None

    def download(remote: str, part: Path, size: int, progress: Callable[[int], None]) -> tuple[int, str]:
        digest = hashlib.sha256()
        have = _resume_point(part, size, digest)
        argv = hosts.openssh(ssh, host, f"tail -c +{have + 1} -- {shlex.quote(remote)}")
        with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as client:
            assert client.stdout and client.stderr, "both piped"
            read = _receive(client.stdout, part, have, size, digest, progress)
            client.stdout.close()
            said = client.stderr.read().decode(errors="replace").strip().splitlines()
            code = client.wait()
        if have + read < size:
            if any("Host key verification failed" in line for line in said):
                raise hosts.ConnectError(
                    f"{host.name}: OpenSSH refuses the host's key: it is not the one recorded in "
                    f"{hosts.known_hosts_path()}; if the VM was really rebuilt, forget the old key: "
                    f"{hosts.forget_key_command(host)}"
                )
            why = f": {said[-1]}" if said else ""
            raise OSError(f"ssh ended after {have + read} of {size} bytes (exit {code}{why})")
        return read, digest.hexdigest()

    return download


def _fetch_file(
    where: str, download: Callable, remote: str, target: Path, digest: str, size: int, progress: Callable[[int], None]
) -> int:
    """Download one file via its `.part`, verify it and move it into place; returns the bytes read."""
    import paramiko

    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    read = 0
    for _ in range(2):
        try:
            count, got = download(remote, part, size, progress)
        except (OSError, EOFError, paramiko.SSHException) as error:
            raise ArtifactError(
                f"{where}:{remote}: download stopped ({error}); fix: run the same fetch again, it resumes"
            ) from None
        read += count
        if got == digest:
            os.replace(part, target)
            return read
        part.unlink()
    raise ArtifactError(
        f"{where}:{remote}: sha256 {got} after downloading twice, {SUMS} says "
        f"{digest}; fix: check the host copy with sha256sum -c {SUMS} in its folder, "
        "save it again, then fetch"
    )


def _silent(done: int, total: int, name: str) -> None:
    pass


def fetch(
    connection,
    remote_dir: str,
    local_dir: Path,
    on_progress: Callable[[int, int, str], None] | None = None,
    host: hosts.Host | None = None,
) -> FetchResult:
    """Download every file of the host's `remote_dir` into `local_dir`, checked against its sums.

    A file already here with the right sum is skipped; an interrupted one resumes from its
    `.part`; a `.part` that does not add up is fetched once more from zero. With `host` (and `ssh` on
    this laptop) the files come over OpenSSH, STREAMS at once; else over paramiko's SFTP, one by one."""
    local_dir = check_destination(local_dir)
    absolute, manifest = _manifest(connection, remote_dir)
    _make_folder(local_dir)
    result = FetchResult(local_dir, sorted(manifest), sum(size for size, _ in manifest.values()))
    report = on_progress or _silent
    streamed = _over_openssh(host) if host is not None else None
    download, streams = (streamed, STREAMS) if streamed else (_over_sftp(connection), 1)
    positions = dict.fromkeys(result.files, 0)
    lock = threading.Lock()

    def moved(name: str, position: int) -> None:
        with lock:
            positions[name] = position
            report(sum(positions.values()), result.bytes_total, name)

    todo = []
    for name in result.files:
        size, digest = manifest[name]
        target = local_dir / name
        if target.is_file() and target.stat().st_size == size and sha256_file(target) == digest:
            result.skipped.append(name)
            moved(name, size)
        else:
            todo.append(name)

    def one(name: str) -> int:
        size, digest = manifest[name]
        read = _fetch_file(
            _where(connection),
            download,
            f"{absolute}/{name}",
            local_dir / name,
            digest,
            size,
            lambda position: moved(name, position),
        )
        moved(name, size)
        return read

    with ThreadPoolExecutor(max_workers=streams) as pool:
        result.bytes_transferred = sum(pool.map(one, todo))
    report(result.bytes_total, result.bytes_total, result.files[-1])
    write_sums(local_dir, {name: manifest[name][1] for name in result.files})
    return result


def write_sums(local_dir: Path, digests: dict[str, str]) -> None:
    """The folder's SHA256SUMS, written last and whole: its presence says every file is here and checked."""
    sums = local_dir / (SUMS + ".tmp")
    sums.write_text("".join(f"{digest}  {name}\n" for name, digest in digests.items()))
    os.replace(sums, local_dir / SUMS)


def verify_local(local_dir: Path) -> bool:
    """True when `local_dir` has a SHA256SUMS listing files that are all present and match it."""
    sums_path = Path(local_dir) / SUMS
    try:
        sums = parse_sums(sums_path.read_text(), str(sums_path))
        return bool(sums) and all(sha256_file(Path(local_dir) / name) == digest for name, digest in sums.items())
    except (OSError, ValueError, ArtifactError):
        return False

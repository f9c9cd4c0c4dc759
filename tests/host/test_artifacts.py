"""Saving a model to the data disk and fetching it to the laptop, against a throwaway host with the
real exported model (config, tokenizer, safetensors) as the payload."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import fabric
import pytest

from tests.support import FIXTURES
from tpu_grpo.host import artifacts, hosts
from tpu_grpo.host.artifacts import ArtifactError

EXPORT = FIXTURES / "hf-export"


SAVED = "~/tpu-grpo/models/run one"  # a space: the quoting is tested, and ~ must still expand


MODEL = "model.safetensors"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_sums() -> str:
    return "".join(f"{sha256(path)}  {path.name}\n" for path in sorted(EXPORT.iterdir()))


@pytest.fixture
def host(make_host, monkeypatch):
    """A test host whose home holds the exported model in ~/hf-trained (read-only files, as exported)."""
    made = make_host(disk_mb=0)
    monkeypatch.setenv("TPU_GRPO_STATE", str(made.state))
    shutil.copytree(EXPORT, made.user.home / "hf-trained")
    made.own(made.user.home)
    return made


@pytest.fixture
def connection(host):
    opened = hosts.connect(hosts.parse(host.spec, host.key))
    yield opened
    opened.close()


@pytest.fixture(params=["openssh", "sftp"])
def fetch(request, host):
    """artifacts.fetch over OpenSSH's client (several files at once), and over paramiko's SFTP, which it
    uses when the laptop has no `ssh`."""
    target = hosts.parse(host.spec, host.key) if request.param == "openssh" else None

    def fetched(connection, remote_dir, local_dir, on_progress=None):
        return artifacts.fetch(connection, remote_dir, local_dir, on_progress, host=target)

    fetched.connections_per_file = 1 if target else 0  # OpenSSH: one connection a file; SFTP: the task's own
    return fetched


def save(connection, source: str = "~/hf-trained/", dest: str = SAVED):
    return connection.run(artifacts.save_script(source, dest), hide=True, warn=True)


@pytest.fixture
def saved(host, connection) -> Path:
    """The model saved on the host; its path on this machine."""
    result = save(connection)
    assert result.exited == 0, result.stderr
    return host.user.home / "tpu-grpo/models/run one"


def test_save_copies_the_model_with_verified_checksums(host, connection):
    result = save(connection)
    assert result.exited == 0, result.stderr
    dest = host.user.home / "tpu-grpo/models/run one"
    home = f"/home/{host.user.name}"  # as the host names it
    assert (
        result.stdout.strip()
        == f"saved: {home}/hf-trained -> {home}/tpu-grpo/models/run one (5 files, checksums verified)"
    )
    assert sorted(path.name for path in dest.iterdir()) == sorted([*(p.name for p in EXPORT.iterdir()), "SHA256SUMS"])
    for path in EXPORT.iterdir():
        assert (dest / path.name).read_bytes() == path.read_bytes()
    assert (dest / "SHA256SUMS").read_text() == expected_sums()
    assert not (dest.parent / "run one.partial").exists()
    assert os.stat(dest / "SHA256SUMS").st_uid == os.stat(host.user.home).st_uid
    assert host.run_as_user("cd ~/tpu-grpo/models/'run one' && sha256sum -c --quiet SHA256SUMS").returncode == 0


def test_second_save_skips_even_without_the_source(host, connection, saved):
    before = {path.name: path.stat().st_mtime_ns for path in saved.iterdir()}
    shutil.rmtree(host.user.home / "hf-trained")  # a restarted VM has lost /dev/shm
    again = save(connection)
    assert again.exited == 0, again.stderr
    assert again.stdout.strip() == f"already saved: /home/{host.user.name}/tpu-grpo/models/run one (checksums verified)"
    assert {path.name: path.stat().st_mtime_ns for path in saved.iterdir()} == before


def test_save_replaces_a_damaged_copy_and_an_old_partial(host, connection, saved):
    (saved / MODEL).chmod(0o644)
    (saved / MODEL).write_bytes(b"damaged")
    partial = saved.parent / "run one.partial"
    partial.mkdir()
    (partial / "left-over").write_text("from a killed save")
    host.own(partial)
    again = save(connection)
    assert again.exited == 0, again.stderr
    assert again.stdout.startswith("saved: ")
    assert (saved / MODEL).read_bytes() == (EXPORT / MODEL).read_bytes()
    assert not (saved / "left-over").exists() and not partial.exists()
    assert (saved / "SHA256SUMS").read_text() == expected_sums()


@pytest.mark.parametrize("source", ["~/no-export", "~/empty-export"])
def test_save_without_a_model_fails_and_writes_nothing(host, connection, source):
    assert host.run_as_user("mkdir -p ~/empty-export/sub").returncode == 0
    result = save(connection, source)
    assert result.exited == artifacts.MISSING_EXIT
    assert result.stderr.strip() == (
        f"nothing to save: /home/{host.user.name}/{source[2:]} is missing or has no files; "
        "fix: export the model there first"
    )
    assert not (host.user.home / "tpu-grpo").exists()


def test_remote_manifest_hashes_on_the_spot_without_sums_in_one_command(host, connection):
    commands = len(host.user.commands())
    manifest = artifacts.remote_manifest(connection, "~/hf-trained")
    assert manifest == {path.name: (path.stat().st_size, sha256(path)) for path in EXPORT.iterdir()}
    assert len(host.user.commands()) == commands + 1


def test_remote_manifest_reads_the_saved_sums(connection, saved):
    sums = (saved / "SHA256SUMS").read_text().replace(sha256(EXPORT / MODEL), "0" * 64)
    (saved / "SHA256SUMS").write_text(sums.rstrip("\n"))  # the listed sums are used, not recomputed
    manifest = artifacts.remote_manifest(connection, SAVED)
    assert manifest[MODEL] == ((EXPORT / MODEL).stat().st_size, "0" * 64)
    assert manifest["config.json"] == ((EXPORT / "config.json").stat().st_size, sha256(EXPORT / "config.json"))


def test_remote_manifest_of_a_missing_folder_names_host_and_folder(host, connection):
    with pytest.raises(ArtifactError) as error:
        artifacts.remote_manifest(connection, "~/tpu-grpo/models/nope")
    assert str(error.value) == (
        f"{host.user.name}@127.0.0.1:~/tpu-grpo/models/nope is missing or has no files; "
        "fix: save the model there first (or name the right folder)"
    )


def test_empty_sums_are_refused(connection, saved):
    (saved / "SHA256SUMS").write_text("")
    with pytest.raises(ArtifactError, match="SHA256SUMS lists no files; fix: save the model again$"):
        artifacts.remote_manifest(connection, SAVED)


def test_sums_naming_a_path_outside_the_folder_are_refused(host, connection, saved):
    (saved / "SHA256SUMS").write_text(f"{'0' * 64}  ../../.ssh/authorized_keys\n")
    with pytest.raises(ArtifactError, match=r"lists '\.\./\.\./\.ssh/authorized_keys', not a file inside"):
        artifacts.remote_manifest(connection, SAVED)


def safetensors_header(path: Path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


def test_fetch_downloads_every_file_checked(host, connection, saved, tmp_path, fetch):
    seen = []
    local = tmp_path / "models" / "run one"
    before = host.vm.accepted(host.user.name)
    result = fetch(connection, SAVED, local, lambda done, total, name: seen.append((done, total, name)))
    assert host.vm.accepted(host.user.name) - before == fetch.connections_per_file * len(result.files)
    for path in EXPORT.iterdir():
        assert (local / path.name).read_bytes() == path.read_bytes()
    assert (local / "SHA256SUMS").read_text() == expected_sums()
    assert sorted(path.name for path in local.iterdir()) == sorted([*(p.name for p in EXPORT.iterdir()), "SHA256SUMS"])
    total = sum(path.stat().st_size for path in EXPORT.iterdir())
    assert result.to_json() == {
        "local_dir": str(local),
        "files": sorted(p.name for p in EXPORT.iterdir()),
        "bytes_total": total,
        "bytes_transferred": total,
        "skipped": [],
    }
    assert seen[-1] == (total, total, "tokenizer_config.json")
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert {name for _, _, name in seen} == set(result.files)
    header = safetensors_header(local / MODEL)
    tensors = {name: value for name, value in header.items() if name != "__metadata__"}
    assert tensors and all({"dtype", "shape", "data_offsets"} <= set(value) for value in tensors.values())
    assert artifacts.verify_local(local)


def test_fetch_again_transfers_nothing_and_refetches_a_changed_file(connection, saved, tmp_path, fetch):
    fetch(connection, SAVED, tmp_path)
    again = fetch(connection, SAVED, tmp_path)
    assert again.bytes_transferred == 0 and again.skipped == again.files
    (tmp_path / "config.json").write_text("{}")
    repaired = fetch(connection, SAVED, tmp_path)
    assert repaired.bytes_transferred == (EXPORT / "config.json").stat().st_size
    assert repaired.skipped == [name for name in repaired.files if name != "config.json"]
    assert (tmp_path / "config.json").read_bytes() == (EXPORT / "config.json").read_bytes()


def test_fetch_does_not_trust_a_local_file_by_its_size(connection, saved, tmp_path, fetch):
    fetch(connection, SAVED, tmp_path)
    model = tmp_path / MODEL
    size = model.stat().st_size
    model.write_bytes(b"\0" * size)  # the right size, the wrong bytes
    again = fetch(connection, SAVED, tmp_path)
    assert again.bytes_transferred == size and MODEL not in again.skipped
    assert model.read_bytes() == (EXPORT / MODEL).read_bytes()
    assert artifacts.verify_local(tmp_path)


def test_fetch_resumes_from_a_partial_file(connection, saved, tmp_path, fetch):
    fetch(connection, SAVED, tmp_path)
    size, have = (EXPORT / MODEL).stat().st_size, 100_000
    (tmp_path / MODEL).unlink()
    (tmp_path / f"{MODEL}.part").write_bytes((EXPORT / MODEL).read_bytes()[:have])
    seen = []
    result = fetch(connection, SAVED, tmp_path, lambda done, total, name: seen.append(done))
    assert result.bytes_transferred == size - have
    assert result.skipped == [name for name in result.files if name != MODEL]
    assert (tmp_path / MODEL).read_bytes() == (EXPORT / MODEL).read_bytes()
    assert not (tmp_path / f"{MODEL}.part").exists()
    assert seen[-1] == result.bytes_total and seen == sorted(seen)


def test_fetch_downloads_a_corrupt_partial_again_from_zero(connection, saved, tmp_path, fetch):
    size, have = (EXPORT / MODEL).stat().st_size, 100_000
    (tmp_path / f"{MODEL}.part").write_bytes(b"\xff" * have)
    result = fetch(connection, SAVED, tmp_path)
    others = sum(path.stat().st_size for path in EXPORT.iterdir() if path.name != MODEL)
    assert result.bytes_transferred == others + (size - have) + size
    assert (tmp_path / MODEL).read_bytes() == (EXPORT / MODEL).read_bytes()
    assert artifacts.verify_local(tmp_path)


def test_fetch_gives_up_when_the_host_copy_does_not_match_its_sums(connection, saved, tmp_path, fetch):
    (saved / MODEL).chmod(0o644)
    with (saved / MODEL).open("r+b") as model:
        model.seek(5000)
        model.write(b"bitrot")
    with pytest.raises(ArtifactError, match=r"model.safetensors: sha256 \w{64} after downloading twice"):
        fetch(connection, SAVED, tmp_path)
    assert not (tmp_path / MODEL).exists() and not (tmp_path / f"{MODEL}.part").exists()
    assert not (tmp_path / "SHA256SUMS").exists()
    assert not artifacts.verify_local(tmp_path)


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_an_unwritable_destination_fails_before_connecting(host, tmp_path, where):
    (tmp_path / "file").write_text("a regular file")
    local = tmp_path / "file" / "models" if where == "under-a-file" else Path("/proc/tpu-grpo-models")
    problem = (
        r"is inside .+, which is not a folder"
        if where == "under-a-file"
        else r"cannot be written: no writing in /proc \(.+\)"
    )
    with pytest.raises(ArtifactError, match=f"^--to '{local}' {problem}; fix: --to somewhere you can write"):
        artifacts.check_destination(local)
    never_opened = fabric.Connection(
        "127.0.0.1", user=host.user.name, port=host.vm.port, connect_kwargs={"key_filename": str(host.key)}
    )
    with pytest.raises(ArtifactError, match=f"^--to '{local}'"):
        artifacts.fetch(never_opened, SAVED, local)
    assert not never_opened.is_connected and host.vm.accepted(host.user.name) == 0


def test_check_destination_creates_nothing_and_fetch_makes_the_folder(connection, saved, tmp_path, fetch):
    assert artifacts.check_destination(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    fetch(connection, SAVED, tmp_path / "a" / "b")
    assert artifacts.verify_local(tmp_path / "a" / "b")


def test_verify_local_needs_sums_and_matching_files(connection, saved, tmp_path, fetch):
    assert not artifacts.verify_local(tmp_path)
    fetch(connection, SAVED, tmp_path)
    assert artifacts.verify_local(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert not artifacts.verify_local(tmp_path)
    (tmp_path / "config.json").unlink()
    assert not artifacts.verify_local(tmp_path)


def test_the_openssh_path_checks_the_recorded_host_key(host, connection, saved, tmp_path):
    """OpenSSH's client trusts only the key tpu-grpo recorded: another key there, and nothing is fetched."""
    known = Path(os.environ["TPU_GRPO_STATE"]) / "known_hosts"
    name, kind, _ = known.read_text().split(" ", 2)
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known.write_text(
        f"{name} {(other.with_suffix('.pub')).read_text().split(' ', 1)[0]} "
        f"{(other.with_suffix('.pub')).read_text().split(' ')[1]}\n"
    )
    with pytest.raises(
        hosts.ConnectError,
        match=r"OpenSSH refuses the host's key: it is not the one recorded in "
        r".*; if the VM was really rebuilt, forget the old key: ssh-keygen -R",
    ):
        artifacts.fetch(connection, SAVED, tmp_path / "model", host=hosts.parse(host.spec, host.key))
    assert not [path for path in (tmp_path / "model").iterdir() if not path.name.endswith(".part")]


def test_save_of_a_folder_of_one_file_checks_it_on_every_core_count(host, connection):
    """The check shares the files among the cores: a core with no file to check has nothing to fail."""
    (host.user.home / "one").mkdir()
    (host.user.home / "one/events.out.tfevents.1").write_bytes(b"events")
    host.own(host.user.home / "one")
    result = save(connection, "~/one", "~/tpu-grpo/runs/x/tensorboard")
    assert result.exited == 0, result.stderr
    saved = host.user.home / "tpu-grpo/runs/x/tensorboard"
    assert (saved / "SHA256SUMS").read_text() == f"{hashlib.sha256(b'events').hexdigest()}  events.out.tfevents.1\n"

"""`invoke provision` downloads the base model while MaxText installs: only what the conversion reads,
verified against the Hub's checksums, on the data disk, once. On a throwaway host, with huggingface_hub's
own `hf` CLI (run by uvx, as on a VM) against a stand-in of the Hub (tests/doubles/hub.py, HF_ENDPOINT) that
serves files standing for Llama 3.1's."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.doubles.hub import HubServer, whoami
from tests.support import TEST_TOKEN, statuses

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WANTED = {
    "model-00001-of-00002.safetensors": os.urandom(3 << 20),
    "model-00002-of-00002.safetensors": os.urandom(2 << 20),
    "model.safetensors.index.json": b'{"metadata": {}, "weight_map": {}}',
    "config.json": b'{"hidden_size": 4096}',
    "generation_config.json": b'{"do_sample": true}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b'{"model_max_length": 131072}',
    "special_tokens_map.json": b"{}",
}
#: What MaxText's own snapshot_download would fetch too: original/ is about 16 GB on the real repository.
NOT_WANTED = {
    "original/consolidated.00.pth": os.urandom(4 << 20),
    "original/params.json": b"{}",
    "original/tokenizer.model": b"tokens",
    "LICENSE": b"LLAMA 3.1 COMMUNITY LICENSE",
    "README.md": b"---\nlicense: llama3.1\n---\n",
    "USE_POLICY.md": b"policy",
}
DOWNLOAD = ("--var", f"hf_model={MODEL}")


def _folder(host):
    """The download on the data disk (~/tpu-grpo links there, a path inside the host)."""
    return host.vm.path(f"{host.disk.mount}/tpu-grpo/base-models/{MODEL}")


def _local_files(host) -> dict[str, bytes]:
    folder = _folder(host)
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and ".cache" not in path.relative_to(folder).parts
    }


def _resolved(hub) -> list[str]:
    return [
        path.split("/resolve/")[1].split("/", 1)[1]
        for method, path in hub.requests
        if method == "GET" and "/resolve/" in path
    ]


@pytest.fixture
def hub():
    with HubServer() as server:
        server.tokens[TEST_TOKEN] = whoami("alice")
        server.seed(MODEL, {**WANTED, **NOT_WANTED})
        yield server


def test_the_model_downloads_while_maxtext_installs_once_and_verified(make_host, hub):
    host = make_host(disk_mb=256)
    env = {"HF_ENDPOINT": hub.url}
    first = host.invoke("provision", "--json", *DOWNLOAD, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (statuses(first)["model download started"], statuses(first)["model downloaded"]) == ("changed", "changed")
    assert _local_files(host) == WANTED  # byte for byte, and nothing of original/ or the docs
    assert sorted(_resolved(hub)) == sorted(WANTED)
    folder = _folder(host)
    assert folder.with_name(folder.name + ".complete").is_file()
    # started before the venv and MaxText were made, so it ran while they installed
    assert (
        folder.with_name(folder.name + ".sh").stat().st_mtime
        <= (host.user.home / "maxtext_venv/pyvenv.cfg").stat().st_mtime
    )
    assert os.readlink(host.user.home / "tpu-grpo") == f"{host.disk.mount}/tpu-grpo"  # on the data disk
    for path in folder.parent.iterdir():
        if path.is_file():
            assert TEST_TOKEN.encode() not in path.read_bytes(), path
    assert TEST_TOKEN not in first.stdout + first.stderr and hub.authorizations == {TEST_TOKEN}

    asked = len(hub.requests)
    again = host.invoke("provision", "--json", *DOWNLOAD, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (statuses(again)["model download started"], statuses(again)["model downloaded"]) == ("ok", "ok")
    assert hub.requests[asked:] == []

    # a VM made anew on the same data disk (new boot disk) finds the download done
    mount = host.disk.mount
    assert host.on_host("sh", "-c", f"umount {mount} && sed -i '\\# {mount} #d' /etc/fstab").returncode == 0
    home = str(host.user.home)
    subprocess.run(
        ["find", home, "-mindepth", "1", "!", "-path", f"{home}/.ssh", "!", "-path", f"{home}/.ssh/*", "-delete"],
        check=True,
    )
    rebuilt = host.invoke("provision", "--json", *DOWNLOAD, env=env)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert (statuses(rebuilt)["model download started"], statuses(rebuilt)["model downloaded"]) == ("ok", "ok")
    assert _resolved(hub)[len(WANTED) :] == []


def test_a_file_that_does_not_match_the_hubs_checksum_is_never_marked_complete(make_host, hub):
    host = make_host(disk_mb=256)
    env = {"HF_ENDPOINT": hub.url}
    hub.tampered.add("config.json")
    failed = host.invoke("provision", *DOWNLOAD, env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "config.json: expected" in failed.stdout and "Checksum verification failed" in failed.stdout
    folder = _folder(host)
    assert not folder.with_name(folder.name + ".complete").exists()
    assert not (folder / "config.json").exists()  # the bad copy is gone, so the next run fetches it again

    hub.tampered.clear()
    fixed = host.invoke("provision", "--json", *DOWNLOAD, env=env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert _local_files(host) == WANTED and folder.with_name(folder.name + ".complete").is_file()
    # the bad file: by the background download, by the last step's second try, by the fixed run
    assert _resolved(hub).count("config.json") == 3
    assert _resolved(hub).count("model-00001-of-00002.safetensors") == 1  # what matched is not fetched again

"""A `gs://` checkpoint store as tpu-grpo itself reads it, from the laptop: whether a converted
checkpoint or a run is there, which training checkpoints exist, and a run's TensorBoard events.

MaxText and Orbax on the VM read and write the bucket themselves. Here Google's client library
uses the laptop's application-default credentials (the ones `pulumi up` uses), or the emulator
that STORAGE_EMULATOR_HOST names, which the library honours itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tpu_grpo.config.errors import UserError


class StoreError(UserError):
    """The bucket cannot be read; one line with the fix."""

    exit_code = 1


def split(url: str) -> tuple[str, str]:
    """gs://BUCKET/A/B -> ("BUCKET", "A/B/"): the bucket and the prefix of what lies under it."""
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    prefix = "/".join(part for part in prefix.split("/") if part)  # MaxText's paths hold `//`
    return bucket, f"{prefix}/" if prefix else ""


def _client():
    from google.cloud import storage

    return storage.Client()


def _listing(url: str, **options) -> tuple[list, list[str], str]:
    """(the objects, the folder prefixes, the URL's own prefix) of a listing, read whole, or a
    one-line StoreError: credentials, a missing bucket, the network."""
    bucket, prefix = split(url)
    try:
        blobs = _client().list_blobs(bucket, prefix=prefix, **options)
        return list(blobs), sorted(blobs.prefixes), prefix
    except Exception as error:  # noqa: BLE001 - whatever the library raises: one line
        raise _unreadable(url, error) from None


def _unreadable(url: str, error: Exception) -> StoreError:
    return StoreError(
        f"cannot list {url} ({error}); fix: gcloud auth application-default login, and check "
        "that tpu-grpo:checkpointStore names a bucket you can read"
    )


def children(url: str) -> list[str]:
    """The names of the folders right under the URL (`checkpoints/actor` -> its steps)."""
    _, folders, prefix = _listing(url, delimiter="/")
    return sorted(name[len(prefix) :].rstrip("/") for name in folders)


def committed(url: str) -> list[str]:
    """The folders right under the URL that Orbax finished writing (stores.COMMIT_FILE in each): a checkpoints folder's
    whole steps, read as the host and a slice's driver read them (remote/folder_children.py)."""
    from tpu_grpo.catalog.stores import COMMIT_FILE
    from tpu_grpo.host.remote import folder_children

    try:
        return sorted(folder_children.children(url, COMMIT_FILE))
    except Exception as error:  # noqa: BLE001 - whatever the library raises: one line
        raise _unreadable(url, error) from None


def sizes(url: str) -> dict[str, int]:
    """Every object under the URL, by its name below it, with its bytes (one listing, its pages read whole)."""
    blobs, _, prefix = _listing(url)
    return {blob.name[len(prefix) :]: blob.size or 0 for blob in blobs}


def names(url: str) -> list[str]:
    """Every object under the URL, by its name below it."""
    return sorted(sizes(url))


def exists(url: str) -> bool:
    """Whether anything lies under the URL."""
    return bool(_listing(url, max_results=1)[0])


def download(url: str, folder: Path) -> list[str]:
    """Every object right under the URL into the folder; returns their names."""
    blobs, _, prefix = _listing(url, delimiter="/")
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for blob in blobs:
        name = blob.name[len(prefix) :]
        if name:
            blob.download_to_filename(str(folder / name))
            names.append(name)
    return sorted(names)


def fetch_folder(url: str, local_dir: Path, on_progress: Callable[[int, int, str], None]):
    """Every object right under the URL into `local_dir`, like `artifacts.fetch` from a host: a file already
    here with the object's MD5 is skipped, the rest arrive as `.part` files (the library checks each
    download against the object's checksum) and take their names once whole; SHA256SUMS is written last."""
    import os

    from tpu_grpo.host.artifacts import FetchResult, check_destination, sha256_file, write_sums

    local_dir = check_destination(local_dir)
    blobs, _, prefix = _listing(url, delimiter="/")
    blobs = [blob for blob in blobs if blob.name[len(prefix) :]]
    if not blobs:
        raise StoreError(f"nothing in {url}; fix: export the run first (uv run invoke export --run-name RUN)")
    local_dir.mkdir(parents=True, exist_ok=True)
    names = {blob.name[len(prefix) :]: blob for blob in blobs}
    result = FetchResult(local_dir, sorted(names), sum(blob.size or 0 for blob in blobs))
    done = 0
    for name in result.files:
        blob, target = names[name], local_dir / name
        if target.is_file() and blob.md5_hash and _md5(target) == blob.md5_hash:
            result.skipped.append(name)
        else:
            part = local_dir / f"{name}.part"
            blob.download_to_filename(str(part))
            os.replace(part, target)
            result.bytes_transferred += blob.size or 0
        done += blob.size or 0
        on_progress(done, result.bytes_total, name)
    write_sums(local_dir, {name: sha256_file(local_dir / name) for name in result.files})
    return result


def _md5(path: Path) -> str:
    """A file's MD5 as Cloud Storage gives an object's (base64), read a MiB at a time."""
    import base64
    import hashlib

    digest = hashlib.md5()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()

"""A `gs://` checkpoint store as tpu-grpo itself reads it, from the laptop: whether a converted
checkpoint or a run is there, which training checkpoints exist, and a run's TensorBoard events.

MaxText and Orbax on the VM read and write the bucket themselves. Here Google's client library
uses the laptop's application-default credentials (the ones `pulumi up` uses), or the emulator
that STORAGE_EMULATOR_HOST names, which the library honours itself.
"""

from __future__ import annotations

from pathlib import Path

from tpu_grpo.errors import UserError


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
        raise StoreError(f"cannot list {url} ({error}); fix: gcloud auth application-default login, and check "
                         "that tpu-grpo:checkpointStore names a bucket you can read") from None


def children(url: str) -> list[str]:
    """The names of the folders right under the URL (`checkpoints/actor` -> its steps)."""
    _, folders, prefix = _listing(url, delimiter="/")
    return sorted(name[len(prefix):].rstrip("/") for name in folders)


def exists(url: str) -> bool:
    """Whether anything lies under the URL."""
    return bool(_listing(url, max_results=1)[0])


def download(url: str, folder: Path) -> list[str]:
    """Every object right under the URL into the folder; returns their names."""
    blobs, _, prefix = _listing(url, delimiter="/")
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for blob in blobs:
        name = blob.name[len(prefix):]
        if name:
            blob.download_to_filename(str(folder / name))
            names.append(name)
    return sorted(names)

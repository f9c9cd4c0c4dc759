"""The compile cache of one MaxText step; its data: `root` the caches' root (a folder, `~` for the home, or gs:// in a
slice's bucket), `named` the folder that the step's machine, model and settings name, `mode` `make` (a job about to
start) or `look` (status).

The folder is ROOT/VERSIONS/NAMED, VERSIONS being those of MaxText, JAX, jaxlib and libtpu: JAX keys its entries
by these too, so a folder holds only entries a start can use, and an older release's folders are easy to remove.
Prints the folder's path, and on stderr (into the job's log) the line `status` and `runs` read: warm or cold, its
entries (JAX's LRUCache writes one KEY-cache file per compiled program, jax/_src/lru_cache.py) and their bytes."""

import importlib.metadata
import json
import os
import sys

PACKAGES = ("maxtext", "jax", "jaxlib", "libtpu")
LINE = "tpu-grpo: compile cache"
ENTRY = "-cache"  # jax/_src/lru_cache.py's _CACHE_SUFFIX


def versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name}-{importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name}-none")
    return "_".join(found)


def weigh(folder: str) -> tuple[int, int]:
    """The folder's entries and their bytes (a bucket's, with the Cloud Storage client of MaxText's extra)."""
    if folder.startswith("gs://"):
        from google.cloud import storage

        bucket, _, prefix = folder[len("gs://") :].partition("/")
        blobs = [
            blob
            for blob in storage.Client().list_blobs(bucket, prefix=prefix.rstrip("/") + "/")
            if blob.name.endswith(ENTRY)
        ]
        return len(blobs), sum(blob.size or 0 for blob in blobs)
    if not os.path.isdir(folder):
        return 0, 0
    sizes = [entry.stat().st_size for entry in os.scandir(folder) if entry.name.endswith(ENTRY) and entry.is_file()]
    return len(sizes), sum(sizes)


def main(root: str, named: str, mode: str) -> str:
    folder = f"{os.path.expanduser(root).rstrip('/')}/{versions()}/{named}"
    if mode == "make" and not folder.startswith("gs://"):
        os.makedirs(folder, exist_ok=True)
    entries, size = weigh(folder)
    print(f"{LINE} {'warm' if entries else 'cold'}: {entries} entries, {size} bytes, in {folder}", file=sys.stderr)
    return folder


if __name__ == "__main__":
    given = json.loads(os.environ["TPU_GRPO_INPUT"])
    print(main(given["root"], given["named"], given["mode"]))

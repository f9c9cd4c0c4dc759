"""Wheels the tests build for their hosts' uv to install (from a find-links folder)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from tests.support import DOUBLES

WORKLOAD_STANDIN = "maxtext-workload-standin"


def write_wheel(
    folder: Path, name: str, version: str, files: dict[str, bytes], metadata: bytes = b"", entry_points: bytes = b""
) -> Path:
    """NAME-VERSION-py3-none-any.whl holding `files`, with its dist-info (METADATA, WHEEL, RECORD)."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode() + b"Requires-Python: >=3.11\n" + metadata
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tpu-grpo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    wheel = folder / f"{stem}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def workload_standin_wheel(folder: Path) -> Path:
    """The stand-in MaxText (tests/doubles/standin) as an installable wheel: its tree goes in a folder of
    site-packages that a .pth file puts on sys.path, so `maxtext`, `jax` and their 0.2.3 and 0.10.1
    dist-infos are what the venv's Python finds, as after the real install."""
    standin = DOUBLES / "standin"
    files = {
        f"tpu_grpo_standin/{path.relative_to(standin)}": path.read_bytes()
        for path in sorted(standin.rglob("*"))
        if path.is_file() and path.name != "README.md" and "__pycache__" not in path.parts
    }
    files["tpu_grpo_standin.pth"] = b"tpu_grpo_standin\n"
    return write_wheel(folder, WORKLOAD_STANDIN, "0.2.3", files)

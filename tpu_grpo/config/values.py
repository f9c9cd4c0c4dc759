"""One parser per kind of value a user writes, used by flags and stack settings alike.

Each parser takes the value as written and returns it parsed, or raises `Refused` with what is wrong (the bounds
included); the caller words it as its one line, naming the flag or setting (`flag`, settings.parse). Checking a
kind in one place is what makes `--batches 200000` and `tpu-grpo:batches: "200000"` refused alike."""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tpu_grpo.config.errors import UserError, not_ascii

T = TypeVar("T")
Parser = Callable[[Any], T]

#: Linux's limits (NAME_MAX, PATH_MAX): a longer name is OSError 36 wherever it is opened.
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4096
#: A job id or run name: a folder name on the host and a JobSet's name part, never a path.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_WHOLE = re.compile(r"-?[0-9]{1,30}")
_DECIMAL = re.compile(r"-?[0-9]{1,12}(\.[0-9]{1,12})?")
#: A host name's label (RFC 1123), as OpenSSH and IDNA take it.
_DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: huggingface_hub's REPO_ID_REGEX part (utils/_validators.py, validate_repo_id): ASCII letters, digits, '_', '-',
#: '.', not starting or ending with '-' or '.', at most 96.
_HUB_PART = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
#: Cloud Storage's bucket naming rules ("Bucket names", cloud.google.com/storage/docs/buckets#naming): lowercase
#: letters, digits, '-', '_', '.'; starting and ending with a letter or digit; 3 to 63 characters, or up to 222 with
#: dots, each dot-separated part at most 63.
_BUCKET_PART = re.compile(r"[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?")


class Refused(ValueError):
    """What is wrong with a value, to follow its name: `is not a whole number from 1 to 100000`; with its own `fix`
    (a command) where the key's usual one would not mend this value (an entry of a list, a name meant otherwise),
    and `at`, where the wrong part is an entry's (then said by its path, not the whole value)."""

    def __init__(self, problem: str, fix: str | None = None, at: tuple[str, Any] | None = None):
        super().__init__(problem)
        self.fix = fix
        self.at = at  # a part of the value that is wrong: its path as a user types it (KEY[2].capacity), its value


class NotAFile(Refused):
    """A path that names no file to read: a folder (`folder`), or nothing."""

    def __init__(self, folder: bool):
        super().__init__("is a folder, not a file" if folder else "is not a file")
        self.folder = folder


def flag(name: str, text: Any, parse: Parser[T], example: str, fix: str | None = None) -> T:
    """A flag's value parsed, or one line naming the flag, the value as written and an example that works (or
    `fix`, where no example says it)."""
    try:
        return parse(text)
    except Refused as problem:
        raise UserError(f"{name} {text!r}{not_ascii(text)} {problem}; fix: {fix or f'e.g. {name} {example}'}") from None


def _ranged(
    form: re.Pattern,
    convert: Callable[[str], Any],
    kinds: tuple[type, ...],
    low: Any,
    high: Any,
    bounds: str,
    characters: str,
) -> Parser:
    """Numbers written in `form` (ASCII only: `int()` and `float()` read `١٢٠` and `1_20`), from `low` to `high`,
    the range said in every refusal."""

    def parse(value: Any) -> Any:
        text = str(value).strip() if isinstance(value, kinds) and not isinstance(value, bool) else None
        if text is None or not form.fullmatch(text):
            raise Refused(f"is not {bounds} ({characters})")
        if text.startswith("-") and low >= 0:
            raise Refused(f"is negative ({bounds})")
        number = convert(text)
        if not low <= number <= high:
            raise Refused(f"is not {bounds}")
        return number

    return parse


def whole(low: int, high: int, unit: str = "") -> Parser[int]:
    """Whole numbers from `low` to `high` (a setting's YAML may give an int)."""
    return _ranged(_WHOLE, int, (str, int), low, high, f"a whole number from {low} to {high}{unit}", "digits 0-9")


def decimal(low: float, high: float, unit: str = "") -> Parser[float]:
    """Decimal numbers (`12`, `0.5`) from `low` to `high`: one '.', no sign, exponent or '_'."""
    return _ranged(_DECIMAL, float, (str,), low, high, f"a number from {low:g} to {high:g}{unit}", "digits 0-9 and '.'")


def name(value: Any) -> str:
    """A job id or run name: letters, digits, '.', '_', '-', at most 100; never empty, never a path."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise Refused("is not a name (letters, digits, '.', '_', '-'; at most 100; no '..')")
    return value


def hub_id(value: Any) -> str:
    """A Hugging Face repository id, OWNER/NAME, by huggingface_hub's validate_repo_id rules."""
    parts = value.split("/") if isinstance(value, str) else []
    if (
        len(parts) != 2
        or not all(_HUB_PART.fullmatch(part) for part in parts)
        or "--" in value
        or ".." in value
        or value.endswith(".git")
    ):
        raise Refused(
            "is not a Hugging Face repository id (OWNER/NAME: letters, digits, '-', '_', '.', not first "
            "or last; no '--' or '..'; not ending in .git; at most 96 each)"
        )
    return value


def address(value: str) -> str:
    """A host's address as OpenSSH and IDNA take it: an IPv4 address (every part), an IPv6 one in brackets, or a
    host name of labels of 1 to 63 letters, digits and '-' (not first or last), at most 253 in all."""
    if value.startswith("["):
        try:
            ipaddress.IPv6Address(value.strip("[]"))
        except ValueError:
            raise Refused("is not an IPv6 address") from None
        return value.strip("[]")
    labels = value.split(".")
    if all(label.isascii() and label.isdigit() for label in labels if label) and labels[-1:] != [""]:
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise Refused("is not an IPv4 address (four numbers from 0 to 255)") from None
        return value
    if len(value) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise Refused("is not a host name (labels of 1 to 63 letters, digits and '-', joined by single dots)")
    return value


def bucket(value: str) -> str:
    """A Cloud Storage bucket name, by its naming rules both ways; what a name in the rules may not be: an IP
    address, "goog" first, "google" or a close misspelling ("g00gle") in it."""
    parts = value.split(".")
    if not (3 <= len(value) <= (222 if len(parts) > 1 else 63) and all(_BUCKET_PART.fullmatch(p) for p in parts)):
        raise Refused(
            "is not a bucket name (lowercase letters, digits, '-', '_', '.'; a letter or digit first and "
            "last; 3 to 63 characters, or up to 222 with dots, 63 between them)"
        )
    if re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", value):
        raise Refused("names a bucket in the form of an IP address, which Cloud Storage refuses")
    if value.startswith("goog") or "google" in value.translate(str.maketrans("01", "ol")):
        raise Refused(
            'names a bucket beginning with "goog" or holding "google" (or a look-alike such as '
            '"g00gle"), which Cloud Storage refuses'
        )
    return value


def _lengths(text: str) -> Path:
    if not isinstance(text, str) or not text.strip():
        raise Refused("names no file or folder")
    path = Path(os.path.expanduser(text))
    if "\0" in text or len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise Refused(f"is not a path (at most {MAX_PATH_BYTES} bytes, no NUL)")
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > MAX_NAME_BYTES:
        raise Refused(f"has a name of {len(os.fsencode(longest))} bytes (at most {MAX_NAME_BYTES} in a path)")
    return path


def existing_file(text: Any) -> Path:
    """A file to read: there, and a file."""
    path = _lengths(text)
    if path.is_dir() or not path.is_file():
        raise NotAFile(folder=path.is_dir())
    return path


def existing_folder(text: Any) -> Path:
    path = _lengths(text)
    if not path.is_dir():
        raise Refused("is not a folder")
    return path


def _writable(folder: Path) -> None:
    """`folder`, or the nearest folder above it that exists, is one this user can write in: proved by a probe file
    that comes and goes (permission bits do not say it for root, nor for /proc or a read-only mount)."""
    existing = folder.absolute()
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise Refused(f"is inside {existing}, which is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise Refused(f"cannot be written: no writing in {existing} ({error.strerror or error})") from None


def new_file(text: Any) -> Path:
    """A file to write: not a folder, not a symlink to nowhere (writing would go through it), in a writable folder."""
    path = _lengths(text)
    if path.is_symlink() and not path.exists():
        raise Refused(f"is a symlink to {os.readlink(path)}, which does not exist")
    if path.is_dir():
        raise Refused("is a folder, not a file")
    _writable(path.parent)
    return path


def new_folder(text: Any) -> Path:
    """A folder to make or fill: not a file, not a symlink to nowhere, in (or itself) a folder this user may write."""
    path = _lengths(text)
    if path.is_symlink() and not path.exists():
        raise Refused(f"is a symlink to {os.readlink(path)}, which does not exist")
    if path.exists() and not path.is_dir():
        raise Refused("is a file, not a folder")
    _writable(path)
    return path


def text_of(path: Path) -> str:
    """A text file's contents: UTF-8, or a Refused naming the first bad byte."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refused(f"is not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise Refused(f"cannot be read ({error.strerror})") from None

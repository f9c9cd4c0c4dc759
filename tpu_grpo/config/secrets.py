"""The Hugging Face token on this laptop, and error lines that never say it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tpu_grpo.config.values import Refused, text_of

#: The longest error line said whole; a longer one (a refused value of 200,000 characters) keeps its start and its
#: fix, its middle left out.
MAX_SAID = 1000
#: A `KEY=VALUE` or `KEY: VALUE` (a --set, a --var, a mapping echoed) up to where its value begins: the search goes on
#: inside the value (`zone: HF_TOKEN=...`), and each part of the message is looked at a bounded number of times.
_KEY = re.compile(r"""(?<![\w.:-])([\w.:-]+)['"]?(?:=|:\s*)(?=[^\s,;{}\[\]])""")
_VALUE = re.compile(r"""'[^']*'|"[^"]*"|[^\s'",;{}\[\]]+""")
#: A key whose name holds one of these words is a secret's (MaxText's hf_access_token, HF_TOKEN, the playbook's
#: hf_token, PULUMI_CONFIG_PASSPHRASE, a password): its value is never said.
SECRET_WORDS = {"token", "secret", "password", "passphrase"}
#: What a terminal acts on instead of showing (a carriage return, an escape sequence, a line separator), but the
#: newline of the few errors that list their parts a line each: said as Python writes it in a string (\r, \x1b).
_UNSHOWN = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
#: What a fix writes in a secret's place (HF_TOKEN=hf_..., PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE): no value.
PLACEHOLDERS = {"...", "hf_...", "THE_PASSPHRASE", "FILE"}


def hub_token() -> str | None:
    """The Hugging Face token as huggingface_hub finds it: env HF_TOKEN, else its token file (hub_token_path);
    Refused when that file cannot be read as text."""
    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    path = hub_token_path()
    return (text_of(path).strip() or None) if path.is_file() else None


def hub_token_path() -> Path:
    """huggingface_hub's token file: HF_TOKEN_PATH, else HF_HOME's (default ~/.cache/huggingface) `token`."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return Path(os.environ.get("HF_TOKEN_PATH") or home / "token").expanduser()


def conceal(message: str) -> str:
    """An error line as a task prints it: no Hugging Face token in it (the one this laptop has, or any value of a
    secret's key), no character a terminal would act on, and at most MAX_SAID characters."""
    try:
        token = hub_token()
    except Refused:
        token = None
    if token:
        message = message.replace(token, "***")
    message = _UNSHOWN.sub(lambda found: repr(found[0])[1:-1], _without_secret_values(message))
    if len(message) > MAX_SAID:
        left_out = len(message) - MAX_SAID
        message = f"{message[: MAX_SAID // 2]} … ({left_out} characters left out) … {message[-MAX_SAID // 2 :]}"
    return message


def _without_secret_values(message: str) -> str:
    """Each value of a key whose words say it is a secret's (`hfToken`: hf, token) as ***, but a fix's placeholder;
    `tokenizer=...` as it is."""
    kept, end = [], 0
    for key in _KEY.finditer(message):
        if key.end() < end or not _words(key[1]) & SECRET_WORDS:
            continue
        value = _VALUE.match(message, key.end())
        if value and value[0].strip("'\"()") not in PLACEHOLDERS:
            kept += [message[end : key.end()], "***"]
            end = value.end()
    return "".join(kept) + message[end:]


def _words(name: str) -> set[str]:
    """`hf_access_token` -> {hf, access, token}; `hfToken` -> {hf, token}; `HF_TOKEN` -> {hf, token}."""
    return {word.lower() for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)}

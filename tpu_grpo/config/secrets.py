"""The Hugging Face token on this laptop, and error lines that never say it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tpu_grpo.config.values import Refused, text_of

#: The longest error line said whole; a longer one (a refused value of 200,000 characters) keeps its start and its
#: fix, its middle left out.
MAX_SAID = 1000
#: A secret's `KEY=VALUE` (MaxText's hf_access_token, the playbook's hf_token): its value is never said.
_SECRET_VALUE = re.compile(r"\b(hf_access_token|hf_token)=[^\s'\",;]+")


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
    secret's key), and at most MAX_SAID characters."""
    try:
        token = hub_token()
    except Refused:
        token = None
    if token:
        message = message.replace(token, "***")
    if len(message) > MAX_SAID:
        left_out = len(message) - MAX_SAID
        message = f"{message[: MAX_SAID // 2]} … ({left_out} characters left out) … {message[-MAX_SAID // 2 :]}"
    return _SECRET_VALUE.sub(r"\1=***", message)

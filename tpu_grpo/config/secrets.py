"""The Hugging Face token on this laptop, and error lines that never say it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tpu_grpo.config.errors import UserError
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


#: A Hugging Face access token as the Hub issues them: `hf_` (a user's; `hf_oauth_` from a browser login) or
#: `api_org_` (an organization's, older), then letters and digits. Secret scanners match a user's as `hf_` and 34
#: letters (detect-secrets' HuggingFaceDetector, gitleaks' huggingface-access-token); 30 or more are taken here.
TOKEN_FORM = re.compile(r"(hf_(oauth_)?|api_org_)[A-Za-z0-9]{30,}")
#: Fewer characters are no token, and are never masked in output (a one-letter HF_TOKEN would hide every `e`).
SHORTEST_TOKEN = 33


def token_as_used() -> str | None:
    """The Hugging Face token as it would be used: env HF_TOKEN, else its token file (hub_token_path), cleaned as
    huggingface_hub cleans it (its _clean_token: line breaks dropped, spaces stripped) and of a byte-order mark an
    editor wrote, whatever its form; a UserError when that file cannot be read as text."""
    text = os.environ.get("HF_TOKEN", "")
    if not _cleaned(text):
        path = hub_token_path()
        if path.is_dir():
            raise UserError(
                f"the Hugging Face token file {str(path)!r} (HF_TOKEN_PATH, else HF_HOME's `token`) is a folder; fix: "
                "name the file itself, e.g. HF_TOKEN_PATH=~/.cache/huggingface/token, or unset it"
            )
        if not path.is_file():
            return None
        try:
            text = text_of(path)
        except Refused as problem:
            raise UserError(
                f"the Hugging Face token file {str(path)!r} (HF_TOKEN_PATH) {problem}; fix: save the token in it "
                "alone, as UTF-8 text (or set HF_TOKEN)"
            ) from None
    return _cleaned(text)


def hub_token() -> str | None:
    """The Hugging Face token to send (token_as_used), refused when it is not one: a placeholder (hf_...), a token
    with a space inside or without its prefix, two tokens on two lines."""
    token = token_as_used()
    if token is not None and not TOKEN_FORM.fullmatch(token):
        whence = "HF_TOKEN" if _cleaned(os.environ.get("HF_TOKEN", "")) else f"the token file {str(hub_token_path())!r}"
        raise UserError(
            f"{whence} holds no Hugging Face token ({len(token)} characters, not hf_ and letters and digits); fix: "
            "copy a read token whole from huggingface.co/settings/tokens into HF_TOKEN, or `uv run hf auth login`"
        )
    return token


def masked_token() -> str | None:
    """The token output never says: the one that would be used, when it is long enough to be one."""
    try:
        token = token_as_used()
    except UserError:
        return None
    return token if token and len(token) >= SHORTEST_TOKEN else None


def _cleaned(text: str) -> str | None:
    return text.lstrip("\ufeff").replace("\r", "").replace("\n", "").strip() or None


def hub_token_path() -> Path:
    """huggingface_hub's token file: HF_TOKEN_PATH, else HF_HOME's (default ~/.cache/huggingface) `token`."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return Path(os.environ.get("HF_TOKEN_PATH") or home / "token").expanduser()


def conceal(message: str) -> str:
    """An error line as a task prints it: no Hugging Face token in it (the one this laptop has, or any value of a
    secret's key), no character a terminal would act on, and at most MAX_SAID characters."""
    token = masked_token()
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

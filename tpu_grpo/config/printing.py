"""The one way tpu-grpo prints: the terminal reads no markup in what it is given, so a path, a run name or a host's
line is shown as written (`[/x]` crashed rich, `[bold]` vanished); the project's own colours come from `styled`,
which escapes everything it fills in."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

#: Narrower than this, rich's tables print their cells empty (`COLUMNS=10`); a narrow terminal wraps instead.
MIN_WIDTH = 80


def styled(template: str, *values: object) -> Text:
    """`template`'s markup is ours; each `{}` is filled with a value shown as written (escaped, never markup)."""
    from rich.markup import escape
    from rich.text import Text

    return Text.from_markup(template.format(*(escape(str(value)) for value in values)))


class WithoutToken:
    """A stream that writes the laptop's Hugging Face token as `***`: a token typed where a value goes (a run name, a
    path, a setting) is never printed back, by rich or by print. Anything else is the stream's."""

    def __init__(self, stream, token: str):
        self._stream, self._token = stream, token

    def write(self, text: str) -> int:
        self._stream.write(text.replace(self._token, "***"))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def without_token(stream, token: str | None):
    """`stream`, writing the token (secrets.masked_token) as `***`."""
    return WithoutToken(stream, token) if token else stream


def terminal(stderr: bool = False):
    """The terminal, with no markup read in plain text; with `--json` the human lines go to stderr, so stdout holds
    only the JSON. A reader gone (`| head`) raises BrokenPipeError as print's does (rich would exit 1)."""
    from rich.console import Console

    class Terminal(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    console = Terminal(highlight=False, markup=False, stderr=stderr)
    if console.width < MIN_WIDTH:
        console.width = MIN_WIDTH
    return console

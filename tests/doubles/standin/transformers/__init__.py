"""Stand-in for `transformers.AutoTokenizer` (tests only; see tests/doubles/standin/README.md): `from_pretrained(id)`
records the id in ~/.standin/tokenizers.jsonl, and `save_pretrained(folder)` writes the tokenizer files of the
recorded export (tests/data/maxtext-0.2.3/hf-export), as the real one writes the tokenizer's own."""

from pathlib import Path

from _standin import append_line, fixtures_dir, home, load_control

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class _Tokenizer:
    def save_pretrained(self, folder: str) -> None:
        export = fixtures_dir(load_control()) / "hf-export"
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            (Path(folder) / name).write_bytes((export / name).read_bytes())


class AutoTokenizer:
    @classmethod
    def from_pretrained(cls, name: str, **_) -> _Tokenizer:
        append_line(home() / ".standin" / "tokenizers.jsonl", {"from_pretrained": name})
        return _Tokenizer()

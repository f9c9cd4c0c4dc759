"""Playbooks: load and validate a YAML playbook (playbooks/host.yml), resolve its variables and
pick its steps. What a step does on a host is the engine's (tpu_grpo/provision/engine.py).

The playbook holds what a host needs; this module knows its grammar: template variables,
`when` conditions, tags, and the values the engine sets itself (host paths, the lock).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tpu_grpo.catalog import release
from tpu_grpo.config import host_paths, stack_file, values
from tpu_grpo.config.errors import UserError

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"  # they ship with the code, not the stack
PLAYBOOK = PLAYBOOKS / "host.yml"
STEP_KEYS = {"name", "tags", "when", "become", "network", "progress", "check", "run", "secret"}
VAR_KEYS = {"default", "help", "pattern", "choices"}
PLAYBOOK_KEYS = {"prelude", "vars", "steps"}
#: Set by the engine, not by `--var`: `--locked` and its lock, and the host paths the jobs use.
BUILTINS = {"locked": False, "lock_requirements": "", **host_paths.playbook_values()}
#: Defaults the engine gives, which the playbook declares with `default: ~`: the MaxText release
#: (tpu_grpo/catalog/release.py), so the VM, the slice's image and the preflight cannot disagree.
RELEASE_DEFAULTS = {"maxtext_spec": release.MAXTEXT_SPEC}
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
_CONDITION = re.compile(r"^(?:(?P<negate>not\s+)?(?P<flag>[A-Za-z_]\w*)|(?P<name>[A-Za-z_]\w*)\s*==\s*(?P<value>\S+))$")


class PlaybookError(UserError):
    """A playbook, variable override or lock that cannot be used; one line naming where and the fix."""


_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: 10x faster


class _LineLoader(_SAFE_LOADER):
    """Keeps each mapping's line number, so errors can name it."""


def _mapping_with_line(loader, node):
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


@dataclass(frozen=True)
class Var:
    name: str
    default: Any
    help: str = ""
    pattern: str | None = None
    choices: tuple = ()

    def coerce(self, text: str, where: str) -> Any:
        """A `--var` string -> a value of the default's type, checked like the default."""
        if isinstance(self.default, bool):
            if text.lower() not in {"true", "false"}:
                raise PlaybookError(
                    f"{where}: {self.name}={text!r} is not a boolean; fix: {self.name}=true or {self.name}=false"
                )
            return text.lower() == "true"
        if isinstance(self.default, int):
            if re.fullmatch(r"-[0-9]+", text):
                raise PlaybookError(f"{where}: {self.name}={text!r} is negative; fix: e.g. {self.name}={self.default}")
            if not re.fullmatch(r"[0-9]{1,9}", text):
                raise PlaybookError(
                    f"{where}: {self.name}={text!r} is not a whole number; fix: e.g. {self.name}={self.default}"
                )
            return int(text)
        self.validate(text, where)
        return text

    def validate(self, value: str, where: str) -> None:
        if self.choices and value not in self.choices:
            raise PlaybookError(
                f"{where}: {self.name}={value!r} is not one of {', '.join(self.choices)}; "
                f"fix: {self.name}={self.choices[0]}"
            )
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise PlaybookError(
                f"{where}: {self.name}={value!r} does not match {self.pattern}; fix: e.g. {self.name}={self.default}"
            )


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    line: int
    check: str = ""
    run: str = ""
    tags: tuple = ()
    when: tuple = ()
    become: bool = False
    network: bool = False
    progress: bool = False
    secret: dict | None = None


@dataclass(frozen=True)
class Playbook:
    path: Path
    prelude: str
    vars: dict[str, Var]
    steps: tuple[Step, ...]

    def where(self, line: int | None = None, step: Step | None = None) -> str:
        return f"{self.path}" + (f":{line}" if line else "") + (f": step '{step.name}'" if step else "")


SECRET_SOURCES = {"hf_token": "the Hugging Face token (env HF_TOKEN, or the local HF token file)"}


def load(path: str | Path | None = None) -> Playbook:
    """Read and validate a playbook; any problem is a PlaybookError naming the file, line and step."""
    path = Path(path or PLAYBOOK)
    try:
        document = yaml.load(values.text_of(values.existing_file(str(path))), Loader=_LineLoader)
    except values.Refused as problem:
        raise PlaybookError(
            f"--playbook {str(path)!r} {problem}; fix: give a playbook, e.g. playbooks/host.yml"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise PlaybookError(
            f"{path}{line}: not valid YAML ({getattr(error, 'problem', error)}); fix: correct the YAML there"
        ) from None
    if not isinstance(document, dict):
        raise PlaybookError(
            f"{path}: a playbook is a mapping with {', '.join(sorted(PLAYBOOK_KEYS))}; fix: see playbooks/host.yml"
        )
    book = Playbook(path, "", {}, ())
    top = book.where(document["__line__"])
    _unknown_keys(document, PLAYBOOK_KEYS, top)
    _of_kind(document, "vars", dict, top, "vars: {name: {default: ..., help: ...}}")
    _of_kind(document, "steps", list, top, "steps: [{name: ..., check: ..., run: ...}]")
    _of_kind(document, "prelude", str, top, "prelude: | (bash run before every step)")
    variables = {}
    for name, spec in (document.get("vars") or {}).items():
        if name == "__line__":
            continue
        if not isinstance(name, str):
            raise PlaybookError(f"{top}: variable {name!r} is {_kind(name)}, not a name; fix: name it in words")
        if not isinstance(spec, dict) or "default" not in spec:
            raise PlaybookError(
                f"{book.where(document['vars']['__line__'])}: variable '{name}' needs a mapping with "
                f"'default'; fix: {name}: {{default: ..., help: ...}}"
            )
        _unknown_keys(spec, VAR_KEYS, f"{book.where(spec['__line__'])}: variable '{name}'")
        if name in BUILTINS:
            raise PlaybookError(
                f"{book.where(spec['__line__'])}: variable '{name}' is set by the engine; fix: rename it"
            )
        default = spec["default"]
        if name in RELEASE_DEFAULTS:
            if default is not None:
                raise PlaybookError(
                    f"{book.where(spec['__line__'])}: variable '{name}' takes its default from "
                    "tpu_grpo/catalog/release.py; fix: default: ~"
                )
            default = RELEASE_DEFAULTS[name]
        where = f"{book.where(spec['__line__'])}: variable '{name}'"
        _of_kind(spec, "pattern", str, where, "pattern: '[a-z]+' (a regular expression the value matches)")
        _of_kind(spec, "choices", list, where, "choices: [a, b]")
        for number, choice in enumerate(spec.get("choices") or (), 1):
            if not isinstance(choice, str):  # a --var is text, compared with each choice as text
                raise PlaybookError(
                    f"{where}: choice {number} is {_kind(choice)}, not text; fix: choices: ['1', '2'] (each quoted)"
                )
        if spec.get("pattern") is not None:
            try:
                re.compile(spec["pattern"])
            except re.error as problem:
                raise PlaybookError(
                    f"{where}: pattern {spec['pattern']!r} is not a regular expression ({problem}); fix: correct it"
                ) from None
        var = Var(name, default, spec.get("help", ""), spec.get("pattern"), tuple(spec.get("choices") or ()))
        if isinstance(var.default, str):
            var.validate(var.default, f"{book.where(spec['__line__'])}: default")
        variables[name] = var
    known = set(variables) | set(BUILTINS)
    steps = []
    for index, raw in enumerate(document.get("steps") or []):
        steps.append(_step(book, index, raw, known, variables))
    if not steps:
        raise PlaybookError(f"{path}: no steps; fix: add a list under 'steps:'")
    prelude = document.get("prelude") or ""
    _templates_known(prelude, known, book.where(document["__line__"]) + ": prelude")
    return Playbook(path, prelude, variables, tuple(steps))


def _kind(value: Any) -> str:
    """What a YAML value is, as a person says it: `a list`, `a number`, `text`."""
    kinds = {bool: "true or false", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping"}
    return kinds.get(type(value), "empty" if value is None else type(value).__name__)


def _of_kind(mapping: dict, key: str, kind: type, where: str, example: str) -> None:
    """A key that, when given, holds a value of `kind`; else one line saying what it holds."""
    value = mapping.get(key)
    if value is not None and not isinstance(value, kind):
        raise PlaybookError(f"{where}: {key} is {_kind(value)}, not {_kind(kind())}; fix: {example}")


def _unknown_keys(mapping: dict, allowed: set, where: str) -> None:
    unknown = sorted(set(mapping) - allowed - {"__line__"}, key=str)
    if unknown:
        raise PlaybookError(f"{where}: unknown key {unknown[0]!r}; fix: use only {', '.join(sorted(allowed))}")


def _templates_known(text: str, known: set, where: str) -> None:
    for name in _TEMPLATE.findall(text):
        if name not in known:
            raise PlaybookError(f"{where}: unknown variable '{{{{ {name} }}}}'; fix: declare it under 'vars:'")


def _step(book: Playbook, index: int, raw: Any, known: set, variables: dict) -> Step:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{book.path}: step {index + 1} is not a mapping; fix: '- name: ...' with check and run")
    line = raw["__line__"]
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise PlaybookError(f"{book.where(line)}: step {index + 1}'s name is {_kind(name)}, not text; fix: name: ...")
    if not name:
        raise PlaybookError(f"{book.where(line)}: step {index + 1} has no name; fix: add 'name: ...'")
    step = Step(index, name, line)
    where = book.where(line, step)
    _unknown_keys(raw, STEP_KEYS, where)
    secret = raw.get("secret")
    if secret is not None:
        if raw.get("check") or raw.get("run"):
            raise PlaybookError(
                f"{where}: a secret step has no check or run (the engine compares hashes); fix: remove them"
            )
        if raw.get("become"):
            raise PlaybookError(f"{where}: a secret is copied as the SSH user, into its home; fix: remove become")
        if not isinstance(secret, dict) or secret.get("source") not in SECRET_SOURCES or not secret.get("dest"):
            raise PlaybookError(
                f"{where}: secret needs source ({', '.join(SECRET_SOURCES)}) and dest; "
                "fix: secret: {source: hf_token, dest: .cache/huggingface/token}"
            )
        _templates_known(str(secret["dest"]), set(BUILTINS), where)
        dest = render(str(secret["dest"]), BUILTINS)  # only the engine's values: known when the playbook loads
        if dest.startswith("/") or ".." in dest.split("/") or not re.fullmatch(r"[A-Za-z0-9_./-]+", dest):
            raise PlaybookError(
                f"{where}: secret dest {dest!r} must be a plain path under the home directory; "
                "fix: e.g. .cache/huggingface/token"
            )
        secret = {"source": secret["source"], "dest": dest}
    else:
        for key in ("check", "run"):
            _of_kind(raw, key, str, where, f"{key}: | (bash)")
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise PlaybookError(
                    f"{where}: '{key}' is missing; fix: give a bash {'test' if key == 'check' else 'script'}"
                )
            _templates_known(raw[key], known, where)
    flags = {}
    for key in ("become", "network", "progress"):
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            raise PlaybookError(f"{where}: {key}={flags[key]!r} is not true or false; fix: {key}: true")
    tags, when = raw.get("tags") or [], raw.get("when") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise PlaybookError(f"{where}: tags must be a list of words; fix: tags: [apt]")
    if not isinstance(when, list):
        raise PlaybookError(f"{where}: when must be a list of conditions; fix: when: [{when}]")
    for condition in when:
        match = _CONDITION.match(str(condition).strip())
        name_used = match and (match["flag"] or match["name"])
        if not match or name_used not in known:
            raise PlaybookError(
                f"{where}: condition {condition!r} is not 'VAR', 'not VAR' or 'VAR == VALUE' "
                f"over declared variables; fix: e.g. when: [apt_upgrade]"
            )
    return Step(
        index,
        name,
        line,
        raw.get("check", ""),
        raw.get("run", ""),
        tuple(tags),
        tuple(str(condition).strip() for condition in when),
        secret=secret,
        **flags,
    )


def stack_values(chosen) -> dict[str, Any]:
    """The playbook variables that follow from the stack's settings and the laptop's $HF_ENDPOINT
    (before any `--var`): the Hub model the conversion reads is downloaded while MaxText installs."""
    return {
        "idle_stop_minutes": chosen.idle_stop_minutes,
        "hf_model": chosen.model_row.hf_id,
        "hf_endpoint": stack_file.hub_endpoint() or "",
    }


def resolve(
    book: Playbook, overrides: list[str] | None = None, lock=None, stack: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The variables for a run: defaults, then the stack's (`stack_values`), then the Python and uv of
    the `lock` (tpu_grpo.provision.lock.read_lock, with --locked), then `--var KEY=VALUE`."""
    values = {name: var.default for name, var in book.vars.items()} | BUILTINS
    values.update({name: value for name, value in (stack or {}).items() if name in book.vars})
    if lock is not None:
        values.update(locked=True, lock_requirements=lock.requirements)
        for name, pinned in (("python_version", lock.python), ("uv_version", lock.uv)):
            if name in book.vars and pinned:
                values[name] = book.vars[name].coerce(pinned, lock.path)
    for item in overrides or []:
        name, equals, text = item.partition("=")
        if name in BUILTINS:
            raise PlaybookError(
                f"--var {item!r}: {name} is set by tpu-grpo itself (where the jobs look for it: "
                "tpu_grpo/config/host_paths.py, or --locked); fix: remove this --var"
            )
        if not equals or name not in book.vars:
            known = ", ".join(book.vars)
            raise PlaybookError(
                f"--var {item!r}: {'unknown variable' if equals else 'not KEY=VALUE'}"
                f"{' ' + repr(name) if equals else ''}; fix: one of {known}"
            )
        values[name] = book.vars[name].coerce(text, f"--var {name}")
        pinned = release.other_maxtext(text) if name in RELEASE_DEFAULTS else None
        if pinned:
            raise PlaybookError(
                f"--var {item!r} pins MaxText {pinned}, but tpu-grpo runs MaxText "
                f"{release.MAXTEXT_VERSION} (its command lines, the slice's image and the preflight: "
                "tpu_grpo/catalog/release.py); fix: remove this --var"
            )
    return values


def applies(step: Step, values: dict) -> bool:
    """Whether every `when` condition of the step holds for these variables."""
    for condition in step.when:
        match = _CONDITION.match(condition)
        assert match, "conditions are checked when the playbook loads"
        if match["name"]:
            holds = str(values[match["name"]]) == match["value"]
        else:
            holds = bool(values[match["flag"]]) != bool(match["negate"])
        if not holds:
            return False
    return True


def render(text: str, values: dict) -> str:
    """Fill `{{ name }}`: every value was validated by its pattern, type or the lock's grammar."""
    return _TEMPLATE.sub(lambda match: str(values[match[1]]), text)


def parse_tags(items: list[str] | None) -> list[str]:
    """`--tags apt,uv --tags disk` -> ["apt", "uv", "disk"]; a given but empty `--tags` is refused, not
    taken as "every step"."""
    tags = [tag.strip() for item in items or [] for tag in item.split(",")]
    if items and (not tags or "" in tags):
        raise PlaybookError(f"--tags {','.join(items)!r} holds an empty tag; fix: e.g. --tags apt,uv")
    return tags


def selected(book: Playbook, tags: list[str] | None) -> list[Step]:
    if not tags:
        return list(book.steps)
    known = {tag for step in book.steps for tag in step.tags}
    unknown = sorted(set(tags) - known)
    if unknown:
        raise PlaybookError(f"--tags {unknown[0]!r} matches no step; fix: one of {', '.join(sorted(known))}")
    return [step for step in book.steps if set(step.tags) & set(tags)]

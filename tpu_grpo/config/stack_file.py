"""The laptop's side of a stack: the project's folder (where Pulumi.yaml is), which stack, which Hugging Face Hub,
and the stack file read as the Pulumi CLI reads it before it hands the values to the program."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from tpu_grpo.config.errors import SettingsError

DEFAULT_STACK = "dev"
STACK_ENV = "TPU_GRPO_STACK"
HUB_ENV = "HF_ENDPOINT"  # huggingface_hub's own: a mirror or a private Hub instead of huggingface.co
_HUB_URL = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+(?:/[A-Za-z0-9._~/-]*)?")
STATE_ENV = "TPU_GRPO_STATE"  # where known_hosts and run records live (default: .tpu-grpo/)
_CONFIG_KEY = re.compile(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+")
#: Pulumi's stack names: letters, digits, `-`, `_` and `.`, at most 100 (no path: Pulumi.NAME.yaml is a file here).
_STACK_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


def project_root(start: Path | None = None) -> Path:
    """The folder holding Pulumi.yaml: this one or the nearest above, as Pulumi finds it."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Pulumi.yaml").is_file():
            return folder
    raise SettingsError("Pulumi.yaml", None, f"is not in {here} or above", "run this from the tpu-grpo checkout")


def hub_endpoint() -> str | None:
    """The Hugging Face Hub the host talks to ($HF_ENDPOINT on the laptop, passed on), or None: huggingface.co."""
    value = os.environ.get(HUB_ENV)
    if value is None:
        return None
    if not _HUB_URL.fullmatch(value):
        raise SettingsError(
            HUB_ENV, value, "is not an http(s) URL", f"unset it, or e.g. {HUB_ENV}=https://huggingface.co"
        )
    return value.rstrip("/")


class StackFileLoader(yaml.SafeLoader):
    """Reads a stack file as the Pulumi CLI does before it hands the values to the program: every value is
    text (`50`, `true`, `no` alike; lists and mappings stay so), and a key given twice is refused."""

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):  # `!!map [a]`: the base refuses it as YAML no mapping can be
            return super().construct_mapping(node, deep)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # `!!int 1:`, `!!binary ...:`, `? [a, b]`: no setting's name, nor hashable
                raise yaml.constructor.ConstructorError(
                    None, None, f"found a key that is not text ({type(key).__name__})", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StackFileLoader.yaml_implicit_resolvers = {}  # no int, bool, float or null: text, as the Pulumi CLI passes it
#: The most values a stack file may hold once its aliases are expanded: a few YAML lines of aliases to aliases would
#: otherwise make millions ("billion laughs"); a real stack file holds tens.
MAX_VALUES = 10_000


def expanded_size(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """The values a composed YAML node stands for with every alias expanded, counted without expanding them (an
    alias is the node it names: each is counted once, then reused)."""
    sizes = {} if sizes is None else sizes
    if id(node) not in sizes:
        sizes[id(node)] = 0  # a node that holds itself (`&a [*a]`) counts once
        children = (
            [part for pair in node.value for part in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        sizes[id(node)] = min(MAX_VALUES + 1, 1 + sum(expanded_size(child, sizes) for child in children))
    return sizes[id(node)]


def load_stack_yaml(text: str):
    """A stack file's document, refused when its aliases expand beyond MAX_VALUES."""
    loader = StackFileLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and expanded_size(node) > MAX_VALUES:
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_VALUES} values")
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def new_stack(stack: str) -> str:
    """The commands that make a stack: its init, each setting that has no default, and the reservation that the
    default capacity needs."""
    from tpu_grpo.config.keys import KEY, KEYS, PROJECT

    needed = [key.set_command() for key in KEYS if key.required] + [KEY[f"{PROJECT}:reservation"].set_command()]
    return (
        " && ".join([f"pulumi stack init {stack}", *needed])
        + f" (no reservation: pulumi config set {PROJECT}:capacity spot, or flex-start or on-demand, instead)"
    )


def stack_path(stack: str, root: Path) -> Path:
    """The stack's file, `Pulumi.<stack>.yaml` beside Pulumi.yaml, as the Pulumi CLI names it."""
    return root / f"Pulumi.{stack}.yaml"


def salted(stack: str, root: Path) -> bool:
    """Whether the stack's secrets are under a passphrase: `pulumi stack init` on a `pulumi login --local` backend
    writes its `encryptionsalt:` into the stack file."""
    path = stack_path(stack, root)
    return path.is_file() and any(
        line.startswith("encryptionsalt:") for line in path.read_text(encoding="utf-8").splitlines()
    )


def read_stack_file(stack: str, root: Path) -> dict[str, Any]:
    """The `config:` mapping of `Pulumi.<stack>.yaml`, as the Pulumi CLI would pass it on."""
    path = stack_path(stack, root)
    if not path.is_file():
        raise SettingsError(
            STACK_ENV, stack, f"has no stack file {path.name}", f"{new_stack(stack)} (or {STACK_ENV}={DEFAULT_STACK})"
        )
    try:
        document = load_stack_yaml(path.read_text(encoding="utf-8")) or {}
    except RecursionError:
        raise SettingsError(path.name, stack, "is nested too deep to be a stack file", f"fix {path.name}") from None
    except UnicodeDecodeError as error:
        raise SettingsError(
            path.name, stack, f"is not UTF-8 text (byte {error.start})", f"save {path.name} as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error) or "unreadable"
        raise SettingsError(
            path.name, stack, f"is not valid YAML ({problem}{where})", f"fix {path.name}{where}"
        ) from None
    if not isinstance(document, dict):
        raise SettingsError(
            path.name,
            stack,
            "is not a mapping with a `config:` key",
            f"fix {path.name} (e.g. `pulumi config set gcp:zone us-east5-b` writes one)",
        )
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SettingsError(path.name, stack, "has a `config:` that is not a mapping", f"fix {path.name}")
    for name in config:
        if not _CONFIG_KEY.fullmatch(name):
            from tpu_grpo.config.keys import meant

            key = meant(str(name))
            raise SettingsError(
                f"{path.name} config",
                name,
                "is not a setting's name (NAMESPACE:NAME, as the Pulumi CLI wants it)",
                f"name it {key.name}" if key else f"remove it from {path.name}, or name it e.g. gcp:zone",
            )
    return config


def stack_name(flag: str | None) -> tuple[str, str, str]:
    """The stack a task names: --stack, else $TPU_GRPO_STACK, else dev, checked to be a stack's name (never a path),
    with what named it and the other way to name one: (stack, said, other). A task given --host checks it too."""
    env = os.environ.get(STACK_ENV)
    stack, said = (
        (flag, "--stack") if flag is not None else (env, STACK_ENV) if env else (DEFAULT_STACK, "the default stack")
    )
    other = f"--stack {DEFAULT_STACK}" if said == "--stack" else f"unset {STACK_ENV}, or --stack NAME"
    if not _STACK_NAME.fullmatch(stack):
        raise SettingsError(
            said,
            stack,
            "is not a Pulumi stack name (letters, digits, '-', '_', '.'; at most 100)",
            f"e.g. {other} (`pulumi stack ls` lists them)",
        )
    return stack, said, other


def chosen_stack(flag: str | None, root: Path) -> str:
    """The stack a task acts on (stack_name), whose stack file must exist; a bad name or a missing stack file is
    blamed on whichever of them named it."""
    stack, said, other = stack_name(flag)
    if not stack_path(stack, root).is_file():
        # stack names are case-sensitive to Pulumi: Pulumi.r6.yaml is no file of stack R6, though it is what was meant
        same = sorted(
            path.name[len("Pulumi.") : -len(".yaml")]
            for path in root.glob("Pulumi.*.yaml")
            if path.name.lower() == f"pulumi.{stack}.yaml".lower()
        )
        if same:
            meant = f"--stack {same[0]}" if said == "--stack" else f"{STACK_ENV}={same[0]}"
            fix = f"{meant}, the stack whose file is {stack_path(same[0], root).name}"
        else:
            fix = new_stack(stack)
        raise SettingsError(said, stack, f"has no stack file Pulumi.{stack}.yaml", f"{fix} (or {other})")
    return stack

"""The folders are the layers, and imports only look down: the catalogues (tpu_grpo/catalog/), config, then the
Pulumi program (infra/), then cloud, host, provision, jobs, results, cli, and tasks.py on top (docs/development.md's
layout). Read from the code's own imports (at module level or inside a function alike), so a new import up or a
circle fails here."""

from __future__ import annotations

import ast

from tests.support import ROOT

LAYERS = [
    "tpu_grpo.catalog",
    "tpu_grpo.config",
    "infra",
    "tpu_grpo.cloud",
    "tpu_grpo.host",
    "tpu_grpo.provision",
    "tpu_grpo.jobs",
    "tpu_grpo.results",
    "tpu_grpo.cli",
    "tasks",
]


def modules() -> dict[str, set[str]]:
    """Each module of tpu_grpo, infra and tasks.py, and the project's modules it imports."""
    paths = [*ROOT.glob("tpu_grpo/**/*.py"), *ROOT.glob("infra/*.py"), ROOT / "tasks.py"]
    names = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path for path in paths}
    imports = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names else node.module
                    for alias in node.names
                }
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        imports[name] = {other for other in found if other in names and other != name}
    return imports


def layer(name: str) -> int:
    return next(index for index, prefix in enumerate(LAYERS) if name == prefix or name.startswith(prefix + "."))


def test_every_module_is_in_a_layer_and_imports_none_above_it():
    found = modules()
    assert "tpu_grpo.jobs.targets" in found and "tpu_grpo.config.settings" in found
    above = sorted((name, other) for name, imports in found.items() for other in imports if layer(other) > layer(name))
    assert above == []


def test_no_module_imports_itself_round_a_circle():
    found, done, circles = modules(), set(), []

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            circles.append(path[path.index(name) :] + [name])
            return
        if name in done:
            return
        for other in sorted(found[name]):
            visit(other, [*path, name])
        done.add(name)

    for name in sorted(found):
        visit(name, [])
    assert circles == []

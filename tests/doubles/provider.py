"""What makes terraform-provider-google (which pulumi-gcp wraps) replace a resource, for the engine double
(tests/doubles/cloud.py), read from the provider's own Go schemas and not from tpu-grpo's table
(infra/replacements.py), so that a gap in that table is not a gap in the double too.

`python -m tests.doubles.provider REPO` reads the schemas of a checkout of hashicorp/terraform-provider-google and
writes provider_schema.json: for each resource type, every field path in Terraform's names with whether it is
`ForceNew: true`, a block of at most one (`MaxItems: 1`, which the bridge makes an object) or a list. The JSON holds
the provider at e03b762 (2026-08-21). The double turns a Terraform path into the inputs' names as the bridge does
(snake_case to camelCase, a list of more than one item plural), and compares the state's inputs with the declared
ones on those paths alone: a block forces a new resource when it comes or goes, a field when its value changes (a
list of plain values as a whole: the SDK's diffList gives its elements the list's ForceNew)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

COMMIT = "e03b7622a2"
SCHEMA = Path(__file__).with_name("provider_schema.json")
#: The Go files of each Pulumi type this program declares; a schema a function returns (`"node_config":
#: schemaNodeConfig()`) is read from the files listed with it.
SOURCES: dict[str, tuple[str, ...]] = {
    "gcp:compute/instance:Instance": ("compute/resource_compute_instance.go",),
    "gcp:compute/disk:Disk": ("compute/resource_compute_disk.go",),
    "gcp:compute/snapshot:Snapshot": ("compute/resource_compute_snapshot.go",),
    "gcp:compute/firewall:Firewall": ("compute/resource_compute_firewall.go",),
    "gcp:compute/network:Network": ("compute/resource_compute_network.go",),
    "gcp:compute/subnetwork:Subnetwork": ("compute/resource_compute_subnetwork.go",),
    "gcp:storage/bucket:Bucket": ("storage/resource_storage_bucket.go",),
    "gcp:container/cluster:Cluster": ("container/resource_container_cluster.go", "container/node_config.go"),
    "gcp:container/nodePool:NodePool": ("container/resource_container_node_pool.go", "container/node_config.go"),
    "gcp:artifactregistry/repository:Repository": ("artifactregistry/resource_artifact_registry_repository.go",),
}
#: IAM members have no Update function (google/tpgiamresource/resource_iam_member.go): any change makes a new one.
NO_UPDATE = (
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:projects/iAMMember:IAMMember",
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember",
)

_KEY = re.compile(r'^\s*"([a-z0-9_]+)":\s*(?:\{|&schema\.Schema\{|(\w+)\(\),?)\s*$')
_FUNCTION = re.compile(r"^func (\w+)\(\) \*schema\.Schema \{")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')


def _fields(text: str) -> tuple[dict[str, dict], dict[str, dict[str, dict]]]:
    """The fields of a Go file's schema maps by path (with their flags and the schema functions they call), and the
    fields of each `func name() *schema.Schema` by path under it."""
    fields: dict[str, dict] = {}
    functions: dict[str, dict[str, dict]] = {}
    stack: list[tuple[str, int, dict[str, dict]]] = []  # (path, depth at its opening, where it goes)
    depth, function = 0, None
    for line in text.splitlines():
        line = line.split("//")[0] if not line.lstrip().startswith(("Description", '"')) else line
        started = _FUNCTION.match(line)
        if started and depth == 0:
            function = functions.setdefault(started[1], {"": {}})
        if function is not None and depth == 1 and re.match(r"\s*return &schema\.Schema\{", line):
            stack.append(("", depth, function))  # the schema the function returns: its flags at depth 2
        key = _KEY.match(line)
        if key and stack or key and depth > 0:
            parent = next((path for path, _, _ in reversed(stack)), "")
            owner = stack[-1][2] if stack else fields
            path = f"{parent}.{key[1]}" if parent else key[1]
            owner[path] = {"calls": key[2]} if key[2] else {}
            if not key[2]:
                stack.append((path, depth, owner))
        elif stack and depth == stack[-1][1] + 1:
            entry = stack[-1][2].setdefault(stack[-1][0], {})
            if re.search(r"\bForceNew:\s*true\b", line):
                entry["force_new"] = True
            if re.search(r"\bMaxItems:\s*1,", line):
                entry["max_one"] = True
            if re.search(r"\bType:\s*schema\.Type(?:List|Set)\b", line):
                entry["list"] = True
            if re.search(r"\bComputed:\s*true\b", line):
                entry["computed"] = True
        depth += line.count("{") - line.count("}") if not _STRINGS.search(line) else _braces(line)
        while stack and depth <= stack[-1][1]:
            stack.pop()
        if depth == 0:
            function = None
    return fields, functions


def _braces(line: str) -> int:
    bare = _STRINGS.sub("", line)
    return bare.count("{") - bare.count("}")


def extract(repo: Path) -> dict[str, dict[str, dict]]:
    """Each type's fields by Terraform path, read from the provider's Go files at HEAD of `repo`."""
    schema: dict[str, dict[str, dict]] = {}
    for type_, files in SOURCES.items():
        fields: dict[str, dict] = {}
        functions: dict[str, dict[str, dict]] = {}
        for index, name in enumerate(files):
            text = subprocess.run(
                ["git", "show", f"HEAD:google/services/{name}"], cwd=repo, capture_output=True, text=True, check=True
            ).stdout
            own, called = _fields(text)
            functions.update(called)
            if index == 0:
                fields = own
        schema[type_] = _resolved(fields, functions)
    return schema


def _resolved(fields: dict[str, dict], functions: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """`fields` with each schema function's fields under the field that calls it."""
    done: dict[str, dict] = {}
    for path, flags in fields.items():
        called = functions.get(flags.get("calls") or "")
        if called is None:
            done[path] = {key: value for key, value in flags.items() if key != "calls" and value}
            continue
        for inner, inner_flags in _resolved(called, functions).items():
            done[f"{path}.{inner}" if inner else path] = inner_flags
    return done


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _plural(name: str) -> str:
    """The bridge's name of a list of more than one item (tfbridge's inflector: `network_interface` is
    `networkInterfaces`, `oauth_scopes` stays)."""
    if name.endswith("s"):
        return name
    return name[:-1] + "ies" if name.endswith("y") and name[-2:-1] not in "aeiou" else name + "s"


def pulumi_paths(fields: dict[str, dict]) -> dict[str, str]:
    """Each Terraform path as the inputs' path (`network_interface.nic_type` -> `networkInterfaces[*].nicType`)."""
    paths = {}
    for path in fields:
        parts, so_far = [], []
        for part in path.split("."):
            so_far.append(part)
            flags = fields.get(".".join(so_far), {})
            many = flags.get("list") and not flags.get("max_one")
            parts.append(
                (_plural(_camel(part)) + "[*]")
                if many and len(so_far) < len(path.split("."))
                else _camel(part)
                if not many
                else _plural(_camel(part))
            )
        paths[path] = ".".join(parts).replace(".[", "[")
    return paths


@functools.cache
def load() -> dict[str, dict[str, dict]]:
    return json.loads(SCHEMA.read_text())["types"]


#: Each type's force-new fields as input paths, with whether each is a block (fields of its own under it).
_REFERENCE = re.compile(r"\((?:id|self link) of (?P<name>[^)]+)\)")


def _force_new_paths() -> dict[str, list[tuple[str, bool]]]:
    found: dict[str, list[tuple[str, bool]]] = {}
    for type_, fields in load().items():
        names = pulumi_paths(fields)
        found[type_] = [
            (names[path], any(other.startswith(f"{path}.") for other in fields) or bool(fields[path].get("max_one")))
            for path, flags in fields.items()
            if flags.get("force_new")
        ]
    return found


FORCE_NEW_PATHS = _force_new_paths()


def values_at(value: Any, parts: list[str], prefix: str = "") -> dict[str, Any]:
    """The values at an input path (`a[*].b`) by their own paths (`a[0].b`); a path that is not there is absent."""
    if not parts:
        return {prefix: value}
    head, rest = parts[0], parts[1:]
    name = head.removesuffix("[*]")
    if not isinstance(value, dict) or value.get(name) is None:
        return {}
    here = f"{prefix}.{name}" if prefix else name
    if head.endswith("[*]"):
        items = value[name] if isinstance(value[name], list) else []
        return {k: v for index, item in enumerate(items) for k, v in values_at(item, rest, f"{here}[{index}]").items()}
    return values_at(value[name], rest, here)


def _changed(old: Any, new: Any, block: bool, replaced: set[str]) -> bool:
    """A block changes when it comes or goes (a list of them when their count does); a value when it differs, an
    output of a resource made anew being unknown until then (the SDK plans an unknown ForceNew value as new)."""
    if _unknown(new, replaced):
        return True
    if block:
        return (
            (old is None) != (new is None) or len(old or []) != len(new or [])
            if isinstance(new, list)
            else ((old is None) != (new is None))
        )
    number = (int, float)
    if isinstance(old, number) and isinstance(new, number) and not isinstance(old, bool):
        return float(old) != float(new)
    return old != new


def _unknown(value: Any, replaced: set[str]) -> bool:
    """Whether a value takes an output of a resource made anew in this update (unknown until it is made)."""
    return any(match["name"] in replaced for match in _REFERENCE.finditer(json.dumps(value)))


def _below(path: str, entries: tuple[str, ...]) -> bool:
    return any(path == entry or path.startswith((f"{entry}.", f"{entry}[")) for entry in entries)


def unset_kept(type_: str, old: dict, new: dict) -> dict:
    """The inputs an update leaves in the state: a top-level field that is Optional and Computed keeps its old value
    when the program leaves it unset (the SDK plans no diff for it: the provider's value stands), so a slice's pool
    whose `nodeLocations` the program stopped setting stays where it was."""
    fields = load().get(type_, {})
    kept = {
        _camel(name): old[_camel(name)]
        for name, flags in fields.items()
        if "." not in name and flags.get("computed") and new.get(_camel(name)) is None and _camel(name) in old
    }
    return {**new, **kept}


def forcing(
    type_: str,
    old: dict,
    new: dict,
    replaced: set[str],
    replace_on_changes: tuple[str, ...] = (),
    ignore_changes: tuple[str, ...] = (),
) -> list[tuple[str, Any, Any]]:
    """The paths (with their old and new values) on which the provider (and the program's `replace_on_changes`)
    makes a new resource of this change: `old` the state's inputs, `new` the declared ones, `replaced` the names of
    resources made anew in this update. A path at or below `ignore_changes` keeps its old value (the engine's
    processIgnoreChanges runs before the provider's diff)."""
    if type_ in NO_UPDATE:
        old, new = ({k: v for k, v in inputs.items() if not k.startswith("__")} for inputs in (old, new))
        return [("*", old, new)] if old != new or _unknown(new, replaced) else []
    new = unset_kept(type_, old, new)
    paths = [(path, block) for path, block in FORCE_NEW_PATHS.get(type_, []) if not _below(path, ignore_changes)]
    paths += [(path.replace("[0]", "[*]"), False) for path in replace_on_changes]
    found = {}
    for path, block in paths:
        before, after = values_at(old, path.split(".")), values_at(new, path.split("."))
        for where in sorted(set(before) | set(after)):
            if not _below(where, ignore_changes) and _changed(before.get(where), after.get(where), block, replaced):
                found[where] = (where, before.get(where), after.get(where))
    # a block that came or went is one change, as the bridge's detailed diff names it, not each field in it
    went = [path for path, old_value, new_value in found.values() if old_value is None or new_value is None]
    return sorted(f for f in found.values() if not any(f[0].startswith((f"{o}.", f"{o}[")) for o in went))


def forces_new(type_: str, old: dict, new: dict, replaced: set[str], replace_on_changes=(), ignore_changes=()) -> bool:
    return bool(forcing(type_, old, new, replaced, tuple(replace_on_changes), tuple(ignore_changes)))


def changes(state: list[dict], declared: list) -> list:
    """What the engine replaces or deletes when it runs the program's `declared` resources over `state` (the
    resources of `pulumi stack export`), as infra/replacements.py's Change records: a resource under a declared one's
    alias is that one (step_generator.go matches aliases first); a replacement makes every output of it unknown, so
    what takes one may be replaced too, until nothing more is; a resource no longer declared is deleted, or only
    forgotten when retained on delete, or strips a binding a declared grant holds (subtractFromBindings); a node
    pool's RECREATES_NODES fields are updated in place by recreating its nodes."""
    from infra.replacements import Change

    now = {(r.type, r.name): r for r in declared}
    before = {
        (r["type"], r["urn"].rsplit("::", 1)[-1]): r
        for r in state
        if "inputs" in r and r.get("custom", True) and not r["type"].startswith("pulumi:")
    }
    for resource in declared:
        for alias in resource.options.aliases:
            if (resource.type, alias) in before and (resource.type, resource.name) not in before:
                before[(resource.type, resource.name)] = before.pop((resource.type, alias))
    made = {name for (_, name) in now if (_, name) not in before}
    found: dict[tuple[str, str], Change] = {}
    grown = True
    while grown:
        grown = False
        for key, resource in now.items():
            if key in before and key not in found:
                options = resource.options
                fields = forcing(
                    key[0],
                    before[key]["inputs"],
                    resource.inputs,
                    made,
                    options.replace_on_changes,
                    options.ignore_changes,
                )
                if fields:
                    found[key] = Change(*key, "replace", tuple(fields))
                    made.add(key[1])
                    grown = True
    for key, resource in now.items():
        if key in before and key not in found and key[0] in RECREATES_NODES:
            fields = forcing(key[0], before[key]["inputs"], resource.inputs, made, RECREATES_NODES[key[0]])
            if fields:
                found[key] = Change(*key, "recreate nodes", tuple(fields))
    grants = [(r.type, r.inputs) for r in declared if r.type in NO_UPDATE]
    gone = [
        Change(
            *key, "forget" if was.get("retainOnDelete") else "strip" if (key[0], was["inputs"]) in grants else "delete"
        )
        for key, was in before.items()
        if key not in now
    ]
    return sorted(found.values(), key=lambda c: (c.type, c.name)) + gone


#: What the provider updates in place and GKE applies by recreating a pool's nodes (resource_container_node_pool.go:
#: disk size and machine type go in one UpdateNodePoolRequest, applied a surge at a time).
RECREATES_NODES = {"gcp:container/nodePool:NodePool": ("nodeConfig.diskSizeGb", "nodeConfig.machineType")}


if __name__ == "__main__":
    found = extract(Path(sys.argv[1]))
    SCHEMA.write_text(json.dumps({"provider": COMMIT, "types": found}, indent=1, sort_keys=True) + "\n")

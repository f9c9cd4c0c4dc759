"""What `pulumi up` replaces or deletes when the stack's settings change: the stack's state (each resource's inputs
as the last update recorded them, `pulumi stack export`) against the inputs the program declares now, judged by the
provider's own force-new fields. `invoke plan`, `invoke up` and the Pulumi CLI double all read this one table.

FORCE_NEW is terraform-provider-google's `ForceNew: true` fields (pulumi-gcp wraps that provider, and its engine
replaces a resource when one of them changes), in Pulumi's input names, for the blocks this program sets. Read from
hashicorp/terraform-provider-google at commit e03b762 (2026-08-21), the files named beside each type. As in the
provider's SDK, a force-new block (a list in Terraform) forces a new resource only when it appears or goes; a change
inside it only through its own force-new fields. An IAM member resource has no update at all: every field is
force-new (google/tpgiamresource/resource_iam_member.go). A list of plain values is force-new element by element
when the list is (the SDK's diffList gives its elements the list's ForceNew)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INSTANCE = "gcp:compute/instance:Instance"
DISK = "gcp:compute/disk:Disk"
SNAPSHOT = "gcp:compute/snapshot:Snapshot"
NODE_POOL = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
BUCKET = "gcp:storage/bucket:Bucket"
PROJECT_IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
EVERY_FIELD = ("*",)

FORCE_NEW: dict[str, tuple[str, ...]] = {
    # google/services/compute/resource_compute_instance.go
    INSTANCE: (
        "name",
        "zone",
        "project",
        "hostname",
        "bootDisk",
        "bootDisk.deviceName",
        "bootDisk.mode",
        "bootDisk.source",
        "bootDisk.initializeParams",
        "bootDisk.initializeParams.image",
        "bootDisk.initializeParams.type",
        "bootDisk.initializeParams.snapshot",
        "bootDisk.initializeParams.provisionedIops",
        "bootDisk.initializeParams.provisionedThroughput",
        "networkInterfaces",
        "networkInterfaces[*].nicType",
        "networkInterfaces[*].queueCount",
        "attachedDisks[*].forceAttach",
        "reservationAffinity",
        "reservationAffinity.type",
        "reservationAffinity.specificReservation",
        "reservationAffinity.specificReservation.key",
        "reservationAffinity.specificReservation.values",
        "scheduling.provisioningModel",
        "scheduling.preemptible",
        "scheduling.maxRunDuration",
        "scheduling.maxRunDuration.seconds",
        "scheduling.terminationTime",
        "scheduling.onInstanceStopAction",
    ),
    # google/services/compute/resource_compute_disk.go
    DISK: ("name", "zone", "project", "type", "image", "snapshot", "sourceDisk"),
    # google/services/compute/resource_compute_snapshot.go: all but labels are ForceNew
    SNAPSHOT: ("name", "sourceDisk", "zone", "project", "description", "storageLocations"),
    # google/services/compute/resource_compute_firewall.go
    "gcp:compute/firewall:Firewall": ("name", "project", "direction"),
    # google/services/compute/resource_compute_network.go
    "gcp:compute/network:Network": ("name", "project", "autoCreateSubnetworks"),
    # google/services/compute/resource_compute_subnetwork.go
    "gcp:compute/subnetwork:Subnetwork": ("name", "project", "network", "region"),
    # google/services/storage/resource_storage_bucket.go
    BUCKET: ("name", "project", "location"),
    # google/services/container/resource_container_cluster.go
    CLUSTER: (
        "name",
        "location",
        "project",
        "network",
        "subnetwork",
        "datapathProvider",
        "initialNodeCount",
        "ipAllocationPolicy",
        "ipAllocationPolicy.clusterIpv4CidrBlock",
        "ipAllocationPolicy.servicesIpv4CidrBlock",
        "defaultMaxPodsPerNode",
    ),
    # google/services/container/resource_container_node_pool.go and node_config.go
    NODE_POOL: (
        "name",
        "cluster",
        "location",
        "project",
        "initialNodeCount",
        "maxPodsPerNode",
        "placementPolicy",
        "placementPolicy.policyName",
        "networkConfig.acceleratorNetworkProfile",
        "nodeConfig",
        "nodeConfig.spot",
        "nodeConfig.flexStart",
        "nodeConfig.preemptible",
        "nodeConfig.maxRunDuration",
        "nodeConfig.oauthScopes",
        "nodeConfig.serviceAccount",
        "nodeConfig.metadata",
        "nodeConfig.reservationAffinity",
        "nodeConfig.reservationAffinity.consumeReservationType",
        "nodeConfig.reservationAffinity.key",
        "nodeConfig.reservationAffinity.values",
        "nodeConfig.hostMaintenancePolicy",
        "nodeConfig.hostMaintenancePolicy.maintenanceInterval",
    ),
    # google/services/artifactregistry/resource_artifact_registry_repository.go
    "gcp:artifactregistry/repository:Repository": ("repositoryId", "location", "project", "format", "mode"),
    # google/tpgiamresource/resource_iam_member.go: no Update function
    "gcp:storage/bucketIAMMember:BucketIAMMember": EVERY_FIELD,
    PROJECT_IAM_MEMBER: EVERY_FIELD,
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": EVERY_FIELD,
}


def _shrinks(old: Any, new: Any) -> bool:
    """resource_compute_disk.go's IsDiskShrinkage: a smaller size cannot be applied to a disk, only a larger one."""
    return old is not None and new is not None and int(new) < int(old)


def _not_an_expansion(old: Any, new: Any) -> bool:
    """resource_compute_subnetwork.go's IsShrinkageIpCidr: only a range that still holds the old one is an update."""
    try:
        before, after = ipaddress.ip_network(old), ipaddress.ip_network(new)
    except (TypeError, ValueError):
        return False  # as the provider: a range it cannot parse forces nothing
    return not (before[0] in after and before[-1] in after)


#: The provider's CustomizeDiff functions that force a new resource on a condition (`customdiff.ForceNewIfChange`),
#: for the fields this program sets; read at the same commit. The others of the declared types concern fields it
#: does not set: an instance's metadata_startup_script, network_ip and guest_accelerator, a bucket's locked retention
#: policy, a cluster's l4 ILB subsetting, FQDN network policy and beta APIs, a pool's additional node networks; and a
#: disk's provisioned_iops forces a new disk only when the type is not Hyperdisk, which the data disk always is.
FORCE_NEW_IF: dict[str, dict[str, Callable[[Any, Any], bool]]] = {
    DISK: {"size": _shrinks},  # customdiff.ForceNewIfChange("size", IsDiskShrinkage)
    "gcp:compute/subnetwork:Subnetwork": {"ipCidrRange": _not_an_expansion},
}
#: What the provider updates in place and the cloud applies by making the machines anew: a node pool's disk size and
#: machine type (resource_container_node_pool.go sends both in one UpdateNodePoolRequest, which GKE applies by
#: recreating the pool's nodes, its upgrade strategy's surge at a time).
RECREATES_NODES: dict[str, tuple[str, ...]] = {NODE_POOL: ("nodeConfig.diskSizeGb", "nodeConfig.machineType")}
#: A reference to another resource in the offline run (infra/offline.py's mock ids and self links): it changes exactly
#: when that resource is made anew.
REFERENCE = re.compile(r"\((?:id|self link) of (?P<name>.+)\)")


@dataclass(frozen=True)
class Change:
    """One resource `pulumi up` would replace (or delete), and the fields that make it do so."""

    type: str
    name: str
    #: "replace", "delete", "forget" (no longer declared, and retained on delete: it stays in the cloud), "strip" (an
    #: IAM member no longer declared whose binding a declared one holds: deleting it removes the binding itself,
    #: tpgiamresource/resource_iam_member.go's subtractFromBindings) or "recreate nodes" (RECREATES_NODES)
    action: str
    fields: tuple[tuple[str, Any, Any], ...] = ()

    def because(self) -> str:
        return ", ".join(f"{path} {_shown(old)} -> {_shown(new)}" for path, old, new in self.fields)


def _shown(value: Any) -> str:
    return "(unset)" if value is None else str(value)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every path of a resource's inputs (`a.b`, `a[0].b`) with its value, blocks included; Pulumi's own
    bookkeeping keys (`__defaults`) left out."""
    found = {prefix: value} if prefix else {}
    if isinstance(value, dict):
        for key, item in value.items():
            if not key.startswith("__"):
                found.update(flatten(item, f"{prefix}.{key}" if prefix else key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(flatten(item, f"{prefix}[{index}]"))
    return found


def _pattern(path: str, below: bool = False) -> re.Pattern:
    """A table path (`a[*].b`) as a pattern of flattened paths; `below`: what lies under it too."""
    return re.compile(re.escape(path).replace(r"\[\*\]", r"\[\d+\]") + (r"(?:[.\[].*)?" if below else ""))


def _differs(old: Any, new: Any, replaced: set[str]) -> bool:
    if isinstance(new, str) and (reference := REFERENCE.fullmatch(new)):
        return reference["name"] in replaced or old is None
    if _scalars(old) and _scalars(new):  # a list of values takes its ForceNew from the list (SDK's diffList)
        return old != new
    if isinstance(old, (dict, list)) or isinstance(new, (dict, list)):  # a block: only its coming or going
        return (old is None) != (new is None) or (
            isinstance(old, list) and isinstance(new, list) and len(old) != len(new)
        )
    return _normal(old) != _normal(new)


def _scalars(value: Any) -> bool:
    return isinstance(value, list) and not any(isinstance(item, (dict, list)) for item in value) or value is None


def _normal(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value  # the engine's numbers


def forcing_fields(
    type_: str,
    old: dict,
    new: dict,
    replaced: set[str],
    replace_on_changes: tuple[str, ...] = (),
    ignore_changes: tuple[str, ...] = (),
) -> list[tuple[str, Any, Any]]:
    """The fields of one resource whose change makes a new one: the provider's force-new fields, and the program's
    own `replace_on_changes` (any change at or below them). A field at or below the program's `ignore_changes` keeps
    its old value (the engine's processIgnoreChanges copies it into the new inputs before the provider's diff)."""
    table = FORCE_NEW.get(type_, ())
    before, after = flatten(old), flatten(new)
    found = []
    for path in sorted(set(before) | set(after)):
        old_value, new_value = before.get(path), after.get(path)
        if any(_pattern(entry, below=True).fullmatch(path) for entry in ignore_changes):
            continue
        if not _differs(old_value, new_value, replaced):
            continue
        forced = table == EVERY_FIELD or any(_pattern(entry).fullmatch(path) for entry in table)
        condition = FORCE_NEW_IF.get(type_, {}).get(path)
        forced = forced or bool(condition and condition(old_value, new_value))
        if forced or any(_pattern(entry, below=True).fullmatch(path) for entry in replace_on_changes):
            found.append((path, old_value, new_value))
    return _leaves(found)


def _leaves(fields: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """The changed values themselves, not the blocks that hold them (a block stays where it is all that changed)."""
    return [
        field
        for field in fields
        if not any(other[0] != field[0] and other[0].startswith(field[0]) for other in fields)
        or not isinstance(field[1] or field[2], (dict, list))
    ]


#: The engine's ops that tear a resource down and build it again (pkg/resource/deploy/step.go's StepOp values).
REPLACING_OPS = (
    "replace",
    "create-replacement",
    "delete-replaced",
    "read-replacement",
    "import-replacement",
    "discard-replaced",
)


def from_steps(steps: list[dict], declared: list) -> list[Change]:
    """The engine's own steps (`pulumi preview --json`: op, urn, oldState, newState, replaceReasons, detailedDiff; pkg/
    display/json.go's PreviewDigest) as the Changes `diff` gives, so that `invoke up` decides on the engine's and the
    provider's answer, CustomizeDiff included, and this module's table stays the offline plan's estimate. A replace
    is named by the paths whose diff kind is `*-replace` (else its replaceReasons); a delete is "forget" where the state
    retains it, "strip" where a declared grant holds its binding; an update of RECREATES_NODES's fields recreates."""
    grants = [(r.type, r.inputs) for r in declared if FORCE_NEW.get(r.type) == EVERY_FIELD]
    found: dict[tuple[str, str], Change] = {}
    for step in steps:
        urn = step.get("urn", "")
        key = (urn.split("::")[-2].rsplit("$", 1)[-1] if "::" in urn else "", urn.rsplit("::", 1)[-1])
        old, new = step.get("oldState") or {}, step.get("newState") or {}
        before, after = flatten(old.get("inputs") or {}), flatten(new.get("inputs") or {})
        detailed = step.get("detailedDiff") or {}
        op = step.get("op")
        if op in REPLACING_OPS:
            paths = [path for path, diff in detailed.items() if str(diff.get("kind", "")).endswith("-replace")]
            paths = paths or list(step.get("replaceReasons") or [])
            found[key] = Change(*key, "replace", tuple((p, before.get(p), after.get(p)) for p in sorted(paths)))
        elif op == "delete":
            inputs = old.get("inputs") or {}
            action = "forget" if old.get("retainOnDelete") else "strip" if (key[0], inputs) in grants else "delete"
            found[key] = Change(*key, action)
        elif op == "update" and key[0] in RECREATES_NODES:
            paths = [p for p in step.get("diffReasons") or [] if any(p.startswith(f) for f in RECREATES_NODES[key[0]])]
            if paths:
                found[key] = Change(*key, "recreate nodes", tuple((p, before.get(p), after.get(p)) for p in paths))
    deleted = [change for change in found.values() if change.action not in ("replace", "recreate nodes")]
    changed = sorted((c for c in found.values() if c not in deleted), key=lambda c: (c.type, c.name))
    return changed + deleted


def diff(state: list[dict], declared: list) -> list[Change]:
    """What `pulumi up` would replace or delete: `state` is the resources of `pulumi stack export` (type, urn,
    inputs), `declared` what the program declares now (infra/offline.py's DeclaredResource, with its options). A
    resource of the state under one of a declared resource's aliases is that resource (Pulumi's engine matches
    aliases before it plans a create or a delete)."""
    now = {(r.type, r.name): r for r in declared}
    before = {
        (r["type"], r["urn"].rsplit("::", 1)[-1]): r["inputs"]
        for r in state
        if "inputs" in r and r.get("custom", True) and not r["type"].startswith("pulumi:")
    }
    retained = {(r["type"], r["urn"].rsplit("::", 1)[-1]) for r in state if r.get("retainOnDelete")}
    for resource in declared:
        for alias in resource.options.aliases:
            if (resource.type, alias) in before and (resource.type, resource.name) not in before:
                before[(resource.type, resource.name)] = before.pop((resource.type, alias))
    replaced = {name for (_, name) in now if (_, name) not in before}  # made new: what refers to it changes too
    changes: dict[tuple[str, str], Change] = {}
    while True:  # a replacement changes the references to it: until nothing more is replaced
        for key, resource in now.items():
            if key in before and key not in changes:
                options = resource.options
                fields = forcing_fields(
                    key[0], before[key], resource.inputs, replaced, options.replace_on_changes, options.ignore_changes
                )
                if fields:
                    changes[key] = Change(key[0], key[1], "replace", tuple(fields))
        grown = {name for (_, name) in changes} - replaced
        if not grown:
            break
        replaced |= grown
    for key, resource in now.items():  # not replaced: only RECREATES_NODES's fields can still say something
        if key in before and key not in changes and key[0] in RECREATES_NODES:
            fields = forcing_fields(key[0], before[key], resource.inputs, replaced, RECREATES_NODES[key[0]])
            if fields:
                changes[key] = Change(key[0], key[1], "recreate nodes", tuple(fields))
    declared_grants = [(r.type, r.inputs) for r in declared if FORCE_NEW.get(r.type) == EVERY_FIELD]
    deleted = [
        Change(
            type_,
            name,
            "forget"
            if (type_, name) in retained
            else "strip"
            if (type_, before[(type_, name)]) in declared_grants
            else "delete",
        )
        for (type_, name) in before
        if (type_, name) not in now
    ]
    return sorted(changes.values(), key=lambda c: (c.type, c.name)) + deleted

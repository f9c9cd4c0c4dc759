"""A stateful double of what a stack's life touches: Pulumi's engine (its state, aliases, retainOnDelete, a
replacement, destroy, `state delete`) and the cloud under it (Compute Engine's VMs and disks, IAM bindings, a
flex-start request's wait, a preemption), for tests/unit/test_lifecycle.py. Each behaviour is written from its
source, not from what tpu-grpo expects:

- Which change makes a resource new: the provider's force-new fields, read by tests/doubles/provider.py from
  terraform-provider-google's own Go schemas at e03b762 (not tpu-grpo's table, infra/replacements.py's FORCE_NEW,
  which the lifecycle checks against this), and its CustomizeDiff rules
  (resource_compute_disk.go: `customdiff.ForceNewIfChange("size", IsDiskShrinkage)`; resource_compute_subnetwork.go:
  `ForceNewIfChange("ip_cidr_range", IsShrinkageIpCidr)`) and the program's own `replace_on_changes`.
- Pulumi's engine (pkg/resource/deploy/step_generator.go): a state resource whose name is an alias of a declared one
  is that resource; a replacement of a resource the program names (every one here: a name cannot be held twice)
  deletes the old one before it makes the new one; a resource no longer declared is deleted after the rest; one
  marked retainOnDelete is only dropped from the state, replaced or deleted (Pulumi's "Resource option:
  retainOnDelete": "when deleting or replacing the resource during pulumi up or pulumi destroy"); `destroy` deletes
  the rest; `pulumi state delete` drops a resource from the state and touches nothing in the cloud
  (pkg/cmd/pulumi/state/state_delete.go); `refresh` drops what the cloud no longer has.
- An IAM member (tpgiamresource/resource_iam_member.go): creating one adds the member to the role's binding, deleting
  one removes it from the binding (subtractFromBindings), whoever else holds the same.
- An instance's creation (resource_compute_instance.go): 20 minutes by default (`schema.DefaultTimeout(20 *
  time.Minute)`) or the resource's custom create timeout; when the operation outlasts it, the provider clears the id
  (`d.SetId("")`) and Compute Engine goes on: the VM comes, billed, outside the state. An insert of a name that
  exists fails (the Compute API's 409 alreadyExists).
- A disk deleted takes what it holds; a VM's attached data disk is not auto-deleted (tpu-grpo attaches it so). A
  snapshot holds what its source disk held when it was made; a disk made from a snapshot (its `snapshot` input, a
  reference to the snapshot resource) holds what the snapshot holds (Compute Engine's "Create a disk from a
  snapshot").
- Protect (pkg/resource/deploy/step_generator.go, step.go): a replacement of a resource protected in the state and
  in the program is refused ("unable to replace resource %q\nas it is currently marked for protection"), and so is a
  delete of one protected in the state, an update's or a destroy's (DeleteStep: "unable to delete resource %q"); the
  steps before it are done, none after. `state unprotect`/`state protect` clear and set the bit.
- A resource's URN holds its parent's type (pkg/resource/urn.go): declared under another component, it is another
  resource, which the engine creates (a 409: the name is taken) before it deletes the old URN, unless an alias names
  the old parent (Pulumi's "Resource option: aliases").
- An interrupted update (pkg/cmd/pulumi/operations' cancellationScope; pulumi/pulumi#8435): a create already sent
  finishes in the cloud and stays in the state as a pending operation, which `refresh --import-pending-creates`
  settles. An insert of a name that exists outside the state fails with a 409, whatever the resource. A create the
  cloud refuses (a quota) stops the update where it is, a replaced resource's old one already deleted (the bridge
  deletes a named resource before it makes its replacement: nameRequiresDeleteBeforeReplace), and with it, first,
  what takes its outputs and would be replaced with it (step_generator.go's calculateDependentReplacements).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from infra import replacements
from tests.doubles import provider

INSTANCE, DISK = replacements.INSTANCE, replacements.DISK
IAM_TYPES = (
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    replacements.PROJECT_IAM_MEMBER,
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember",
)
DEFAULT_CREATE_TIMEOUT = "20m"
PROTECTED = "as it is currently marked for protection"


def _customize_diff_forces_new(type_: str, old: dict, new: dict) -> bool:
    """The provider's conditional force-new rules (the module's docstring), on their own."""
    if type_ == DISK and old.get("size") is not None and new.get("size") is not None:
        return int(new["size"]) < int(old["size"])
    if type_ == "gcp:compute/subnetwork:Subnetwork" and old.get("ipCidrRange") != new.get("ipCidrRange"):
        before, after = ipaddress.ip_network(old["ipCidrRange"]), ipaddress.ip_network(new["ipCidrRange"])
        return not (before[0] in after and before[-1] in after)
    return False


def takes_output_of(inputs: dict, type_: str, name: str, other_inputs: dict) -> bool:
    """Whether inputs take an output of the resource `type_` `name` (its id or self link in the offline run, or a
    bucket's name, which infra/common.py passes to its grants as `bucket.name`): the dependency the engine records."""
    text = str(inputs)
    named = type_ == replacements.BUCKET and inputs.get("bucket") == other_inputs.get("name")
    return f"(id of {name})" in text or f"(self link of {name})" in text or named


def _minutes(timeout: str) -> int:
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?", timeout)
    assert match and timeout, timeout
    return int(match[1] or 0) * 60 + int(match[2] or 0)


@dataclass
class Cloud:
    """What exists in the project, whoever made it: resources by (type, name), IAM bindings, what each disk holds."""

    resources: set[tuple[str, str]] = field(default_factory=set)
    bindings: set[tuple[str, str, str]] = field(default_factory=set)  # (where, role, member)
    disks: dict[str, set[str]] = field(default_factory=dict)  # a disk's name -> the runs saved on it
    stopped: set[str] = field(default_factory=set)  # VMs powered off (an idle stop)
    snapshots: dict[str, set[str]] = field(default_factory=dict)  # a snapshot resource's name -> the runs it holds
    stockouts: set[tuple[str, str]] = field(default_factory=set)  # (zone, capacity) where Google has no chips now

    @staticmethod
    def place_of(inputs: dict) -> tuple[str, str]:
        """A VM's (zone, capacity), from its scheduling as the provider sends it."""
        if (inputs.get("reservationAffinity") or {}).get("type") == "SPECIFIC_RESERVATION":
            return inputs["zone"], "reservation"
        model = (inputs.get("scheduling") or {}).get("provisioningModel", "STANDARD")
        return inputs["zone"], {"SPOT": "spot", "FLEX_START": "flex-start"}.get(model, "on-demand")

    @staticmethod
    def binding(resource_type: str, inputs: dict) -> tuple[str, str, str]:
        where = inputs.get("bucket") or inputs.get("repository") or inputs.get("project") or ""
        return (f"{resource_type.split('/')[0]}:{where}", inputs["role"], inputs["member"])

    def create(self, type_: str, name: str, inputs: dict) -> None:
        self.resources.add((type_, name))
        if type_ in IAM_TYPES:
            self.bindings.add(self.binding(type_, inputs))
        if type_ == replacements.SNAPSHOT:
            self.snapshots[name] = set(self.disks.get(inputs.get("sourceDisk", ""), set()))
        if type_ == DISK:
            source = replacements.REFERENCE.fullmatch(str(inputs.get("snapshot") or ""))
            self.disks[inputs.get("name", name)] = set(self.snapshots.get(source["name"], set()) if source else ())

    def delete(self, type_: str, name: str, inputs: dict) -> None:
        self.resources.discard((type_, name))
        if type_ in IAM_TYPES:
            self.bindings.discard(self.binding(type_, inputs))  # subtractFromBindings: whoever else holds it
        if type_ == DISK:
            self.disks.pop(inputs.get("name", name), None)
        if type_ == replacements.SNAPSHOT:
            self.snapshots.pop(name, None)
        if type_ == INSTANCE:
            self.stopped.discard(inputs.get("name", name))


@dataclass
class Entry:
    """One resource of Pulumi's state."""

    type: str
    name: str
    inputs: dict[str, Any]
    retain: bool = False
    protect: bool = False
    parent: str = "tpu-grpo:index:TpuHost"  # the component's type, part of the URN

    def export(self, stack: str = "dev") -> dict:
        """As `pulumi stack export` prints it (the part tpu-grpo reads)."""
        return {
            "urn": f"urn:pulumi:{stack}::tpu-grpo::{self.parent}${self.type}::{self.name}",
            "type": self.type,
            "custom": True,
            "inputs": self.inputs,
            **({"retainOnDelete": True} if self.retain else {}),
            **({"protect": True} if self.protect else {}),
        }


@dataclass
class Operations:
    """What one `pulumi up` did."""

    replaced: set[tuple[str, str]] = field(default_factory=set)
    deleted: set[tuple[str, str]] = field(default_factory=set)
    forgotten: set[tuple[str, str]] = field(default_factory=set)
    error: str = ""


@dataclass
class Engine:
    """Pulumi's engine over a Cloud: the stack's state, `up`, `refresh`, `state delete` and `destroy`."""

    cloud: Cloud
    state: dict[tuple[str, str], Entry] = field(default_factory=dict)
    pending: dict[tuple[str, str], Entry] = field(default_factory=dict)  # creates an interrupt left pending

    def export(self) -> list[dict]:
        return [entry.export() for entry in self.state.values()]

    def refresh(self) -> None:
        """Drop from the state what the cloud no longer has (a VM deleted at preemption)."""
        for key in [key for key in self.state if key not in self.cloud.resources]:
            del self.state[key]

    def _forces_new(self, resource, old: Entry, replaced: set[str]) -> bool:
        if _customize_diff_forces_new(resource.type, old.inputs, resource.inputs):
            return True
        if resource.type == INSTANCE and resource.inputs.get("name") in self.cloud.stopped:
            return True  # `invoke up` asks for its replacement (`--replace`): a TPU VM is never started again
        options = resource.options
        return provider.forces_new(
            resource.type, old.inputs, resource.inputs, replaced, options.replace_on_changes, options.ignore_changes
        )

    def up(self, declared: list, flex_wait_minutes: int = 0, fault: str | None = None) -> Operations:
        """Bring the cloud to what is declared; a create that outlasts its timeout leaves its VM outside the state.
        `fault`: "interrupt" (Ctrl-C while the VM's create is sent: the cloud makes it, the state keeps it pending, the
        update stops), or a resource type whose create the cloud refuses (a quota) once: the update stops there, what
        it did before done (the old resource of a replacement deleted first)."""
        done = Operations()
        component = next(r.type for r in declared if r.type.startswith("tpu-grpo:"))
        for resource in declared:  # a URN holds its parent's type: another parent is another resource, unless aliased
            old = self.state.get((resource.type, resource.name))
            if old is None or old.parent == component or resource.type.startswith("tpu-grpo:"):
                continue
            if any(urn.split("::")[2] == old.parent for urn in resource.options.alias_parents):
                old.parent = component
            else:  # the engine makes it anew before it deletes the old URN: the name is taken
                name = resource.inputs.get("name", resource.name)
                done.error = f"googleapi: Error 409: The resource '{name}' already exists, alreadyExists"
                return done
        for resource in declared:  # aliases first: the same resource under its new name
            for alias in resource.options.aliases:
                old = self.state.pop((resource.type, alias), None)
                if old and (resource.type, resource.name) not in self.state:
                    self.cloud.resources.discard((old.type, old.name))
                    self.cloud.resources.add((resource.type, resource.name))
                    self.state[(resource.type, resource.name)] = Entry(
                        resource.type, resource.name, old.inputs, old.retain, old.protect, component
                    )
        made = {name for (_, name) in ((r.type, r.name) for r in declared) if (_, name) not in self.state}
        pending = [r for r in declared if not r.type.startswith("tpu-grpo:")]
        for resource in pending:
            key = (resource.type, resource.name)
            old = self.state.get(key)
            options = resource.options
            if old is not None and not self._forces_new(resource, old, made):
                inputs = provider.unset_kept(resource.type, old.inputs, resource.inputs)
                inputs = {**inputs, **{k: old.inputs[k] for k in options.ignore_changes if k in old.inputs}}
                self.state[key] = Entry(
                    resource.type, resource.name, inputs, options.retain_on_delete, options.protect, component
                )
                continue
            if old is not None and old.protect and options.protect:
                done.error = f'unable to replace resource "{old.export()["urn"]}"\n{PROTECTED}'
                return done
            if old is not None:
                made.add(resource.name)
            if old is None and key in self.cloud.resources:  # the Compute API's (and Cloud Storage's) 409
                name = resource.inputs.get("name", resource.name)
                done.error = f"googleapi: Error 409: The resource '{name}' already exists, alreadyExists"
                return done
            if resource.type == INSTANCE:
                timeout = resource.options.create_timeout or DEFAULT_CREATE_TIMEOUT
                waits = (
                    flex_wait_minutes if resource.inputs["scheduling"].get("provisioningModel") == "FLEX_START" else 0
                )
                if old is not None:
                    self.cloud.delete(old.type, old.name, old.inputs)  # the name is taken: delete, then create
                    del self.state[key]
                    done.replaced.add(key)
                if Cloud.place_of(resource.inputs) in self.cloud.stockouts:  # the old VM went first: the name
                    done.error = (  # Compute Engine's "Troubleshoot resource availability errors"
                        f"creating Instance: googleapi: Error 503: The zone '{resource.inputs['zone']}' does not have "
                        "enough resources available to fulfill the request., ZONE_RESOURCE_POOL_EXHAUSTED"
                    )
                    return done
                if waits > _minutes(timeout):
                    self.cloud.create(resource.type, resource.name, resource.inputs)  # outside the state, billed
                    done.error = f"timeout while waiting for state to become 'DONE' (timeout: {timeout})"
                    return done
                if fault == "interrupt":  # the create was sent: Compute Engine makes it, the state keeps it pending
                    self.cloud.create(resource.type, resource.name, resource.inputs)
                    self.pending[key] = Entry(resource.type, resource.name, resource.inputs, parent=component)
                    done.error = "update canceled"
                    return done
            elif old is not None:
                self._delete_dependents_first(old, declared, made, done)
                if done.error:
                    return done
                done.replaced.add(key)
                if not old.retain:  # a retained resource is only dropped from the state, replaced or deleted
                    self.cloud.delete(old.type, old.name, old.inputs)
                del self.state[key]
            if fault == resource.type:
                done.error = f"googleapi: Error 403: Quota exceeded for {resource.type.rsplit(':', 1)[-1]}"
                return done
            self.cloud.create(resource.type, resource.name, resource.inputs)
            self.state[key] = Entry(
                resource.type, resource.name, resource.inputs, options.retain_on_delete, options.protect, component
            )
        wanted = {(r.type, r.name) for r in declared}
        for key in [key for key in self.state if key not in wanted]:
            if self.state[key].protect:
                done.error = f'unable to delete resource "{self.state[key].export()["urn"]}"\n{PROTECTED}'
                return done
            entry = self.state.pop(key)
            if entry.retain:
                done.forgotten.add(key)
            else:
                self.cloud.delete(entry.type, entry.name, entry.inputs)
                if not entry.type.startswith("pulumi:"):  # a provider is the engine's, no cloud resource
                    done.deleted.add(key)
        return done

    def _delete_dependents_first(self, replaced: Entry, declared: list, made: set[str], done: Operations) -> None:
        """Delete-before-replace (pkg/resource/deploy/step_generator.go, calculateDependentReplacements): the
        resources that take an output of the one replaced, and that its replacement replaces too, are deleted before
        it; the update makes them anew after it, in the program's order."""
        new = {(r.type, r.name): r for r in declared}
        for key, entry in list(self.state.items()):
            resource = new.get(key)
            uses = takes_output_of(entry.inputs, replaced.type, replaced.name, replaced.inputs)
            if entry is replaced or resource is None or not uses:
                continue
            if self._forces_new(resource, entry, made | {replaced.name}):
                if entry.protect and resource.options.protect:  # a replacement like any other: refused
                    done.error = f'unable to replace resource "{entry.export()["urn"]}"\n{PROTECTED}'
                    return
                self.cloud.delete(entry.type, entry.name, entry.inputs)
                del self.state[key]
                done.replaced.add(key)

    def export_with_pending(self) -> dict:
        """`pulumi stack export`, with the creates an interrupted update left pending (`pending_operations`)."""
        pending = [{"resource": entry.export(), "type": "creating"} for entry in self.pending.values()]
        return {"deployment": {"resources": self.export(), "pending_operations": pending}}

    def import_pending(self, urn: str) -> None:
        """`pulumi refresh --import-pending-creates URN ID`: kept where the cloud made it, dropped where not."""
        key = next(key for key, entry in self.pending.items() if entry.export()["urn"] == urn)
        entry = self.pending.pop(key)
        if key in self.cloud.resources:
            self.state[key] = entry

    def state_delete(self, urn: str) -> None:
        key = next(key for key, entry in self.state.items() if entry.export()["urn"] == urn)
        del self.state[key]

    def set_protect(self, urn: str, protect: bool) -> None:
        """`pulumi state protect|unprotect URN`."""
        next(entry for entry in self.state.values() if entry.export()["urn"] == urn).protect = protect

    def destroy(self) -> str:
        """Delete what the state holds; "" or the engine's refusal, nothing deleted, while any is protected."""
        guarded = next((entry for entry in self.state.values() if entry.protect), None)
        if guarded:
            return f'unable to delete resource "{guarded.export()["urn"]}"\n{PROTECTED}'
        for entry in list(self.state.values()):
            if not entry.retain:
                self.cloud.delete(entry.type, entry.name, entry.inputs)
        self.state.clear()
        return ""

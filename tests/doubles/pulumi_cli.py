"""A Pulumi CLI double (the `pulumi` script beside this file) and what it answers: the stack's outputs, its
state after a refresh (the resources an update made, with their inputs, and the VM's status as Compute Engine
reports it), the engine events and exit code of `up`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.doubles.cloud import takes_output_of
from tests.support import BIN, DOUBLES

INSTANCE = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:compute/instance:Instance::tpu-grpo"


def state_of(raw: dict, stack: str, status: str = "RUNNING") -> dict:
    """The state `pulumi stack export` prints after an update of the program on these stack values: each resource
    with its URN, type, the inputs the engine recorded and (the VM) its status."""
    from infra import offline

    _, resources, _ = offline.run(raw, stack)
    component = next(r.type for r in resources if r.type.startswith("tpu-grpo:"))  # TpuHost or TpuSlice

    def urn(r) -> str:
        return f"urn:pulumi:{stack}::tpu-grpo::{component}${r.type}::{r.name}"

    return {
        "deployment": {
            "resources": [
                {
                    "urn": urn(r),
                    "type": r.type,
                    "custom": True,
                    "inputs": r.inputs,
                    "dependencies": [
                        urn(other)
                        for other in resources
                        if other is not r
                        and not other.type.startswith("tpu-grpo:")
                        and takes_output_of(r.inputs, other.type, other.name, other.inputs)
                    ],
                    **({"retainOnDelete": True} if r.options.retain_on_delete else {}),
                    **({"protect": True} if r.options.protect else {}),
                    "outputs": {
                        **r.inputs,
                        **({"currentStatus": status} if r.type == "gcp:compute/instance:Instance" else {}),
                    },
                }
                for r in resources
                if not r.type.startswith("tpu-grpo:")
            ]
        }
    }


#: Google's refusals as Pulumi's engine reports them (the provider's "creating Instance: googleapi: Error N: ..."),
#: each message quoted from the source tpu_grpo/cloud/refusals.py cites for it.
REFUSALS = {
    # Compute Engine's "Troubleshoot resource availability errors" (cloud.google.com/compute/docs/resource-error)
    "stockout": "creating Instance: googleapi: Error 503: The zone 'projects/grpo-lab-123/zones/{zone}' does not have "
    "enough resources available to fulfill the request. Try a different zone, or try again later., "
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    # SkyPilot's _gcp_handler (sky/backends/cloud_vm_ray_backend.py): a regional quota's message
    "quota": "creating Instance: googleapi: Error 403: Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in region "
    "{region}., quotaExceeded",
    # SkyPilot's _gcp_handler: a permission refused everywhere
    "permission": "creating Instance: googleapi: Error 403: Required 'compute.instances.create' permission for "
    "'projects/grpo-lab-123', IAM_PERMISSION_DENIED",
    # SkyPilot's _gcp_handler: the TPU API's code 9 (its comments)
    "reservation": "creating Instance: googleapi: Error 400: Insufficient reserved capacity. Contact customer support "
    "to increase your reservation. [EID: 0x2f8bc266e74261a]",
    # GKE's "Troubleshoot node pools": a node pool's stockout
    "pool stockout": "error creating NodePool: googleapi: Error 400: Resource pool exhausted in zone {zone}: "
    "GCE_STOCKOUT",
}


#: An error no marker knows, from another resource of the same update, which the engine reports before the VM's
#: refusal: Google's 409 for an operation already in progress, as a Pulumi user's report quotes the provider's error
#: (the case Pulumi's troubleshooting guide calls "conflict"; its message is Compute Engine's operationInProgress).
ANOTHER_RESOURCES_ERROR = (
    "updating Subnetwork: googleapi: Error 409: Operation failed because another operation was already in "
    "progress., operationInProgress"
)


def engine_error(message: str) -> str:
    """One error diagnostic of Pulumi's engine event log (--event-log), as `up` writes it."""
    return json.dumps({"sequence": 1, "timestamp": 1, "diagnosticEvent": {"message": message, "severity": "error"}})


class PulumiCli:
    """One double's folder, and the environment that runs tasks against it."""

    def __init__(self, folder: Path, outputs: dict | None = None, status: str | None = "RUNNING"):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        if outputs is not None:
            self.set_outputs(outputs)
        self.set_status(status)
        (folder / "adc.json").write_text("{}")
        (folder / "home").mkdir(exist_ok=True)
        tools = folder / "bin"
        tools.mkdir(exist_ok=True)
        link = tools / "pulumi"
        if not link.exists():
            link.symlink_to(DOUBLES / "pulumi")

    def on_path(self) -> dict:
        """The double first on PATH (and its folder named), nothing else of the environment changed."""
        return {"PATH": f"{self.folder / 'bin'}:{BIN}:/usr/bin:/bin", "PULUMI_DOUBLE": str(self.folder)}

    def env(self) -> dict:
        """A laptop with the Pulumi CLI and Google credentials, and nothing else in its home."""
        return {
            "HOME": str(self.folder / "home"),
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.folder / "adc.json"),
            **self.on_path(),
        }

    def set_outputs(self, outputs: dict) -> None:
        (self.folder / "outputs.json").write_text(json.dumps(outputs))

    def set_status(self, status: str | None) -> None:
        """The VM as Compute Engine reports it after a refresh; None: deleted (gone from the state)."""
        resources = (
            []
            if status is None
            else [{"type": "gcp:compute/instance:Instance", "urn": INSTANCE, "outputs": {"currentStatus": status}}]
        )
        (self.folder / "state.json").write_text(json.dumps({"deployment": {"resources": resources}}))

    def deployed(self, raw: dict, stack: str = "dev") -> None:
        """The state an update of the program on these stack values left (what a later `up` is compared with)."""
        (self.folder / "state.json").write_text(json.dumps(state_of(raw, stack)))

    def up_fails(self, code: int, events: list[str]) -> None:
        """The next `up`s exit with `code` after writing these engine events (JSON lines) to its event log."""
        (self.folder / "up-exit").write_text(str(code))
        (self.folder / "events.jsonl").write_text("\n".join(events))

    def answer_at(self, zone: str, capacity: str, refusal: str, after: str | None = None) -> None:
        """From now on `up` at this place is refused with REFUSALS[refusal] (exit 255, the CLI's for a failed
        update), after the error `after` where given; every other place gets chips."""
        path = self.folder / "places.json"
        answers = json.loads(path.read_text()) if path.is_file() else {}
        message = REFUSALS[refusal].format(zone=zone, region=zone.rsplit("-", 1)[0])
        errors = [*([after] if after else []), message]
        answers[f"{zone} {capacity}"] = {"code": 255, "events": [engine_error(each) for each in errors]}
        path.write_text(json.dumps(answers))

    def gets_chips_anywhere(self) -> None:
        """`up` answers per place (answer_at): every place not refused gets chips."""
        path = self.folder / "places.json"
        if not path.is_file():
            path.write_text("{}")

    def hold_up(self) -> None:
        """From now on each `up` runs until `created` is called, as while Compute Engine makes the VM; the test is the
        cloud then, and gives the VM made anew its address (set_outputs): the double's own new address is not given."""
        (self.folder / "hold-up").touch()

    def created(self) -> None:
        (self.folder / "created").touch()

    def calls(self) -> list[str]:
        path = self.folder / "calls"
        return path.read_text().splitlines() if path.exists() else []

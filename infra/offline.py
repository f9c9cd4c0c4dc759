"""Run the Pulumi program in-process under Pulumi's mocks: no cloud account, no Pulumi CLI,
no network. The offline plan and the tests both use this to see every resource the
program declares, with the exact inputs `pulumi up` would send."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pulumi

from tpu_grpo.config.keys import DEFAULT_ACCOUNT, PROJECT
from tpu_grpo.config.settings import Settings

UNKNOWN = "(known after apply)"
DEFAULT_ACCOUNT_CALL = "gcp:compute/getDefaultServiceAccount:getDefaultServiceAccount"


@dataclass(frozen=True)
class Options:
    """The resource options the engine acts on beyond the inputs, as the program gives them (the mocks see no
    options: a stack transformation records them): what a change replaces, the names it was declared under before,
    whether `pulumi destroy` leaves it, how long its creation may take, whether the engine refuses to delete or
    replace it, the inputs whose changes it ignores, and the parents it was declared under before (URNs)."""

    replace_on_changes: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    retain_on_delete: bool = False
    create_timeout: str | None = None
    protect: bool = False
    ignore_changes: tuple[str, ...] = ()
    alias_parents: tuple[str, ...] = ()

    @classmethod
    def of(cls, opts: pulumi.ResourceOptions) -> Options:
        timeouts = opts.custom_timeouts
        aliases = [alias for alias in opts.aliases or () if isinstance(alias, pulumi.Alias)]
        return cls(
            tuple(opts.replace_on_changes or ()),
            tuple(alias.name for alias in aliases if isinstance(alias.name, str)),
            bool(opts.retain_on_delete),
            timeouts.create if timeouts else None,
            bool(opts.protect),
            tuple(opts.ignore_changes or ()),
            tuple(alias.parent for alias in aliases if isinstance(alias.parent, str)),
        )


@dataclass
class DeclaredResource:
    type: str
    name: str
    inputs: dict[str, Any]
    options: Options = Options()


class RecordingMocks(pulumi.runtime.Mocks):
    """Records each declared resource, with its options; answers with its inputs plus the computed outputs: its id
    and self link stand for the resource (`(id of NAME)`, `(self link of NAME)`), so that what refers to it changes
    exactly when it is made anew (infra/replacements.py's REFERENCE)."""

    def __init__(self, computed: dict[str, Any] | None = None):
        self.resources: list[DeclaredResource] = []
        self.computed = computed or {}
        self.options: dict[tuple[str, str], Options] = {}

    def record_options(self, args: pulumi.ResourceTransformationArgs) -> None:
        self.options[(args.type_, args.name)] = Options.of(args.opts)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        options = self.options.get((args.typ, args.name), Options())
        self.resources.append(DeclaredResource(args.typ, args.name, dict(args.inputs), options))
        state = {**args.inputs, "selfLink": f"(self link of {args.name})"}
        if args.typ == "gcp:compute/instance:Instance":
            interfaces = [dict(i) for i in state.get("networkInterfaces", [])]
            interfaces[0]["networkIp"] = self.computed.get("internal_ip", UNKNOWN)
            interfaces[0]["accessConfigs"] = [{"natIp": self.computed.get("external_ip", UNKNOWN)}]
            state["networkInterfaces"] = interfaces
            state["currentStatus"] = self.computed.get("status", UNKNOWN)
        if args.typ == "gcp:container/cluster:Cluster":
            state["endpoint"] = self.computed.get("endpoint", UNKNOWN)
            state["masterAuth"] = {"clusterCaCertificate": self.computed.get("cluster_ca_certificate", UNKNOWN)}
        return f"(id of {args.name})", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        """The one data source the program reads: the project's default compute account, as the Compute API's
        project resource names it (`defaultServiceAccount`, PROJECT_NUMBER-compute@developer.gserviceaccount.com;
        terraform-provider-google's data_source_google_compute_default_service_account.go returns its email)."""
        if args.token == DEFAULT_ACCOUNT_CALL:
            email = self.computed.get("default_account", DEFAULT_ACCOUNT)
            return {
                "email": email,
                "member": f"serviceAccount:{email}",
                "project": args.args.get("project"),
                "name": f"projects/{args.args.get('project')}/serviceAccounts/{email}",
                "uniqueId": "0",
                "displayName": "Compute Engine default service account",
            }
        raise NotImplementedError(f"the program calls {args.token}, which the offline run cannot answer")


def config_for_pulumi(raw: dict[str, Any]) -> dict[str, str]:
    """Stack-file values as the Pulumi engine hands them to a program: strings, objects as JSON."""
    return {
        name: value if isinstance(value, str) else json.dumps(value) for name, value in raw.items() if value is not None
    }


class _OptionsRecorder:
    """The process's one stack transformation: it records into the mocks of the run going on. Pulumi keeps stack
    transformations on the root stack resource, which lives from one mocked run to the next, so a transformation
    registered per run would pile up (each resource passed through every earlier run's)."""

    def __init__(self) -> None:
        self.root: pulumi.Resource | None = None  # the root it is registered on
        self.mocks: RecordingMocks | None = None

    def __call__(self, args: pulumi.ResourceTransformationArgs) -> None:
        if self.mocks is not None:
            self.mocks.record_options(args)

    def register(self) -> None:
        root = pulumi.runtime.get_root_resource()
        if root is not self.root:
            pulumi.runtime.register_stack_transformation(self)
            self.root = root


_RECORDER = _OptionsRecorder()


def run(
    raw_config: dict[str, Any],
    stack: str,
    *,
    lenient: bool = False,
    mocks: RecordingMocks | None = None,
    at: Settings | None = None,
) -> tuple[Settings, list[DeclaredResource], dict[str, Any]]:
    """Run the program on these stack values; return its settings, resources and outputs. `at`: the settings
    already parsed from them (a search's place), which the program then declares without parsing them again.

    A bad setting raises SettingsError before any resource is declared.
    """
    from infra.program import declare, read_settings  # imports pulumi_gcp: seconds

    mocks = mocks or RecordingMocks()
    loop = asyncio.new_event_loop()  # Pulumi's runtime runs the program on the current loop, which nothing closes:
    asyncio.set_event_loop(loop)  # collected at exit after its sockets, it printed "Exception ignored ... -1"
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False)
    pulumi.runtime.set_all_config(config_for_pulumi(raw_config))
    result: dict[str, Any] = {}

    @pulumi.runtime.test
    def program():
        result["settings"] = settings = at or read_settings(lenient=lenient, configured=raw_config)
        _RECORDER.register()
        outputs = declare(settings)
        return pulumi.Output.all(**outputs).apply(result.setdefault("outputs", {}).update)

    _RECORDER.mocks = mocks
    try:
        program()
    finally:
        _RECORDER.mocks = None
        loop.close()
        asyncio.set_event_loop(None)
    return result["settings"], mocks.resources, result["outputs"]

"""Every stack setting as a key: its name, type, meaning and example (for docs and errors), and its rule (a range,
a choice, a form), which `settings.parse` checks each value against. Each is declared once, as a field of
StackValues that carries its key: adding a setting is that field and the code that reads it."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from tpu_grpo.catalog.accelerators import MACHINES, MAX_SLICES, ONE_VM, SLICES
from tpu_grpo.catalog.capacity import CAPACITIES, MAX_RUN_HOURS
from tpu_grpo.catalog.capacity import DEFAULT as DEFAULT_CAPACITY
from tpu_grpo.catalog.models import DEFAULT_DATASET, DEFAULT_DATASET_CONFIG, DEFAULT_MODEL, LOSS_ALGOS, MODELS
from tpu_grpo.catalog.stores import (
    BUCKET_URL,
    CHECKPOINT_PERIOD,
    CHECKPOINTS_TO_KEEP,
    INCLUDED_IOPS,
    INCLUDED_THROUGHPUT_MIBPS,
    STORES,
)
from tpu_grpo.config.values import Parser, Refused, bucket, hub_id, name, whole

PROJECT = "tpu-grpo"
#: The project's default compute account (the VM's and the nodes' without tpu-grpo:serviceAccount) as Google names
#: it, the project number unknown here.
DEFAULT_ACCOUNT = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"
MIN_BOOT_DISK_GB = 200  # the tutorial's --boot-disk-size
MIN_DATA_DISK_GB = 100  # one GRPO checkpoint of an 8B model with optimizer state is tens of GB
#: Compute Engine's largest Hyperdisk Balanced and persistent disk volume: 64 TiB.
MAX_DISK_GB = 65_536
#: The most GRPO batches (or a checkpoint step) a run takes: GSM8K's 7,473 training questions many times over.
MAX_BATCHES = 100_000
#: The most training steps between checkpoints: a run's steps are at most its batches times rl.num_iterations.
MAX_STEPS = 10**9
#: Hyperdisk Balanced's provisioned performance: at most 160,000 IOPS and 2,400 MiB/s per volume, and at least what
#: it includes at no charge (Compute Engine's "About Hyperdisk Balanced").
DATA_DISK_IOPS = (INCLUDED_IOPS, 160_000)
DATA_DISK_THROUGHPUT_MIBPS = (INCLUDED_THROUGHPUT_MIBPS, 2400)
#: The key types of an OpenSSH public key file.
PUBLIC_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
# Matched whole (fullmatch): a trailing space or newline is not part of a valid value.
_GCE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PROJECT_ID = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
#: A zone: REGION-LETTER, or an AI zone's REGION-aiNLETTER (us-south1-ai1b: SkyPilot's sky/clouds/gcp.py).
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-([a-z]|ai[0-9][a-z])")
#: A reservation of this project (NAME) or another project's shared one (projects/PROJECT/reservations/NAME).
_RESERVATION = re.compile(r"(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
#: A Compute Engine label's key and value (lowercase letters, digits, '_', '-'; at most 63).
_GCE_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_GCE_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
#: A service account email as IAM names them: NAME@PROJECT.iam.gserviceaccount.com, or Google-managed ones
#: (PROJECT_NUMBER-compute@developer.gserviceaccount.com): no character a shell or a flag would read.
_SERVICE_ACCOUNT = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}@[a-z0-9][a-z0-9.-]{0,99}\.gserviceaccount\.com")
PLACEHOLDER = re.compile(r"YOUR_", re.IGNORECASE)


@dataclass(frozen=True)
class Key:
    """One stack setting: its config key, its type and what it means (for docs and errors)."""

    name: str
    help: str
    example: str
    #: A stack must set it (else: it has a default, or the rules between keys fill it, or it may stay unset).
    required: bool = False
    #: What an unset key comes to when it has an obvious value: the tutorial's (a new stack names only what is the
    #: user's own: project, zone, how the chips are had, the SSH key and who may reach it).
    default: str | None = None
    #: Only the one VM reads it; a multi-host slice (GKE) neither needs nor checks it.
    vm_only: bool = False
    #: The value as the Pulumi CLI hands it over (text; lists and mappings as YAML or JSON) -> the setting's value,
    #: or Refused with what is wrong: its kind, its range, its choices, its form (values.py's parsers). None: the
    #: kind's own parser.
    rule: Parser | None = None
    #: What `invoke settings` shows for the key unset, and whence (the Settings -> (value, whence), or None), where
    #: another setting's row or MaxText decides it. None: the value parsed, the tutorial's where it has a default.
    unset: Callable[[Any], tuple[Any, str] | None] | None = None
    #: The MaxText keys it decides, which `--set` then refuses (two values of one key would disagree).
    maxtext: tuple[str, ...] = ()
    #: The fields of each of its entries (a place's), which its rule checks one by one, each refusal naming the
    #: entry's path, and which the fuzzer gives hostile values.
    entries: tuple[str, ...] = ()
    field: str = ""  # its field of Settings: `zone`, `boot_disk_gb` (from StackValues)
    kind: type = str  # the kind of value, from its field's type (from StackValues)

    def __post_init__(self) -> None:
        assert not (self.required and self.default is not None), f"{self.name}: required, or a default, not both"

    def parse(self, value: Any) -> Any:
        return (self.rule or KINDS[self.kind])(value)

    @property
    def namespace(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def short(self) -> str:
        """The name without its namespace: `zone`, `bootDiskGb`."""
        return self.name.split(":", 1)[1]

    def set_command(self, value: str | None = None) -> str:
        value = shlex.quote(value) if value else self.example
        if self.kind is list:
            return f"pulumi config set --path '{self.name}[0]' {value}"
        if self.kind is dict:
            label, text = value.split("=", 1)
            return f"pulumi config set --path '{self.name}.{label}' {text}"
        return f"pulumi config set {self.name} {value}"


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise Refused("is not text")
    return value


def _boolean(value: Any) -> bool:
    """`true` or `false`, as Pulumi writes them (YAML's other spellings are text to the Pulumi CLI)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise Refused("is not true or false")


def _json_or(value: Any, kind: type, split: Callable[[str], Any]) -> Any:
    """A list or mapping as YAML gives it, or as the Pulumi CLI passes it (JSON), or `a,b` / `k=v,k=v` text."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith(("[", "{")) else split(text)
        except json.JSONDecodeError:
            raise Refused(f"is not {'a list' if kind is list else 'a mapping'}") from None
    if not isinstance(value, kind):
        raise Refused(f"is not {'a list' if kind is list else 'a mapping'}")
    return value


def _list(value: Any) -> list:
    return _json_or(value, list, lambda text: [part.strip() for part in text.split(",") if part.strip()])


def _mapping(value: Any) -> dict:
    return _json_or(value, dict, lambda text: dict(part.split("=", 1) for part in text.split(",") if "=" in part))


KINDS: dict[type, Parser] = {str: _text, int: whole(-(2**63), 2**63 - 1), bool: _boolean, list: _list, dict: _mapping}


def _one_of(choices, problem: str) -> Parser:
    def parse(value: Any) -> str:
        if _text(value) not in choices:
            raise Refused(problem)
        return value

    return parse


def _form(pattern: re.Pattern, problem: str) -> Parser:
    def parse(value: Any) -> str:
        if not pattern.fullmatch(_text(value)):
            raise Refused(problem)
        return value

    return parse


def _text_by(parser: Parser) -> Parser:
    return lambda value: parser(_text(value))


def _store(value: Any) -> str:
    if _text(value) in STORES:
        return value
    found = BUCKET_URL.fullmatch(value)
    if not found:
        if isinstance(value, str) and value.startswith("gs://"):  # say why the name is no bucket's (upper case, ...)
            meant = value.lower() if BUCKET_URL.fullmatch(value.lower()) else "gs://YOUR_BUCKET/runs"
            try:
                bucket(value.removeprefix("gs://").split("/")[0])
            except Refused as problem:
                fix = f"pulumi config set {PROJECT}:checkpointStore {shlex.quote(meant)}"
                raise Refused(str(problem), fix) from None
        raise Refused("is not a checkpoint store (" + ", ".join(STORES) + ", or gs://BUCKET[/PREFIX])")
    bucket(found["bucket"])
    if any(part in (".", "..") for part in found["prefix"].split("/")[1:]):
        raise Refused("holds a `.` or `..` folder, which names another folder than it says")
    return value


def _ranges(value: Any) -> list:
    ranges = _list(value)
    if not ranges:
        raise Refused("is empty: nobody could reach port 22")
    for cidr in ranges:
        try:
            ipaddress.ip_network(str(cidr), strict=True)
        except ValueError as error:
            raise Refused(f"holds {cidr!r}, not a CIDR range ({error})") from None
    return ranges


@dataclass(frozen=True)
class Place:
    """Where and how the chips may be had: a zone and a capacity (None in a fallback entry: the stack's own), and,
    in the place `invoke up` records (`tpu-grpo:placed`), the zone whose data disk was copied here (a snapshot)."""

    zone: str
    capacity: str | None = None
    moved_from: str | None = None

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def same(self, other: Place) -> bool:
        """The same zone and capacity, wherever either's disk came from."""
        return (self.zone, self.capacity) == (other.zone, other.capacity)

    def __str__(self) -> str:
        return f"{self.capacity} in {self.zone}"

    def to_json(self) -> dict:
        return {
            "zone": self.zone,
            "capacity": self.capacity,
            **({"movedFrom": self.moved_from} if self.moved_from else {}),
        }


#: The fields of a place: a fallback entry's, and (with movedFrom) the recorded place's.
FALLBACK_FIELDS = ("capacity", "zone")
PLACED_FIELDS = (*FALLBACK_FIELDS, "movedFrom")


def _place_entry(value: Any, fields: set[str], where: str | None = None) -> Place:
    """A place as a stack file writes it: a mapping of zone and, optionally, capacity (and, in `placed`, movedFrom);
    or a zone alone, at the stack's capacity. `where`: the entry's --path (`tpu-grpo:fallback[2]`), which a fix of
    one of its parts names."""

    def fix(part: str, example: str) -> str | None:
        return f"pulumi config set --path '{where}.{part}' {example}" if where else None

    def at(part: str) -> tuple[str, Any] | None:
        return (f"{where}.{part}", entry[part]) if where else None

    is_zone = isinstance(value, str) and not value.strip().startswith("{") and "=" not in value
    entry = {"zone": value.strip()} if is_zone else _mapping(value)
    unknown = sorted(str(name) for name in entry if name not in fields)
    if unknown:
        removed = f"pulumi config rm --path '{where}.{unknown[0]}'" if where else None
        raise Refused(f"holds {unknown[0]!r}, which a place does not take (" + ", ".join(sorted(fields)) + ")", removed)
    if "zone" not in entry:
        raise Refused(f"holds {entry!r}, a place without its zone", fix("zone", "us-east5-a"))
    for part in ("zone", "movedFrom"):
        if part in entry and not (isinstance(entry[part], str) and _ZONE.fullmatch(entry[part])):
            raise Refused("is not a zone of the form region-letter (us-east5-b)", fix(part, "us-east5-a"), at(part))
    if "capacity" in entry and (not isinstance(entry["capacity"], str) or entry["capacity"] not in CAPACITIES):
        raise Refused("is not one of " + ", ".join(CAPACITIES), fix("capacity", "spot"), at("capacity"))
    return Place(str(entry["zone"]), entry.get("capacity"), entry.get("movedFrom"))


def _places(value: Any) -> tuple[Place, ...]:
    places = tuple(
        _place_entry(entry, set(FALLBACK_FIELDS), f"{PROJECT}:fallback[{number}]")
        for number, entry in enumerate(_list(value))
    )
    if not places:
        raise Refused("is empty: leave it unset to try gcp:zone alone")
    return places


def _placed(value: Any) -> Place:
    place = _place_entry(value, set(PLACED_FIELDS), f"{PROJECT}:placed")
    if place.capacity is None:
        raise Refused(f"holds {value!r}, a place without its capacity")
    return place


#: The labels the project puts on every resource itself (infra/common.py): a stack's own may not replace them.
OWN_LABELS = ("app", "stack")


#: Compute Engine's most labels on a resource ("Labels": up to 64), the project's own included.
MAX_LABELS = 64


def _labels(value: Any) -> dict:
    labels = _mapping(value)
    if len(labels) + len(OWN_LABELS) > MAX_LABELS:
        raise Refused(
            f"holds {len(labels)} labels; with tpu-grpo's own {len(OWN_LABELS)} a resource takes at most {MAX_LABELS}"
        )
    for label, text in labels.items():
        if not (_GCE_LABEL_KEY.fullmatch(str(label)) and _GCE_LABEL_VALUE.fullmatch(str(text))):
            raise Refused(f"holds {label}={text}, not a label (lowercase letters, digits, '_', '-'; at most 63)")
        if label in OWN_LABELS:
            raise Refused(f"holds {label}={text}, and tpu-grpo labels every resource {label}= itself")
    return labels


_GCE_NAMED = _form(_GCE_NAME, "is not a Compute Engine name (lowercase letters, digits, '-'; at most 63)")
_HUB_ID = _text_by(hub_id)


def _capacities(where) -> str:
    """The capacities whose row says `where`, as the settings' help names them."""
    return ", ".join(capacity for capacity, row in CAPACITIES.items() if where(row))


def setting(name: str, help: str, example: str, **declared: Any) -> Any:
    """A field of StackValues with its key."""
    return field(metadata={"key": Key(name, help, example, **declared)})


def _from_capacity(name: str) -> Callable[[Any], tuple[Any, str]]:
    return lambda settings: (getattr(settings, name), f"capacity {settings.capacity}'s default")


def _from_store(name: str) -> Callable[[Any], tuple[Any, str]]:
    return lambda settings: (getattr(settings, name), f"the {settings.store.name} store's default")


def _every_checkpoint_scored(name: str) -> Callable[[Any], tuple[Any, str]]:
    """tpu-grpo's checkpointing, not the tutorial's (MaxText's): tpu_grpo/catalog/stores.py says why."""
    return lambda settings: (getattr(settings, name), "tpu-grpo's default: every checkpoint scored")


def _maxtext(value: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, str]]:
    """A setting that, unset, leaves MaxText's own default: tpu-grpo passes nothing."""
    return lambda settings: (value(settings), "MaxText's default")


def _one_vm_unless_a_slice(settings: Any) -> tuple[Any, str]:
    if settings.tpu_slice:
        return settings.slice, "default"
    return settings.machine.accelerator_type, "the one VM of machineType"


def _by_capacity(value) -> str:
    """Each capacity's default of a setting, from its row: `0 for reservation; 60 for spot, ...`."""
    groups: dict[str, list[str]] = {}
    for capacity, row in CAPACITIES.items():
        groups.setdefault(str(value(row)), []).append(capacity)
    return "; ".join(f"{default} for {', '.join(names)}" for default, names in groups.items())


@dataclass(frozen=True, kw_only=True)
class StackValues:
    """Every stack setting, declared once: a field of the settings (its name and type) with its key (its name in the
    stack file, meaning, example, rule and default). KEYS is read from these fields, and settings.Settings adds what
    is made of them."""

    project: str = setting(
        "gcp:project",
        "Google Cloud project the VM or slice is made in (with capacity reservation: the one that holds it)",
        "YOUR_PROJECT_ID",
        required=True,
        rule=_form(_PROJECT_ID, "is not a Google Cloud project id"),
    )
    zone: str = setting(
        "gcp:zone",
        "zone of the VM or the slice's TPU nodes, region-letter (with capacity reservation: the reservation's)",
        "us-east5-b",
        required=True,
        rule=_form(_ZONE, "is not a zone of the form region-letter (us-east5-b; an AI zone: us-south1-ai1b)"),
    )
    capacity: str = setting(
        f"{PROJECT}:capacity",
        "how the chips are obtained: " + ", ".join(CAPACITIES) + f" (default {DEFAULT_CAPACITY})",
        "spot",
        rule=_one_of(CAPACITIES, "is not a capacity (" + ", ".join(CAPACITIES) + ")"),
    )
    fallback: tuple[Place, ...] = setting(
        f"{PROJECT}:fallback",
        "other places to try, in order, when Google has no chips for gcp:zone and capacity: a list of "
        "{zone, capacity} (capacity: the stack's when left out) (docs/capacity.md)",
        "zone=us-east5-a,capacity=spot",
        rule=_places,
        entries=FALLBACK_FIELDS,
    )
    placed: Place | None = setting(
        f"{PROJECT}:placed",
        "where `invoke up` last got chips, of gcp:zone and fallback: written by `invoke up`, not by hand",
        """'{"zone": "us-east5-a", "capacity": "spot"}'""",
        rule=_placed,
        entries=PLACED_FIELDS,
    )
    reservation: str | None = setting(
        f"{PROJECT}:reservation",
        "the v6e reservation the VM is bound to (capacity "
        f"{_capacities(lambda row: row.needs_reservation)}): NAME, or "
        "projects/PROJECT/reservations/NAME for another project's shared one",
        "YOUR_RESERVATION_NAME",
        rule=_form(
            _RESERVATION,
            "is not a reservation name (NAME, or projects/PROJECT/reservations/NAME; lowercase letters, digits, '-')",
        ),
    )
    max_run_hours: int | None = setting(
        f"{PROJECT}:maxRunHours",
        f"hours a {_capacities(lambda row: row.run_limited)} VM runs before it is "
        f"deleted ({MAX_RUN_HOURS[0]} to {MAX_RUN_HOURS[1]}; capacity {_capacities(lambda row: row.run_limited)} "
        "only)",
        "24",
        rule=whole(*MAX_RUN_HOURS, " hours: a flex-start VM runs at most 7 days"),
    )
    idle_stop_minutes: int = setting(
        f"{PROJECT}:idleStopMinutes",
        "minutes without a tpu-grpo job or terminal (SSH login) session before the "
        f"VM powers itself off; 0: never (default: {_by_capacity(lambda row: row.idle_stop_minutes)})",
        "60",
        rule=whole(0, 7 * 24 * 60, " minutes; 0: never"),
        unset=_from_capacity("idle_stop_minutes"),
    )
    slice: str = setting(
        f"{PROJECT}:slice",
        f"TPU slice: unset (or {ONE_VM}, the tutorial's), the one VM of machineType, shown by its accelerator type "
        "(v6e-8, v6e-4, v6e-1); or a multi-host slice on GKE with Pathways: " + ", ".join(SLICES),
        "v6e-16",
        rule=_one_of([ONE_VM, *SLICES], f"is not a slice ({ONE_VM}, the one VM, or " + ", ".join(SLICES) + ")"),
        unset=_one_vm_unless_a_slice,
        maxtext=("chips_per_vm",),
    )
    num_slices: int = setting(
        f"{PROJECT}:numSlices",
        f"slices of a multi-host slice's shape, one node pool each (1 to {MAX_SLICES}; default 1)",
        "2",
        rule=whole(1, MAX_SLICES, " slices"),
    )
    vm_name: str = setting(
        f"{PROJECT}:vmName",
        "name of the TPU VM (the tutorial's TPU_NAME), or of a slice's GKE cluster",
        "tpu-grpo",
        default="tpu-grpo",
        rule=_GCE_NAMED,
    )
    machine_type: str = setting(
        f"{PROJECT}:machineType",
        "TPU machine type of the one VM: " + ", ".join(MACHINES),
        "ct6e-standard-8t",
        vm_only=True,
        default="ct6e-standard-8t",
        rule=_one_of(MACHINES, "is not a known TPU machine type (" + ", ".join(MACHINES) + ")"),
        maxtext=("chips_per_vm",),
    )
    checkpoint_store: str = setting(
        f"{PROJECT}:checkpointStore",
        "where checkpoints and runs live: " + ", ".join(STORES) + " or "
        f"gs://BUCKET[/PREFIX] (default: {_by_capacity(lambda row: row.checkpoint_store)}, which refuse shm)",
        "disk",
        rule=_store,
        unset=_from_capacity("checkpoint_store"),
        maxtext=("base_output_directory",),
    )
    bucket: bool = setting(
        f"{PROJECT}:bucket", "declare checkpointStore's bucket in this stack (default: it exists already)", "true"
    )
    checkpoint_period: int = setting(
        f"{PROJECT}:checkpointPeriod",
        f"training steps between checkpoints, MaxText's checkpoint_period (default {CHECKPOINT_PERIOD}: each "
        "checkpoint is scored, the best exported)",
        "10",
        rule=whole(1, MAX_STEPS, " steps"),
        default=str(CHECKPOINT_PERIOD),
        unset=_every_checkpoint_scored("checkpoint_period"),
        maxtext=("checkpoint_period", "eval_interval"),
    )
    checkpoints_to_keep: int = setting(
        f"{PROJECT}:checkpointsToKeep",
        f"newest checkpoints kept, max_num_checkpoints_to_keep (default {CHECKPOINTS_TO_KEEP}; on one VM the best "
        "scored is kept beside them)",
        "2",
        rule=whole(1, 1000),
        default=str(CHECKPOINTS_TO_KEEP),
        unset=_every_checkpoint_scored("checkpoints_to_keep"),
        maxtext=("max_num_checkpoints_to_keep",),
    )
    boot_disk_gb: int = setting(
        f"{PROJECT}:bootDiskGb",
        f"boot disk size in GB of the VM, or of each slice host (at least and by "
        f"default {MIN_BOOT_DISK_GB}, the tutorial's)",
        "200",
        rule=whole(MIN_BOOT_DISK_GB, MAX_DISK_GB, f" GB ({MIN_BOOT_DISK_GB}: the tutorial's boot disk)"),
        default=str(MIN_BOOT_DISK_GB),
    )
    data_disk_gb: int = setting(
        f"{PROJECT}:dataDiskGb",
        f"persistent data disk in GB for caches, checkpoints, models (at least {MIN_DATA_DISK_GB})",
        "500",
        vm_only=True,
        default="500",
        rule=whole(
            MIN_DATA_DISK_GB,
            MAX_DISK_GB,
            " GB: one GRPO checkpoint of an 8B model with its optimizer state is tens of GB",
        ),
    )
    data_disk_iops: int = setting(
        f"{PROJECT}:dataDiskIops",
        f"provisioned IOPS of the data disk ({DATA_DISK_IOPS[0]} to "
        f"{DATA_DISK_IOPS[1]}; default: {STORES['disk'].disk_iops} for the disk store, which writes checkpoints "
        f"there, else the {DATA_DISK_IOPS[0]} Hyperdisk Balanced includes)",
        str(STORES["disk"].disk_iops),
        vm_only=True,
        rule=whole(*DATA_DISK_IOPS, " IOPS, Hyperdisk Balanced's"),
        unset=_from_store("data_disk_iops"),
    )
    data_disk_throughput_mibps: int = setting(
        f"{PROJECT}:dataDiskThroughputMibps",
        f"provisioned throughput of the data disk in MiB/s "
        f"({DATA_DISK_THROUGHPUT_MIBPS[0]} to {DATA_DISK_THROUGHPUT_MIBPS[1]}; default: "
        f"{STORES['disk'].disk_throughput_mibps} for the disk store, a checkpoint of the 8B model in about 20 s, "
        f"else the {DATA_DISK_THROUGHPUT_MIBPS[0]} included)",
        str(STORES["disk"].disk_throughput_mibps),
        vm_only=True,
        rule=whole(*DATA_DISK_THROUGHPUT_MIBPS, " MiB/s, Hyperdisk Balanced's"),
        unset=_from_store("data_disk_throughput_mibps"),
    )
    ssh_user: str = setting(
        f"{PROJECT}:sshUser",
        "user created on the VM for your SSH key",
        "ubuntu",
        vm_only=True,
        default="ubuntu",
        rule=_form(_UNIX_USER, "is not a Linux user name"),
    )
    ssh_public_key_path: str = setting(
        f"{PROJECT}:sshPublicKeyPath",
        "your SSH public key (.pub) put in the VM's metadata",
        "~/.ssh/id_ed25519.pub",
        required=True,
        vm_only=True,
    )
    ssh_source_ranges: tuple[str, ...] = setting(
        f"{PROJECT}:sshSourceRanges",
        "CIDR ranges allowed to reach port 22",
        "YOUR_PUBLIC_IP/32",
        required=True,
        vm_only=True,
        rule=_ranges,
    )
    allow_ssh_from_anywhere: bool = setting(
        f"{PROJECT}:allowSshFromAnywhere",
        "let sshSourceRanges hold 0.0.0.0/0 or ::/0 (port 22 open to the whole internet)",
        "true",
    )
    network: str | None = setting(
        f"{PROJECT}:network",
        "existing VPC network to use (default: the stack makes its own)",
        "default",
        rule=_GCE_NAMED,
    )
    subnetwork: str | None = setting(
        f"{PROJECT}:subnetwork",
        "subnetwork of that existing network (default: its auto subnet)",
        "default",
        rule=_GCE_NAMED,
    )
    service_account: str | None = setting(
        f"{PROJECT}:serviceAccount",
        "service account email for the VM (default: the compute default)",
        "sa@project.iam.gserviceaccount.com",
        rule=_form(
            _SERVICE_ACCOUNT,
            "is not a service account email (NAME@PROJECT.iam.gserviceaccount.com, or a "
            "Google-managed one: lowercase letters, digits, '.', '-')",
        ),
    )
    labels: dict[str, str] = setting(
        f"{PROJECT}:labels",
        "extra labels on the VM, its data disk, a move's snapshot, the bucket, and a slice's cluster, its nodes and "
        "image repository (a network, a firewall rule and a grant take none)",
        "team=ml",
        rule=_labels,
    )
    model: str = setting(
        f"{PROJECT}:model",
        "MaxText model to train (docs/models.md): " + ", ".join(MODELS),
        DEFAULT_MODEL,
        default=DEFAULT_MODEL,
        rule=_one_of(
            MODELS, "is not a model MaxText 0.2.3 post-trains here (" + ", ".join(MODELS) + "; docs/models.md)"
        ),
        maxtext=("model_name",),
    )
    export_model: str = setting(
        f"{PROJECT}:exportModel",
        "MaxText model name for the conversion back to Hugging Face: the model's own, "
        "or its export name (default: the model table's, llama3.1-8b for the tutorial's model)",
        "llama3.1-8b",
        maxtext=("model_name",),
    )
    tokenizer: str | None = setting(
        f"{PROJECT}:tokenizer",
        "Hugging Face tokenizer to train and export with (default: the model table's, "
        "an Instruct model's for a base model)",
        "meta-llama/Llama-3.1-8B-Instruct",
        rule=_HUB_ID,
        unset=lambda settings: (settings.model_row.training_tokenizer, "the model table's"),
        maxtext=("tokenizer_path",),
    )
    dataset: str | None = setting(
        f"{PROJECT}:dataset",
        f"Hugging Face dataset to train on, with a question column (problem, prompt, "
        f"question) and an answer column (answer, solution, expected_answer) (default: {DEFAULT_DATASET})",
        "nvidia/OpenMathInstruct-2",
        rule=_HUB_ID,
        unset=_maxtext(lambda settings: DEFAULT_DATASET),
        maxtext=("dataset_name", "eval_dataset_name"),
    )
    dataset_config: str | None = setting(
        f"{PROJECT}:datasetConfig",
        f"the dataset's subset, MaxText's hf_name (default: {DEFAULT_DATASET_CONFIG} "
        "for GSM8K, the dataset's default for another)",
        "main",
        rule=_text_by(name),
        unset=_maxtext(lambda settings: DEFAULT_DATASET_CONFIG if settings.dataset in (None, DEFAULT_DATASET) else ""),
        maxtext=("hf_name",),
    )
    loss_algo: str | None = setting(
        f"{PROJECT}:lossAlgo",
        "the RL loss, MaxText's rl.loss_algo: " + ", ".join(LOSS_ALGOS) + " (default grpo)",
        "gspo-token",
        rule=_one_of(LOSS_ALGOS, "is not a loss of MaxText 0.2.3 (" + ", ".join(LOSS_ALGOS) + ")"),
        unset=_maxtext(lambda settings: "grpo"),
        maxtext=("rl.loss_algo",),
    )
    batches: int = setting(
        f"{PROJECT}:batches",
        "GRPO batches per run (num_batches)",
        "50",
        default="50",
        rule=whole(1, MAX_BATCHES),
        maxtext=("num_batches",),
    )
    test_batches: int = setting(
        f"{PROJECT}:testBatches",
        "evaluation batches that choose the checkpoint exported (num_test_batches; docs/training.md, Two sets)",
        "10",
        default="10",
        rule=whole(1, MAX_BATCHES),
        maxtext=("num_test_batches", "test_batch_start_index"),
    )
    report_batches: int = setting(
        f"{PROJECT}:reportBatches",
        "test batches after testBatches' that score the exported checkpoint once (0: no such score)",
        "10",
        default="10",
        rule=whole(0, MAX_BATCHES),
        maxtext=("test_batch_start_index",),
    )
    use_pathways: bool = setting(
        f"{PROJECT}:usePathways", "run with Pathways (true) or McJAX (false)", "false", default="false"
    )
    lazy_load_tensors: bool = setting(
        f"{PROJECT}:lazyLoadTensors",
        "lazy tensor loading in the Hugging Face conversion",
        "false",
        default="false",
        maxtext=("lazy_load_tensors",),
    )


def _kind(annotation: Any) -> type:
    """The kind of value a key takes in the stack file, from its field's type: a tuple is a YAML list."""
    options = (
        [each for each in get_args(annotation) if each is not type(None)]
        if get_origin(annotation) in (UnionType, Union)
        else [annotation]
    )
    found = get_origin(options[0]) or options[0]
    return list if found is tuple else found


def keys_of(values: type) -> tuple[Key, ...]:
    """The keys a dataclass of settings declares, each knowing its field and kind, in the fields' order."""
    types = get_type_hints(values)
    return tuple(
        replace(each.metadata["key"], field=each.name, kind=_kind(types[each.name]))
        for each in fields(values)
        if "key" in each.metadata
    )


KEYS = keys_of(StackValues)
KEY = {key.name: key for key in KEYS}


#: What tpu-grpo reads from the environment, never from a stack file, by the name a person might give it as a key.
ENVIRONMENT = {
    "hftoken": ("HF_TOKEN", "the Hugging Face token, which never goes into a stack file"),
    "token": ("HF_TOKEN", "the Hugging Face token, which never goes into a stack file"),
    "stack": ("TPU_GRPO_STACK", "the stack a task acts on, or --stack"),
    "state": ("TPU_GRPO_STATE", "the laptop's folder of host keys and records"),
    "kubeconfig": ("TPU_GRPO_KUBECONFIG", "a kubeconfig that reaches a slice's cluster another way"),
    "hfendpoint": ("HF_ENDPOINT", "another Hugging Face Hub"),
    "passphrase": ("PULUMI_CONFIG_PASSPHRASE", "the passphrase of the stack's secrets"),
    "configpassphrase": ("PULUMI_CONFIG_PASSPHRASE", "the passphrase of the stack's secrets"),
}


def _words(name: str) -> set[str]:
    """`sshPublicKeyPath` -> {ssh, public, key, path}."""
    return {word.lower() for word in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)}


def environment_variable(name: str) -> tuple[str, str] | None:
    """The environment variable a key's name means (`tpu-grpo:hfToken`: HF_TOKEN), with what it is."""
    return ENVIRONMENT.get(re.sub(r"[^a-z0-9]", "", name.split(":", 1)[-1].lower()))


def meant(name: str) -> Key | None:
    """The setting a name that is none most likely means, by the part after its namespace, in any namespace: the same
    name in other letters' case (`tpu-grpo:zone`: gcp:zone), the one setting whose words hold all of its words
    (`sshKey`: sshPublicKeyPath), else the closest spelling."""
    import difflib

    short = name.split(":", 1)[-1]
    same = [key for key in KEYS if key.short.lower() == short.lower()]
    holding = [key for key in KEYS if _words(short) and _words(short) <= _words(key.short)]
    close = difflib.get_close_matches(short.lower(), [key.short.lower() for key in KEYS], n=1, cutoff=0.8)
    found = same or (holding if len(holding) == 1 else []) or [key for key in KEYS if [key.short.lower()] == close]
    return found[0] if found else None

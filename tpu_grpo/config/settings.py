"""The one reader and validator of the stack settings (`Pulumi.<stack>.yaml`).

The Pulumi program feeds `parse` what `pulumi.Config` returns; the Invoke side feeds it the
same stack file read with pyyaml. Either way every value is checked here, before anything
is declared in the cloud or sent to a host, and a bad one stops with one line that names
the key, the value and the `pulumi config set` that fixes it.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from tpu_grpo.config.capacity import (CAPACITIES, CPU_HOST_USD_PER_HOUR, DEFAULT as DEFAULT_CAPACITY, GKE_CLUSTER_USD_PER_HOUR,
                               MAX_RUN_HOURS, Capacity)
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.accelerators import (CPU_POD_MEMORY_GB, CPU_POOL_MIN_DISK_GB, CPU_POOL_SYSTEM_GB, HOST_MACHINE_TYPE,
                                   MACHINES, MAX_SLICES, ONE_VM, SLICES, Accelerator)
from tpu_grpo.config.models import DEFAULT_DATASET, DEFAULT_DATASET_CONFIG, DEFAULT_MODEL, LOSS_ALGOS, MODELS, Model
from tpu_grpo.config.stores import BUCKET_URL, STORES, Store, store_for, url_problem

PROJECT = "tpu-grpo"
DEFAULT_STACK = "dev"
STACK_ENV = "TPU_GRPO_STACK"
HUB_ENV = "HF_ENDPOINT"  # huggingface_hub's own: a mirror or a private Hub instead of huggingface.co
#: A Hugging Face repository id: OWNER/NAME (the Hub's own rule: letters, digits, ".", "_", "-").
_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_HUB_URL = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+(?:/[A-Za-z0-9._~/-]*)?")
STATE_ENV = "TPU_GRPO_STATE"  # where known_hosts and run records live (default: .tpu-grpo/)

#: The project's default compute account (the VM's and the nodes' without tpu-grpo:serviceAccount) as Google names
#: it, the project number unknown here.
DEFAULT_ACCOUNT = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"
MIN_BOOT_DISK_GB = 200  # the tutorial's --boot-disk-size
MIN_DATA_DISK_GB = 100  # one GRPO checkpoint of an 8B model with optimizer state is tens of GB
#: Hyperdisk Balanced's provisioned performance: at most 160,000 IOPS and 2,400 MiB/s per volume, and
#: 3,000 IOPS and 140 MiB/s included at no charge (Compute Engine's "About Hyperdisk Balanced").
DATA_DISK_IOPS = (3000, 160_000)
DATA_DISK_THROUGHPUT_MIBPS = (140, 2400)
#: MaxText 0.2.3 model names this project knows how to train and export.
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
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-([a-z])")
#: A reservation of this project (NAME) or another project's shared one (projects/PROJECT/reservations/NAME).
_RESERVATION = re.compile(r"(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]+")
_PLACEHOLDER = re.compile(r"YOUR_", re.IGNORECASE)
_CONFIG_KEY = re.compile(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+")
#: Pulumi's stack names: letters, digits, `-`, `_` and `.`, at most 100 (no path: Pulumi.NAME.yaml is a file here).
_STACK_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")
_KIND_NAMES = {str: "text", int: "a whole number", bool: "true or false", list: "a list", dict: "a mapping"}


class SettingsError(UserError, ValueError):
    """A bad setting: says which key, what was wrong with its value and how to fix it."""

    def __init__(self, key: str, value: Any, problem: str, fix: str):
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        shown = "(missing)" if value is None else repr(value)
        super().__init__(f"{key}={shown} {problem}; fix: {fix}")


@dataclass(frozen=True)
class Key:
    """One stack setting: its config key, its type and what it means (for docs and errors)."""

    name: str
    kind: type
    help: str
    example: str
    required: bool = True
    #: Only the one VM reads it; a multi-host slice (GKE) neither needs nor checks it.
    vm_only: bool = False
    #: What is wrong with a value of the right kind (its rule: a range, a choice, a form), or None.
    check: Callable[[Any], str | None] = lambda value: None

    @property
    def namespace(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def short(self) -> str:
        """The name without its namespace: `zone`, `bootDiskGb`."""
        return self.name.split(":", 1)[1]

    @property
    def field(self) -> str:
        """Its field of Settings: `zone`, `boot_disk_gb`."""
        return re.sub("([A-Z])", r"_\1", self.short).lower()

    def set_command(self, value: str | None = None) -> str:
        value = value or self.example
        if self.kind is list:
            return f"pulumi config set --path '{self.name}[0]' {value}"
        if self.kind is dict:
            label, text = value.split("=", 1)
            return f"pulumi config set --path '{self.name}.{label}' {text}"
        return f"pulumi config set {self.name} {value}"


def _within(low: int, high: int, problem: str) -> Callable[[Any], str | None]:
    return lambda value: None if low <= value <= high else problem


def _one_of(choices, problem: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else problem


def _form(pattern: re.Pattern, problem: str) -> Callable[[Any], str | None]:
    return lambda value: None if pattern.fullmatch(value) else problem


def _store_problem(value: str) -> str | None:
    if value in STORES:
        return None
    if not BUCKET_URL.fullmatch(value):
        return "is not a checkpoint store (" + ", ".join(STORES) + ", or gs://BUCKET[/PREFIX])"
    return url_problem(value)


def _ranges_problem(value: list) -> str | None:
    if not value:
        return "is empty: nobody could reach port 22"
    for cidr in value:
        try:
            ipaddress.ip_network(str(cidr), strict=True)
        except ValueError as error:
            return f"holds {cidr!r}, not a CIDR range ({error})"
    return None


def _labels_problem(value: dict) -> str | None:
    for label, text in value.items():
        if not (_LABEL.fullmatch(str(label)) and _LABEL_VALUE.fullmatch(str(text))):
            return f"holds {label}={text}, not a label (lowercase letters, digits, '_', '-'; at most 63)"
    return None


_AT_LEAST_ONE = _within(1, 2**63, "must be at least 1")
_GCE_NAMED = _form(_GCE_NAME, "is not a Compute Engine name (lowercase letters, digits, '-'; at most 63)")
_HF_REPO_ID = _form(_HF_REPO, "is not a Hugging Face repository id (OWNER/NAME)")


def _capacities(where) -> str:
    """The capacities whose row says `where`, as the settings' help names them."""
    return ", ".join(name for name, row in CAPACITIES.items() if where(row))


def _by_capacity(value) -> str:
    """Each capacity's default of a setting, from its row: `0 for reservation; 60 for spot, ...`."""
    groups: dict[str, list[str]] = {}
    for name, row in CAPACITIES.items():
        groups.setdefault(str(value(row)), []).append(name)
    return "; ".join(f"{default} for {', '.join(names)}" for default, names in groups.items())


KEYS: tuple[Key, ...] = (
    Key("gcp:project", str, "Google Cloud project that holds the reservation", "<your-project-id>",
        check=_form(_PROJECT_ID, "is not a Google Cloud project id")),
    Key("gcp:zone", str, "zone of the reservation (region-letter)", "us-east5-b",
        check=_form(_ZONE, "is not a zone of the form region-letter")),
    Key(f"{PROJECT}:capacity", str, "how the chips are obtained: " + ", ".join(CAPACITIES) + f" (default {DEFAULT_CAPACITY})",
        "spot", required=False, check=_one_of(CAPACITIES, "is not a capacity (" + ", ".join(CAPACITIES) + ")")),
    Key(f"{PROJECT}:reservation", str, "the v6e reservation the VM is bound to (capacity "
        f"{_capacities(lambda row: row.needs_reservation)}): NAME, or "
        "projects/PROJECT/reservations/NAME for another project's shared one", "<your-reservation-name>",
        required=False, check=_form(_RESERVATION, "is not a reservation name (NAME, or projects/PROJECT/reservations/"
                                                  "NAME; lowercase letters, digits, '-')")),
    Key(f"{PROJECT}:maxRunHours", int, f"hours a {_capacities(lambda row: row.run_limited)} VM runs before it is "
        f"deleted ({MAX_RUN_HOURS[0]} to {MAX_RUN_HOURS[1]}; capacity {_capacities(lambda row: row.run_limited)} "
        "only)", "24", required=False, check=_within(*MAX_RUN_HOURS, f"is outside {MAX_RUN_HOURS[0]} to "
                                                     f"{MAX_RUN_HOURS[1]} hours (a flex-start VM runs at most 7 days)")),
    Key(f"{PROJECT}:idleStopMinutes", int, "minutes without a tpu-grpo job or terminal (SSH login) session before the "
        f"VM powers itself off; 0: never (default: {_by_capacity(lambda row: row.idle_stop_minutes)})", "60", required=False,
        check=_within(0, 7 * 24 * 60, "is outside 0 (never) to 10080 minutes")),
    Key(f"{PROJECT}:slice", str, f"TPU slice: {ONE_VM} (default: the one VM of machineType, the tutorial's) or a multi-host slice "
        "on GKE with Pathways: " + ", ".join(SLICES), "v6e-16", required=False,
        check=_one_of([ONE_VM, *SLICES], f"is not a slice ({ONE_VM}, the one VM, or " + ", ".join(SLICES) + ")")),
    Key(f"{PROJECT}:numSlices", int, f"slices of a multi-host slice's shape, one node pool each (1 to {MAX_SLICES}; "
        "default 1)", "2", required=False, check=_within(1, MAX_SLICES, f"is outside 1 to {MAX_SLICES} slices")),
    Key(f"{PROJECT}:vmName", str, "name of the TPU VM (the tutorial's TPU_NAME), or of a slice's GKE cluster",
        "tpu-grpo", check=_GCE_NAMED),
    Key(f"{PROJECT}:machineType", str, "TPU machine type of the one VM: " + ", ".join(MACHINES), "ct6e-standard-8t",
        vm_only=True, check=_one_of(MACHINES, "is not a known TPU machine type (" + ", ".join(MACHINES) + ")")),
    Key(f"{PROJECT}:checkpointStore", str, "where checkpoints and runs live: " + ", ".join(STORES) + " or "
        f"gs://BUCKET[/PREFIX] (default: {_by_capacity(lambda row: row.checkpoint_store)}, which refuse shm)",
        "disk", required=False, check=_store_problem),
    Key(f"{PROJECT}:bucket", bool, "declare checkpointStore's bucket in this stack (default: it exists already)",
        "true", required=False),
    Key(f"{PROJECT}:checkpointPeriod", int, "training steps between checkpoints, MaxText's checkpoint_period "
        "(default 50 on shm, 10 on disk)", "10", required=False, check=_AT_LEAST_ONE),
    Key(f"{PROJECT}:checkpointsToKeep", int, "newest checkpoints kept, max_num_checkpoints_to_keep (default 10 "
        "on shm, 2 on disk)", "2", required=False, check=_AT_LEAST_ONE),
    Key(f"{PROJECT}:bootDiskGb", int, f"boot disk size in GB of the VM, or of each slice host (at least and by "
        f"default {MIN_BOOT_DISK_GB}, the tutorial's)", "200", required=False,
        check=_within(MIN_BOOT_DISK_GB, 2**63, f"is under the tutorial's {MIN_BOOT_DISK_GB} GB boot disk")),
    Key(f"{PROJECT}:dataDiskGb", int, f"persistent data disk in GB for caches, checkpoints, models (at least {MIN_DATA_DISK_GB})", "500",
        vm_only=True, check=_within(MIN_DATA_DISK_GB, 2**63, f"is under {MIN_DATA_DISK_GB} GB: one GRPO checkpoint "
                                    "of an 8B model with its optimizer state is tens of GB")),
    Key(f"{PROJECT}:dataDiskIops", int, f"provisioned IOPS of the data disk ({DATA_DISK_IOPS[0]} to "
        f"{DATA_DISK_IOPS[1]}; default: {STORES['disk'].disk_iops} for the disk store, which writes checkpoints "
        f"there, else the {DATA_DISK_IOPS[0]} Hyperdisk Balanced includes)", str(STORES["disk"].disk_iops),
        required=False, check=_within(*DATA_DISK_IOPS, f"is outside Hyperdisk Balanced's {DATA_DISK_IOPS[0]} to "
                                      f"{DATA_DISK_IOPS[1]} IOPS")),
    Key(f"{PROJECT}:dataDiskThroughputMibps", int, f"provisioned throughput of the data disk in MiB/s "
        f"({DATA_DISK_THROUGHPUT_MIBPS[0]} to {DATA_DISK_THROUGHPUT_MIBPS[1]}; default: "
        f"{STORES['disk'].disk_throughput_mibps} for the disk store, a checkpoint of the 8B model in about 20 s, "
        f"else the {DATA_DISK_THROUGHPUT_MIBPS[0]} included)", str(STORES["disk"].disk_throughput_mibps),
        required=False, check=_within(*DATA_DISK_THROUGHPUT_MIBPS, "is outside Hyperdisk Balanced's "
                                      f"{DATA_DISK_THROUGHPUT_MIBPS[0]} to {DATA_DISK_THROUGHPUT_MIBPS[1]} MiB/s")),
    Key(f"{PROJECT}:sshUser", str, "user created on the VM for your SSH key", "ubuntu", vm_only=True,
        check=_form(_UNIX_USER, "is not a Linux user name")),
    Key(f"{PROJECT}:sshPublicKeyPath", str, "your SSH public key (.pub) put in the VM's metadata", "~/.ssh/id_ed25519.pub",
        vm_only=True),
    Key(f"{PROJECT}:sshSourceRanges", list, "CIDR ranges allowed to reach port 22", "<your-public-ip>/32",
        vm_only=True, check=_ranges_problem),
    Key(f"{PROJECT}:allowSshFromAnywhere", bool, "let sshSourceRanges hold 0.0.0.0/0 or ::/0 (port 22 open to "
        "the whole internet)", "true", required=False),
    Key(f"{PROJECT}:network", str, "existing VPC network to use (default: the stack makes its own)", "default", required=False,
        check=_GCE_NAMED),
    Key(f"{PROJECT}:subnetwork", str, "subnetwork of that existing network (default: its auto subnet)", "default", required=False,
        check=_GCE_NAMED),
    Key(f"{PROJECT}:serviceAccount", str, "service account email for the VM (default: the compute default)", "sa@project.iam.gserviceaccount.com", required=False,
        check=_form(_EMAIL, "is not a service account email")),
    Key(f"{PROJECT}:labels", dict, "extra labels on every resource", "team=ml", required=False,
        check=_labels_problem),
    Key(f"{PROJECT}:model", str, "MaxText model to train (docs/models.md): " + ", ".join(MODELS), DEFAULT_MODEL,
        check=_one_of(MODELS, "is not a model MaxText 0.2.3 post-trains here (" + ", ".join(MODELS) + "; docs/models.md)")),
    Key(f"{PROJECT}:exportModel", str, "MaxText model name for the conversion back to Hugging Face: the model's own, "
        "or its export name (default: the model table's, llama3.1-8b for the tutorial's model)", "llama3.1-8b",
        required=False),
    Key(f"{PROJECT}:tokenizer", str, "Hugging Face tokenizer to train and export with (default: the model table's, "
        "an Instruct model's for a base model)", "meta-llama/Llama-3.1-8B-Instruct", required=False,
        check=_HF_REPO_ID),
    Key(f"{PROJECT}:dataset", str, f"Hugging Face dataset to train on, with a question column (problem, prompt, "
        f"question) and an answer column (answer, solution, expected_answer) (default: {DEFAULT_DATASET})",
        "nvidia/OpenMathInstruct-2", required=False, check=_HF_REPO_ID),
    Key(f"{PROJECT}:datasetConfig", str, f"the dataset's subset, MaxText's hf_name (default: {DEFAULT_DATASET_CONFIG} "
        "for GSM8K, the dataset's default for another)", "main", required=False),
    Key(f"{PROJECT}:lossAlgo", str, "the RL loss, MaxText's rl.loss_algo: " + ", ".join(LOSS_ALGOS) + " (default "
        "grpo)", "gspo-token", required=False,
        check=_one_of(LOSS_ALGOS, "is not a loss of MaxText 0.2.3 (" + ", ".join(LOSS_ALGOS) + ")")),
    Key(f"{PROJECT}:batches", int, "GRPO batches per run (num_batches)", "50", check=_AT_LEAST_ONE),
    Key(f"{PROJECT}:testBatches", int, "evaluation batches (num_test_batches)", "10", check=_AT_LEAST_ONE),
    Key(f"{PROJECT}:usePathways", bool, "run with Pathways (true) or McJAX (false)", "false"),
    Key(f"{PROJECT}:lazyLoadTensors", bool, "lazy tensor loading in the Hugging Face conversion", "false"),
)
KEY = {key.name: key for key in KEYS}


@dataclass(frozen=True)
class Settings:
    """Every stack setting, validated. `pending` lists what still blocks a real `pulumi up`
    (placeholders, a missing key file) when parsed leniently for an offline plan."""

    stack: str
    project: str
    zone: str
    capacity: str
    reservation: str | None
    max_run_hours: int | None
    idle_stop_minutes: int
    slice: str
    num_slices: int
    vm_name: str
    machine_type: str
    checkpoint_store: str
    bucket: bool
    checkpoint_period: int
    checkpoints_to_keep: int
    boot_disk_gb: int
    data_disk_gb: int
    data_disk_iops: int
    data_disk_throughput_mibps: int
    ssh_user: str
    ssh_public_key_path: str
    ssh_public_key: str
    ssh_source_ranges: tuple[str, ...]
    allow_ssh_from_anywhere: bool
    network: str | None
    subnetwork: str | None
    service_account: str | None
    labels: dict[str, str]
    model: str
    export_model: str
    tokenizer: str | None
    dataset: str | None
    dataset_config: str | None
    loss_algo: str | None
    batches: int
    test_batches: int
    use_pathways: bool
    lazy_load_tensors: bool
    pending: tuple[SettingsError, ...] = field(default=(), compare=False)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def tpu_slice(self) -> Accelerator | None:
        """The multi-host slice shape (GKE), or None for the one VM."""
        return SLICES.get(self.slice)

    @property
    def machine(self) -> Accelerator:
        """The one VM's machine, or a slice's host machine (machine_type is then the slice's)."""
        return MACHINES[self.machine_type]

    @property
    def chips(self) -> int:
        shape = self.tpu_slice
        return shape.chips * self.num_slices if shape else self.machine.chips

    @property
    def cpu_pool_disk_gb(self) -> int:
        """A slice's CPU host's boot disk: the conversion downloads the model's safetensors there."""
        return max(CPU_POOL_MIN_DISK_GB, math.ceil(self.model_row.weights_gb) + CPU_POOL_SYSTEM_GB)

    @property
    def lazy_conversion(self) -> bool:
        """Load the Hugging Face tensors lazily in the conversion: when the stack asks, or on a slice, whose
        conversion pod cannot hold the model's weights and their converted copy together (Llama 3.1 70B)."""
        return self.lazy_load_tensors or (bool(self.tpu_slice)
                                          and self.model_row.eager_conversion_gb > CPU_POD_MEMORY_GB)

    @property
    def model_row(self) -> Model:
        return MODELS[self.model]

    @property
    def obtained(self) -> Capacity:
        """The capacity row: how the chips are obtained, billed and restarted."""
        return CAPACITIES[self.capacity]

    def default_shown(self, key: Key) -> str:
        """What an unset key comes to, and whence (`invoke settings`): a capacity's or a store's default."""
        value = getattr(self, key.field, None)
        if value is None or (key.vm_only and self.tpu_slice):
            return "(unset)"
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        whence = {"idleStopMinutes": f"capacity {self.capacity}'s default", "checkpointStore":
                  f"capacity {self.capacity}'s default", "checkpointPeriod": f"the {self.store.name} store's default",
                  "checkpointsToKeep": f"the {self.store.name} store's default", "dataDiskIops":
                  f"the {self.store.name} store's default", "dataDiskThroughputMibps":
                  f"the {self.store.name} store's default"}.get(key.short, "default")
        return f"{shown or '(none)'} ({whence})"

    @property
    def warnings(self) -> list[str]:
        """What is allowed but likely to fail: said by `invoke settings`, `plan` and `up`, never refused."""
        warning = self.obtained.zone_warning(self.zone)
        return [warning] if warning else []

    @property
    def store(self) -> Store:
        """Where the checkpoints and runs live."""
        return store_for(self.checkpoint_store)

    @property
    def usd_per_hour(self) -> float:
        """The chips' price per hour; a slice adds its CPU host and the GKE cluster's fee."""
        extra = CPU_HOST_USD_PER_HOUR + GKE_CLUSTER_USD_PER_HOUR if self.tpu_slice else 0.0
        return round(self.chips * self.obtained.usd_per_chip_hour + extra, 2)


def _coerce(key: Key, value: Any) -> Any:
    """Pulumi hands every value over as a string (objects as JSON); YAML gives native types."""
    bad = SettingsError(key.name, value, f"is not {_KIND_NAMES[key.kind]}", key.set_command())
    if key.kind is str:
        if not isinstance(value, str):
            raise bad
        return value
    if key.kind is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
            return int(value)
        raise bad
    if key.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise bad from None
        elif key.kind is list:
            value = [part.strip() for part in text.split(",") if part.strip()]
        else:
            value = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if not isinstance(value, key.kind):
        raise bad
    return value


def _placeholders(value: Any) -> bool:
    items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
    return any(isinstance(item, str) and _PLACEHOLDER.search(item) for item in items)


def read_public_key(path: str, root: Path) -> str:
    """The key line of an OpenSSH public key file, checked to really be one."""
    key = KEY[f"{PROJECT}:sshPublicKeyPath"]
    file = Path(os.path.expanduser(path))
    file = file if file.is_absolute() else root / file
    if file.is_dir():
        raise SettingsError(key.name, path, "is a folder, not a public key file",
                            key.set_command(f"{path.rstrip('/')}/id_ed25519.pub"))
    if not file.is_file():
        raise SettingsError(
            key.name, path, "is not a file",
            f"ssh-keygen -t ed25519 -f {path.removesuffix('.pub')}, or {key.set_command('PATH.pub')}",
        )
    text = file.read_text(errors="replace").strip()
    if "PRIVATE KEY" in text:
        raise SettingsError(key.name, path, "is a private key", f"{key.set_command(path + '.pub')} (the .pub file)")
    parts = text.split()
    not_public = SettingsError(key.name, path, "is not an OpenSSH public key", key.set_command("PATH.pub"))
    if len(text.splitlines()) != 1 or len(parts) < 2 or parts[0] not in PUBLIC_KEY_TYPES:
        raise not_public
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise not_public from None
    length = int.from_bytes(blob[:4], "big")
    if blob[4 : 4 + length].decode(errors="replace") != parts[0]:
        raise not_public
    return " ".join(parts)


def _check_capacity(values: dict[str, Any]) -> None:
    """The settings that only some capacities take; fills in the capacity's defaults."""
    capacity = values["capacity"] = values["capacity"] or DEFAULT_CAPACITY
    row = CAPACITIES[capacity]
    reservation, hours = KEY[f"{PROJECT}:reservation"], KEY[f"{PROJECT}:maxRunHours"]
    booking = next(name for name, other in CAPACITIES.items() if other.needs_reservation)
    limited = ", ".join(name for name, other in CAPACITIES.items() if other.run_limited)
    if row.needs_reservation and not values["reservation"]:
        raise SettingsError(reservation.name, None, f"is not set, and capacity {capacity} needs it",
                            f"{reservation.set_command()} (or another capacity: "
                            f"pulumi config set {PROJECT}:capacity spot)")
    if not row.needs_reservation and values["reservation"]:
        raise SettingsError(reservation.name, values["reservation"], f"is set, but capacity {capacity} uses no "
                            "reservation", f"pulumi config rm {reservation.name} (or pulumi config set "
                            f"{PROJECT}:capacity {booking})")
    if row.run_limited and values["maxRunHours"] is None:
        raise SettingsError(hours.name, None, f"is not set, and a {capacity} VM needs its maximum run time",
                            hours.set_command())
    if not row.run_limited and values["maxRunHours"] is not None:
        raise SettingsError(hours.name, values["maxRunHours"], f"is set, but only {limited} VMs have a maximum "
                            f"run time (capacity is {capacity})", f"pulumi config rm {hours.name}")
    if values["idleStopMinutes"] is None:
        values["idleStopMinutes"] = row.idle_stop_minutes
    _check_store(values, row)


def _check_store(values: dict[str, Any], capacity: Capacity) -> None:
    """The checkpoint store, how often it is written, and the data disk's performance: defaults that fit
    the capacity."""
    store = KEY[f"{PROJECT}:checkpointStore"]
    values["checkpointStore"] = values["checkpointStore"] or capacity.checkpoint_store
    if values["checkpointStore"] == "shm" and capacity.shm_refused_because:
        raise SettingsError(store.name, "shm", f"loses the run with capacity {capacity.name}: "
                            f"{capacity.shm_refused_because}", f"{store.set_command('disk')} (or pulumi config rm "
                            f"{store.name}: {capacity.checkpoint_store} is this capacity's default)")
    chosen = store_for(values["checkpointStore"])
    if values["bucket"] and chosen.name != "gs":
        bucket = KEY[f"{PROJECT}:bucket"]
        raise SettingsError(bucket.name, True, f"asks for a bucket, but checkpointStore is {chosen.name}",
                            f"{store.set_command('gs://BUCKET/runs')} (or pulumi config rm {bucket.name})")
    if values["checkpointPeriod"] is None:
        values["checkpointPeriod"] = chosen.checkpoint_period
    if values["checkpointsToKeep"] is None:
        values["checkpointsToKeep"] = chosen.checkpoints_to_keep
    values["dataDiskIops"] = values["dataDiskIops"] or chosen.disk_iops
    values["dataDiskThroughputMibps"] = values["dataDiskThroughputMibps"] or chosen.disk_throughput_mibps


def _check_model(values: dict[str, Any]) -> None:
    """The export name fits the model, and the model fits the machine or slice: the memory arithmetic, and the smallest
    shape that holds it."""
    row = MODELS.get(values["model"])
    if row is not None and row.eager_load_method and values["lazyLoadTensors"]:
        lazy = KEY[f"{PROJECT}:lazyLoadTensors"]
        raise SettingsError(lazy.name, True, f"cannot convert {row.name}: MaxText's to_maxtext converts it only with "
                            f"the {row.eager_load_method} eager loader", f"pulumi config set {lazy.name} false")
    shape = SLICES.get(values["slice"]) or MACHINES.get(values["machineType"])  # both filled in by _check_slice
    if row is None or shape is None:  # a placeholder, still to set (settings.pending)
        return
    export = KEY[f"{PROJECT}:exportModel"]
    values["exportModel"] = values["exportModel"] or row.export_model
    if values["exportModel"] not in {row.name, row.export_model}:
        raise SettingsError(export.name, values["exportModel"], f"is not a name of model {row.name} for "
                            f"to_huggingface ({' or '.join(sorted({row.name, row.export_model}))})",
                            f"pulumi config rm {export.name} (the model table's: {row.export_model})")
    slices = values["numSlices"]  # 1 for the one VM (_check_slice)
    if not row.fits(shape, slices):
        _, _, arithmetic = row.need_gb(shape, slices)
        smallest = row.smallest
        fix = (f"pulumi config set {PROJECT}:machineType {smallest.machine_type}" if smallest.hosts == 1 else
               f"pulumi config set {PROJECT}:slice {smallest.name} (docs/slices.md)")
        name = f"{shape.name} x{slices}" if slices > 1 else shape.name
        raise SettingsError(KEY[f"{PROJECT}:model"].name, row.name, f"does not fit a {name}: {arithmetic}; the "
                            f"smallest v6e that holds it is a {smallest.name}", fix)


def _check_slice(values: dict[str, Any]) -> None:
    """A multi-host slice runs under Pathways on GKE, with its runs in a bucket; the one VM takes no slice count."""
    shape = values["slice"] = values["slice"] or ONE_VM
    count = KEY[f"{PROJECT}:numSlices"]
    if shape == ONE_VM:
        if values["numSlices"] is not None:
            raise SettingsError(count.name, values["numSlices"], f"is set, but slice {ONE_VM} is one VM",
                                f"pulumi config rm {count.name} (or pulumi config set {PROJECT}:slice v6e-16)")
        values["numSlices"] = 1
        return
    values["numSlices"] = values["numSlices"] or 1
    values["machineType"] = HOST_MACHINE_TYPE
    if not values["usePathways"]:
        pathways = KEY[f"{PROJECT}:usePathways"]
        raise SettingsError(pathways.name, False, f"but slice {shape} has several hosts, and MaxText 0.2.3 runs RL on "
                            "several hosts only under Pathways", pathways.set_command("true"))
    if store_for(values["checkpointStore"]).name != "gs":
        store = KEY[f"{PROJECT}:checkpointStore"]
        raise SettingsError(store.name, values["checkpointStore"], f"is not a bucket, and the pods of slice {shape} "
                            "share no disk (and are gone when their job ends)",
                            f"{store.set_command('gs://BUCKET/runs')} (and pulumi config set {PROJECT}:bucket true "
                            "to declare it here)")


def unknown_key(name: str, value: Any) -> SettingsError:
    """A key of this project's namespace that is no setting: a typo `pulumi up` would silently drop."""
    names = {key.name.lower(): key.name for key in KEYS}
    close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.8)
    fix = (f"did you mean {names[close[0]].split(':', 1)[1]}? pulumi config rm {name}, then "
           f"{KEY[names[close[0]]].set_command()}" if close else f"pulumi config rm {name} (settings: `invoke settings`)")
    return SettingsError(name, value, "is not a setting of this project", fix)


def _open_to_everyone(ranges: list) -> list[str]:
    """The ranges that admit every address (0.0.0.0/0, ::/0); a placeholder is none of them."""
    wide = []
    for cidr in ranges:
        try:
            if ipaddress.ip_network(str(cidr), strict=True).prefixlen == 0:
                wide.append(str(cidr))
        except ValueError:
            continue
    return wide


def parse(raw: Mapping[str, Any], stack: str, root: Path, *, lenient: bool = False) -> Settings:
    """Validate raw config values (`{"gcp:zone": "us-east5-b", ...}`) into Settings.

    With `lenient`, placeholders and a missing public key file do not stop the parse: they
    are kept in `Settings.pending` so an offline plan can show what is still to set.
    """
    for name in raw:
        if name.startswith(f"{PROJECT}:") and name not in KEY:
            raise unknown_key(name, raw[name])
    pending: list[SettingsError] = []
    values: dict[str, Any] = {}
    shape = raw.get(f"{PROJECT}:slice")
    multi_host = isinstance(shape, str) and shape in SLICES
    for key in KEYS:
        value = raw.get(key.name)
        if multi_host and key.vm_only:
            value = None  # not read: a slice has no VM of its own to log into or attach a disk to
        if value is None or value == "":
            if key.required and not (multi_host and key.vm_only):
                raise SettingsError(key.name, None, "is not set", key.set_command())
            values[key.short] = {dict: {}, bool: False}.get(key.kind)  # an unset int or str: None
            continue
        value = values[key.short] = _coerce(key, value)
        if _placeholders(value):
            error = SettingsError(key.name, value, "is still a placeholder", key.set_command())
            if not lenient:
                raise error
            pending.append(error)
            continue
        problem = key.check(value)
        if problem:
            raise SettingsError(key.name, value, problem, key.set_command())
    anywhere = _open_to_everyone(values["sshSourceRanges"]) if isinstance(values["sshSourceRanges"], list) else []
    if anywhere and not values["allowSshFromAnywhere"]:
        raise SettingsError(KEY[f"{PROJECT}:sshSourceRanges"].name, values["sshSourceRanges"],
                            f"holds {anywhere[0]}, which opens port 22 of the VM (and its Hugging Face token and "
                            "reserved chips) to every address on the internet",
                            "your own address, e.g. pulumi config set --path 'tpu-grpo:sshSourceRanges[0]' "
                            "203.0.113.7/32 (to open it anyway: pulumi config set tpu-grpo:allowSshFromAnywhere true)")
    _check_capacity(values)
    _check_slice(values)
    _check_model(values)
    if values["bootDiskGb"] is None:
        values["bootDiskGb"] = MIN_BOOT_DISK_GB
    if values["subnetwork"] and not values["network"]:
        raise SettingsError(f"{PROJECT}:network", None, "must name the network of the subnetwork",
                            KEY[f"{PROJECT}:network"].set_command())
    try:
        public_key = read_public_key(values["sshPublicKeyPath"], root) if not multi_host else ""
    except SettingsError as error:
        if not (lenient and error.problem == "is not a file"):
            raise
        pending.append(error)
        public_key = ""
    values["sshSourceRanges"] = tuple(values["sshSourceRanges"] or ())
    fields = {key.field: values[key.short] for key in KEYS}
    return Settings(stack=stack, ssh_public_key=public_key, pending=tuple(pending), **fields)


def project_root(start: Path | None = None) -> Path:
    """The folder holding Pulumi.yaml: this one or the nearest above, as Pulumi finds it."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Pulumi.yaml").is_file():
            return folder
    raise SettingsError("Pulumi.yaml", None, f"is not in {here} or above", "run this from the tpu-grpo checkout")


def stack_name() -> str:
    return os.environ.get(STACK_ENV) or DEFAULT_STACK


def hub_endpoint() -> str | None:
    """The Hugging Face Hub the host talks to ($HF_ENDPOINT on the laptop, passed on), or None: huggingface.co."""
    value = os.environ.get(HUB_ENV)
    if value is None:
        return None
    if not _HUB_URL.fullmatch(value):
        raise SettingsError(HUB_ENV, value, "is not an http(s) URL", f"unset it, or e.g. {HUB_ENV}=https://huggingface.co")
    return value.rstrip("/")


class StackFileLoader(yaml.SafeLoader):
    """Reads a stack file as the Pulumi CLI does before it hands the values to the program: every value is
    text (`50`, `true`, `no` alike; lists and mappings stay so), and a key given twice is refused."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StackFileLoader.yaml_implicit_resolvers = {}  # no int, bool, float or null: text, as the Pulumi CLI passes it


def read_stack_file(stack: str, root: Path) -> dict[str, Any]:
    """The `config:` mapping of `Pulumi.<stack>.yaml`, as the Pulumi CLI would pass it on."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise SettingsError(STACK_ENV, stack, f"has no stack file {path.name}",
                            f"pulumi stack init {stack} && pulumi config set ... (or {STACK_ENV}={DEFAULT_STACK})")
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=StackFileLoader) or {}
    except UnicodeDecodeError as error:
        raise SettingsError(path.name, stack, f"is not UTF-8 text (byte {error.start})",
                            f"save {path.name} as UTF-8") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(error, "problem", None) or "unreadable"
        raise SettingsError(path.name, stack, f"is not valid YAML ({problem} at {where})",
                            f"fix {path.name} at {where}") from None
    if not isinstance(document, dict):
        raise SettingsError(path.name, stack, "is not a mapping with a `config:` key",
                            f"fix {path.name} (e.g. `pulumi config set gcp:zone us-east5-b` writes one)")
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SettingsError(path.name, stack, "has a `config:` that is not a mapping", f"fix {path.name}")
    for name in config:
        if not _CONFIG_KEY.fullmatch(name):
            raise SettingsError(f"{path.name} config", name, "is not a setting's name (NAMESPACE:NAME, as the "
                                "Pulumi CLI wants it)", f"remove it from {path.name}, or name it e.g. gcp:zone")
    return config


def check_stack_name(stack: str) -> str:
    if not _STACK_NAME.fullmatch(stack):
        raise SettingsError("--stack", stack, "is not a Pulumi stack name (letters, digits, '-', '_', '.'; at most "
                            "100)", f"e.g. --stack {DEFAULT_STACK} (pulumi stack ls lists them)")
    return stack


def load(stack: str | None = None, root: Path | None = None, *, lenient: bool = False) -> Settings:
    """The Invoke side's settings: the same stack file `pulumi up` reads, validated the same way."""
    stack = check_stack_name(stack_name() if stack is None else stack)
    root = root or project_root()
    return parse(read_stack_file(stack, root), stack, root, lenient=lenient)

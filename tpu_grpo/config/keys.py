"""Every stack setting as a key: its name, type, meaning and example (for docs and errors), and its rule (a range,
a choice, a form), which `settings.parse` checks each value against. Adding a setting is a key here, a field of
`Settings`, and the code that reads it."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable

from tpu_grpo.config.accelerators import MACHINES, MAX_SLICES, ONE_VM, SLICES
from tpu_grpo.config.capacity import CAPACITIES, DEFAULT as DEFAULT_CAPACITY, MAX_RUN_HOURS
from tpu_grpo.config.models import DEFAULT_DATASET, DEFAULT_DATASET_CONFIG, DEFAULT_MODEL, LOSS_ALGOS, MODELS
from tpu_grpo.config.stores import BUCKET_URL, STORES, url_problem

PROJECT = "tpu-grpo"
#: A Hugging Face repository id: OWNER/NAME (the Hub's own rule: letters, digits, ".", "_", "-").
_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
#: The project's default compute account (the VM's and the nodes' without tpu-grpo:serviceAccount) as Google names
#: it, the project number unknown here.
DEFAULT_ACCOUNT = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"
MIN_BOOT_DISK_GB = 200  # the tutorial's --boot-disk-size
MIN_DATA_DISK_GB = 100  # one GRPO checkpoint of an 8B model with optimizer state is tens of GB
#: Hyperdisk Balanced's provisioned performance: at most 160,000 IOPS and 2,400 MiB/s per volume, and
#: 3,000 IOPS and 140 MiB/s included at no charge (Compute Engine's "About Hyperdisk Balanced").
DATA_DISK_IOPS = (3000, 160_000)
DATA_DISK_THROUGHPUT_MIBPS = (140, 2400)
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
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-([a-z])")
#: A reservation of this project (NAME) or another project's shared one (projects/PROJECT/reservations/NAME).
_RESERVATION = re.compile(r"(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]+")
PLACEHOLDER = re.compile(r"YOUR_", re.IGNORECASE)


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

"""The stack settings (`Pulumi.<stack>.yaml`), validated: `parse` checks each value against its key's rule
(keys.py), then the rules between keys (rules.py), and makes the `Settings` everything else reads.

The Pulumi program feeds `parse` what `pulumi.Config` returns; the Invoke side feeds it the same stack file read
as the Pulumi CLI reads it (stack_file.py). Either way every value is checked here, before anything is declared in
the cloud or sent to a host, and a bad one stops with one line that names the key, the value and the
`pulumi config set` that fixes it.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tpu_grpo.catalog.accelerators import (
    CPU_POD_MEMORY_GB,
    CPU_POOL_MIN_DISK_GB,
    CPU_POOL_SYSTEM_GB,
    MACHINES,
    SLICES,
    Accelerator,
)
from tpu_grpo.catalog.capacity import (
    CAPACITIES,
    CPU_HOST_USD_PER_HOUR,
    GKE_CLUSTER_USD_PER_HOUR,
    Capacity,
)
from tpu_grpo.catalog.capacity import (
    DEFAULT as DEFAULT_CAPACITY,
)
from tpu_grpo.catalog.models import MODELS, Model
from tpu_grpo.catalog.stores import CHECKPOINT_PERIOD, CHECKPOINTS_TO_KEEP, STORES, Store, store_for
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.keys import (
    KEY,
    KEYS,
    KINDS,
    PLACEHOLDER,
    PROJECT,
    PUBLIC_KEY_TYPES,
    Key,
    Place,
    StackValues,
    environment_variable,
    meant,
)
from tpu_grpo.config.rules import check_capacity, check_model, check_names, check_slice, open_to_everyone
from tpu_grpo.config.stack_file import chosen_stack, project_root, read_stack_file
from tpu_grpo.config.values import NotAFile, Refused, existing_file


@dataclass(frozen=True)
class Training:
    """The stack's values a run is made of: the model and its data, the machine, where its checkpoints go and how
    often (a run, tpu_grpo.jobs.maxtext.Run, is these and its own flags). The defaults are a new stack's."""

    model: str
    export_model: str
    batches: int
    test_batches: int
    use_pathways: bool
    lazy_load_tensors: bool
    machine: Accelerator
    store: Store = STORES["shm"]
    checkpoint_period: int = CHECKPOINT_PERIOD
    checkpoints_to_keep: int = CHECKPOINTS_TO_KEEP
    report_batches: int = 10  # tpu-grpo:reportBatches (a run recorded before it: the default)
    capacity: str = DEFAULT_CAPACITY  # how the chips were had: said in a job's record, no input of a step
    tokenizer: str | None = None  # tpu-grpo:tokenizer; None: the model table's
    dataset: str | None = None  # tpu-grpo:dataset; None: MaxText's default, GSM8K
    dataset_config: str | None = None  # tpu-grpo:datasetConfig (hf_name)
    loss_algo: str | None = None  # tpu-grpo:lossAlgo; None: MaxText's default, grpo


@dataclass(frozen=True, kw_only=True)
class Settings(StackValues):
    """Every stack setting, validated (each a field of StackValues, declared with its key), and what is made of them.
    `pending` lists what still blocks a real `pulumi up` (placeholders, a missing key file) when parsed leniently
    for an offline plan."""

    stack: str
    ssh_public_key: str
    pending: tuple[SettingsError, ...] = field(default=(), compare=False)
    #: gcp:zone and capacity as the stack file says them, when it names other places (fallback); zone and capacity
    #: above are where the chips are (`placed`, when one of them), which every task and the program read.
    own_place: Place | None = None

    @property
    def home(self) -> Place:
        """gcp:zone and capacity: a slice's cluster and the stack's bucket stay in its zone and region wherever the
        chips are."""
        return self.own_place or Place(self.zone, self.capacity)

    @property
    def candidates(self) -> tuple[Place, ...]:
        """The places to get chips, in the stack's order: its own, then its fallback."""
        return (self.home, *self.fallback)

    @property
    def here(self) -> Place:
        """Where these settings put the VM (or a slice's TPU node pools)."""
        here = Place(self.zone, self.capacity)
        return self.placed if self.placed and self.placed.same(here) else here

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
        """A slice's CPU host's boot disk: the conversion downloads the model there (the whole repository when it
        loads eagerly). It follows the model: another model resizes it, which GKE applies with a new node."""
        download = self.model_row.conversion_download_gb(self.lazy_conversion)
        return max(CPU_POOL_MIN_DISK_GB, math.ceil(download) + CPU_POOL_SYSTEM_GB)

    @property
    def training(self) -> Training:
        """The stack's values a run is made of, each Training field read from its namesake here (the conversion
        loads lazily where it must: lazy_conversion)."""
        values = {each.name: getattr(self, each.name) for each in fields(Training)}
        return Training(**{**values, "lazy_load_tensors": self.lazy_conversion})

    @property
    def lazy_conversion(self) -> bool:
        """Load the Hugging Face tensors lazily in the conversion: when the stack asks, or on a slice, whose
        conversion pod cannot hold the model's weights and their converted copy together (Llama 3.1 70B)."""
        return self.lazy_load_tensors or (
            bool(self.tpu_slice) and self.model_row.eager_conversion_gb > CPU_POD_MEMORY_GB
        )

    @property
    def model_row(self) -> Model:
        return MODELS[self.model]

    @property
    def obtained(self) -> Capacity:
        """The capacity row: how the chips are obtained, billed and restarted."""
        return CAPACITIES[self.capacity]

    def default(self, key: Key) -> tuple[Any, str] | None:
        """What an unset key comes to, and whence: a capacity's, a store's, MaxText's or the model table's default
        (its key's `unset`), the tutorial's; None when nothing stands in for it (`invoke settings`)."""
        if key.vm_only and self.tpu_slice:
            return None
        if key.unset:
            return key.unset(self)
        value = getattr(self, key.field)
        if value is None or value == ():  # an empty list (fallback): nothing stands in for it
            return None
        return value, "the tutorial's" if key.default is not None else "default"

    def default_shown(self, key: Key) -> str:
        """An unset key's default as `invoke settings` shows it: `0 (capacity reservation's default)`, or (unset)."""
        found = self.default(key)
        if found is None:
            return "(unset)"
        value, whence = found
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        return f"{shown or '(none)'} ({whence})"

    @property
    def warnings(self) -> list[str]:
        """What is allowed but likely to fail: said by `invoke settings`, `plan` and `up`, never refused."""
        key = "gcp:zone"
        if not self.here.same(self.home):  # a fallback place: said by its entry, which the fix sets
            for index, place in enumerate(self.fallback):
                if Place(place.zone, place.capacity or self.home.capacity).same(self.here):
                    key = f"{FALLBACK}[{index}].zone"
        warning = self.obtained.zone_warning(self.zone, gke=bool(self.tpu_slice), key=key)
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


def refuse_a_secret(key: Key, value: Any) -> None:
    """A value Pulumi keeps encrypted (`--secret`) comes as {secure: ...}, which no rule of a setting reads."""
    if isinstance(value, dict) and set(value) == {"secure"}:
        raise SettingsError(
            key.name,
            "(a secret)",
            "is a Pulumi secret (`--secret`), and tpu-grpo reads every setting in plain text",
            f"pulumi config rm {key.name}, then {key.set_command()}",
        )


def refused(key: Key, value: Any, problem: Refused) -> SettingsError:
    """A value its key's rule refused, with the fix that mends it: the rule's own, else the key's set command; a
    `--path` into a value of another kind (a list key holding text) is refused by the CLI, so that one removes it
    first."""
    fix = problem.fix or key.set_command()
    if key.kind in (list, dict) and not holds(value, key.kind) and not problem.fix:
        fix = f"pulumi config rm {key.name} && {fix}"
    name, value = problem.at or (key.name, value)
    return SettingsError(name, value, str(problem), fix)


def holds(value: Any, kind: type) -> bool:
    """Whether a setting holds a list (or a mapping) as the stack file writes one, or as the program gets it from
    Pulumi (JSON text): a `--path` fix can set an item of it; into anything else the CLI cannot."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return isinstance(value, kind)


def _placeholders(value: Any) -> bool:
    items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
    return any(isinstance(item, str) and PLACEHOLDER.search(item) for item in items)


def read_public_key(path: str, root: Path) -> str:
    """The key line of an OpenSSH public key file, checked to really be one."""
    key = KEY[f"{PROJECT}:sshPublicKeyPath"]
    where = str(root / os.path.expanduser(path))  # the key pasted for ssh-keygen: no `~` a quote would stop
    try:
        file = existing_file(where)
    except NotAFile as missing:
        keygen = shlex.join(["ssh-keygen", "-t", "ed25519", "-f", where.removesuffix(".pub")])
        folder = os.path.dirname(where)
        if not os.path.isdir(folder):  # a fresh machine has no ~/.ssh, and ssh-keygen -f makes no folder
            keygen = f"{shlex.join(['mkdir', '-p', folder])} && {keygen}"
        fix = (
            key.set_command(f"{path.rstrip('/')}/id_ed25519.pub")
            if missing.folder
            else f"{keygen}, or {key.set_command('YOUR_KEY.pub')}"
        )
        raise SettingsError(key.name, path, str(missing), fix) from None
    except Refused as problem:
        raise SettingsError(key.name, path, str(problem), key.set_command("YOUR_KEY.pub")) from None
    text = file.read_text(errors="replace").strip()
    if "PRIVATE KEY" in text:
        raise SettingsError(key.name, path, "is a private key", f"{key.set_command(path + '.pub')} (the .pub file)")
    parts = text.split()
    not_public = SettingsError(key.name, path, "is not an OpenSSH public key", key.set_command("YOUR_KEY.pub"))
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


def _namespace_of(name: str) -> str:
    """A key's namespace as a person may misspell this project's (`tpu_grpo:`, `TPU-GRPO:`): the project's name,
    so that the key is checked (and refused) rather than silently left out."""
    namespace = name.split(":", 1)[0]
    return PROJECT if re.sub(r"[^a-z0-9]", "", namespace.lower()) == "tpugrpo" else namespace


def unknown_key(name: str, value: Any) -> SettingsError:
    """A key of this project's namespace that is no setting: a typo `pulumi up` would silently drop. A name that means
    an environment variable is told so, its value not echoed (it may be the token)."""
    removed = f"pulumi config rm {shlex.quote(name)}"
    if variable := environment_variable(name):
        said, meaning = variable
        return SettingsError(
            name,
            "(not shown)",
            "is not a setting of this project",
            f"it is {said}, {meaning}: {removed}, then export it",
        )
    key = meant(name)
    fix = (
        f"did you mean {key.short if key.namespace == name.split(':')[0] else key.name}? {removed}, then "
        f"{key.set_command()}"
        if key
        else f"{removed} (settings: `invoke settings`)"
    )
    return SettingsError(name, value, "is not a setting of this project", fix)


def parse(raw: Mapping[str, Any], stack: str, root: Path, *, lenient: bool = False) -> Settings:
    """Validate raw config values (`{"gcp:zone": "us-east5-b", ...}`) into Settings: at the place `invoke up` got
    chips (`tpu-grpo:placed`) when it is one of the stack's candidates, else at gcp:zone and capacity. Every
    candidate of `tpu-grpo:fallback` is checked as the stack's own place would be, so that a search for chips
    never meets a setting it cannot use.

    With `lenient`, placeholders and a missing public key file do not stop the parse: they
    are kept in `Settings.pending` so an offline plan can show what is still to set.
    """
    every = every_place(raw, stack, root, lenient=lenient)
    own = next(iter(every.values()))
    return every.get((own.placed.zone, str(own.placed.capacity)), own) if own.placed else own


def every_place(
    raw: Mapping[str, Any], stack: str, root: Path, *, lenient: bool = False
) -> dict[tuple[str, str], Settings]:
    """The stack's settings at each of its places (tpu-grpo:fallback) by (zone, capacity), in its order, each checked
    as the stack's own place would be: parsed once for a whole search, which takes each attempt's place from here."""
    fallback = raw.get(FALLBACK)
    if fallback is None or fallback == "":
        own = _parse(raw, stack, root, lenient=lenient)
        return {(own.zone, own.capacity): own}
    refuse_a_secret(KEY[FALLBACK], fallback)
    try:
        places = KEY[FALLBACK].parse(fallback)
    except Refused as problem:
        raise refused(KEY[FALLBACK], fallback, problem) from None
    home = Place(str(raw.get("gcp:zone") or ""), str(raw.get(f"{PROJECT}:capacity") or DEFAULT_CAPACITY))
    candidates = (home, *(Place(place.zone, place.capacity or home.capacity) for place in places))
    own = _parse(_at(raw, home, candidates), stack, root, lenient=lenient)
    every = [own]
    for index, place in enumerate(candidates[1:]):
        if any(place.same(earlier) for earlier in candidates[: index + 1]):
            raise SettingsError(
                f"{FALLBACK}[{index}]", str(place), "is listed twice", f"pulumi config rm --path '{FALLBACK}[{index}]'"
            )
        if own.tpu_slice and place.region != home.region:
            raise SettingsError(
                f"{FALLBACK}[{index}]",
                str(place),
                f"is outside gcp:zone's region {home.region}, where a slice's cluster, image and bucket are",
                f"a zone of {home.region}, or pulumi config rm --path '{FALLBACK}[{index}]'",
            )
        try:
            every.append(_parse(_at(raw, place, candidates), stack, root, lenient=lenient))
        except SettingsError as error:
            raise SettingsError(
                f"{FALLBACK}[{index}]", str(place), f"cannot be tried: there, {error.key} {error.problem}", error.fix
            ) from None
    return {(at.zone, at.capacity): replace(at, fallback=candidates[1:], own_place=home) for at in every}


#: The settings only some capacities take (rules.check_capacity refuses them elsewhere).
_TAKEN_BY = {
    f"{PROJECT}:reservation": lambda row: row.needs_reservation,
    f"{PROJECT}:maxRunHours": lambda row: row.run_limited,
}
STORE_KEY = f"{PROJECT}:checkpointStore"
#: Where `invoke up` got chips, which the tasks and the program read as the stack's place.
PLACED = f"{PROJECT}:placed"
#: The place of one update (`invoke up`'s attempt), as JSON, which the program reads over the stack file's `placed`:
#: the stack file records a place only once it got chips.
PLACE_ENV = "TPU_GRPO_PLACE"
#: The setting that lists a stack's other places; the stack's own (gcp:zone, capacity) is tried first.
FALLBACK = f"{PROJECT}:fallback"


def _at(raw: Mapping[str, Any], place: Place, candidates: tuple[Place, ...]) -> dict[str, Any]:
    """The stack file's values at `place`: its zone and capacity, without a setting only other places' capacities
    take (a reservation, a maximum run time), which the rules would refuse there; and one checkpoint store for every
    place, so that a run resumed elsewhere finds its checkpoints: unset, the store of the first place whose capacity
    refuses /dev/shm (its VM may be taken away), else the capacities' own."""
    at = {**raw, "gcp:zone": place.zone, f"{PROJECT}:capacity": place.capacity}
    rows = [CAPACITIES[other.capacity] for other in candidates if other.capacity in CAPACITIES]
    for name, takes in _TAKEN_BY.items():
        if place.capacity in CAPACITIES and not takes(CAPACITIES[place.capacity]) and any(map(takes, rows)):
            at.pop(name, None)
    lasting = [row.checkpoint_store for row in rows if row.shm_refused_because]
    if lasting and at.get(STORE_KEY) in (None, ""):
        at[STORE_KEY] = lasting[0]
    return at


def _parse(raw: Mapping[str, Any], stack: str, root: Path, *, lenient: bool = False) -> Settings:
    """The stack file's values checked at one place (parse)."""
    for name in raw:
        if _namespace_of(name) == PROJECT and name not in KEY:
            raise unknown_key(name, raw[name])
    pending: list[SettingsError] = []
    values: dict[str, Any] = {}
    shape = raw.get(f"{PROJECT}:slice")
    multi_host = isinstance(shape, str) and shape in SLICES
    for key in KEYS:
        value = raw.get(key.name)
        if multi_host and key.vm_only:
            value = None  # not read: a slice has no VM of its own to log into or attach a disk to
        if (value is None or value == "") and key.default is not None and not (multi_host and key.vm_only):
            value = key.default
        if value is None or value == "":
            if key.required and not (multi_host and key.vm_only):
                raise SettingsError(key.name, None, "is not set", key.set_command())
            values[key.short] = {dict: {}, bool: False}.get(key.kind)  # an unset int or str: None
            continue
        refuse_a_secret(key, value)
        if _placeholders(value):
            error = SettingsError(key.name, value, "is still a placeholder", key.set_command())
            if not lenient:
                raise error
            pending.append(error)
            values[key.short] = KINDS[list](value) if key.kind is list else value  # its kind, not its rule
            continue
        try:
            values[key.short] = key.parse(value)
        except Refused as problem:
            raise refused(key, value, problem) from None
    anywhere = open_to_everyone(values["sshSourceRanges"]) if isinstance(values["sshSourceRanges"], list) else []
    if anywhere and not values["allowSshFromAnywhere"]:
        raise SettingsError(
            KEY[f"{PROJECT}:sshSourceRanges"].name,
            values["sshSourceRanges"],
            f"holds {anywhere[0]}, which opens port 22 of the VM (and its Hugging Face token and "
            "reserved chips) to every address on the internet",
            "your own address, e.g. pulumi config set --path 'tpu-grpo:sshSourceRanges[0]' "
            "203.0.113.7/32 (to open it anyway: pulumi config set tpu-grpo:allowSshFromAnywhere true)",
        )
    check_capacity(values)
    check_slice(values)
    check_names(values)
    check_model(values)
    if values["subnetwork"] and not values["network"]:
        raise SettingsError(
            f"{PROJECT}:network",
            None,
            "must name the network of the subnetwork",
            KEY[f"{PROJECT}:network"].set_command(),
        )
    try:
        public_key = read_public_key(values["sshPublicKeyPath"], root) if not multi_host else ""
    except SettingsError as error:
        if not (lenient and error.problem == "is not a file"):
            raise
        pending.append(error)
        public_key = ""
    values["sshSourceRanges"] = tuple(values["sshSourceRanges"] or ())
    values["fallback"] = tuple(values["fallback"] or ())
    fields = {key.field: values[key.short] for key in KEYS}
    return Settings(stack=stack, ssh_public_key=public_key, pending=tuple(pending), **fields)


def load(stack: str | None = None, root: Path | None = None, *, lenient: bool = False) -> Settings:
    """The Invoke side's settings: the same stack file `pulumi up` reads, validated the same way."""
    root = root or project_root()
    stack = chosen_stack(stack, root)
    return parse(read_stack_file(stack, root), stack, root, lenient=lenient)

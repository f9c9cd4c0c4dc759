"""The tutorial's three MaxText command lines (sections 4, 5 and 6) and their environment.

Each step is one bash script: the tutorial's `export`s, cumulative as in its one shell
session, then `python3 -m MODULE key=value ...` rendered from one mapping of overrides per
step, which `--set KEY=VALUE` extends or overrides. Deliberate differences: the Hugging Face
token is read from the host's token file into `HF_TOKEN` (which MaxText 0.2.3 reads itself),
never passed as `hf_access_token=` on the command line; with a checkpoint store other than
/dev/shm (tpu_grpo/catalog/stores.py), MODEL_CHECKPOINT_DIRECTORY and BASE_OUTPUT_DIRECTORY name that
store; a checkpoint period or count other than MaxText's own is passed to train_rl; every step compiles into a
compile cache that outlives the VM (compile_cache_lines); the actor is a copy of the reference model, not a
second restore of the same checkpoint (load_checkpoint_only_once); the learning rate's schedule spans the run's steps
(learning_rate_schedule_steps); and the training runs through a program that ends
its process once it is done (tpu_grpo/host/remote/run_module.py: MaxText 0.2.3's trainer hangs at exit otherwise).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.catalog.models import DEFAULT_DATASET, DEFAULT_DATASET_CONFIG, DEFAULT_MODEL, MODELS, Model
from tpu_grpo.catalog.release import MAXTEXT_KEYS, MAXTEXT_VERSION, nearest_key
from tpu_grpo.catalog.stores import (
    COMMIT_FILE,
    MAXTEXT_CHECKPOINT_PERIOD,
    MAXTEXT_CHECKPOINTS_TO_KEEP,
    Store,
    store_for,
)
from tpu_grpo.config import values
from tpu_grpo.config.errors import BadFlag
from tpu_grpo.config.host_paths import BASE_MODELS, COMPILE_CACHES, ROOT, TOKEN_FILE, VENV
from tpu_grpo.config.keys import KEYS, MAX_BATCHES
from tpu_grpo.config.settings import Training
from tpu_grpo.host import remote
from tpu_grpo.jobs.progress import EVAL, EVAL_FIELD, PRE_EVAL, REPORT_LINE, RESUMES, total_steps

STEPS = ("convert", "train", "export")
MODULES = {
    "convert": "maxtext.checkpoint_conversion.to_maxtext",
    "train": "maxtext.trainers.post_train.rl.train_rl",
    "export": "maxtext.checkpoint_conversion.to_huggingface",
}
#: Keys that a flag or tpu-grpo itself gives: `--set` would make the two disagree.
FLAG_KEYS = {
    "num_batches": "--batches",
    "run_name": "--run-name",
    "hf_access_token": "the host's token file (invoke provision --tags token)",
    "load_parameters_path": "--step (export) or the converted checkpoint (train)",
    "jax_cache_dir": "the compile cache tpu-grpo keeps (docs/training.md, Warm starts)",
}
#: Every key `--set` refuses, with what gives it: a flag, or the settings that declare it theirs (keys.Key.maxtext).
OWNED_KEYS = {
    **{
        owned: " or ".join(key.name for key in KEYS if owned in key.maxtext)
        for owned in sorted({owned for key in KEYS for owned in key.maxtext})
    },
    **FLAG_KEYS,
}
#: The GRPO settings a model card states, with MaxText 0.2.3's rl.yml defaults (a `--set` overrides them).
GRPO_DEFAULTS = {
    "rl.num_generations": "2",
    "learning_rate": "3e-6",
    "rl.grpo_beta": "0.08",
    "rl.grpo_epsilon": "0.2",
    "batch_size": "1",
    "rl.num_iterations": "1",
}
#: MaxText 0.2.3's rl.yml eval_interval: an intermediate evaluation every 10 outer steps (batches).
MAXTEXT_EVAL_INTERVAL = 10
#: A folder being written is NAME.partial until it is complete (tpu_grpo.host.artifacts.save_script).
RESERVED_SUFFIX = ".partial"
#: A MaxText config key: names joined by single dots (`rl.num_generations`), as its pyconfig reads them.
_SET_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: `--set` keys whose value tpu-grpo itself reads (the progress bar's total), so must be counts.
COUNT_KEYS = {key: values.whole(1, 999_999) for key in ("rl.num_iterations", "batch_size", "eval_batch_size")}

#: A store's layout: {root}/{model}/RUNS_FOLDER/{run}/ holds a run's checkpoints, TensorBoard events and (a slice's)
#: EXPORT_FOLDER, as the host's shell writes them (BASE_OUTPUT_DIRECTORY); `paths` and `runs_folder` say them.
RUNS_FOLDER, EXPORT_FOLDER = "post-train", "hf-trained"
#: A run's folder's best scored checkpoint, kept from the checkpoint manager's deletion (keeper_lines), by step.
KEPT_FOLDER = "kept"
#: Where a slice's export writes the Hugging Face model. to_huggingface uploads to gs:// with the path's own object
#: names (checkpoint_conversion/utils/utils.upload_file_to_gcs), `//` and all, where Orbax's paths go through pathlib,
#: which folds a `//`; BASE_OUTPUT_DIRECTORY ends in `/`, so the run's name follows it directly, one folder down.
SLICE_EXPORT = f"$BASE_OUTPUT_DIRECTORY$RUN_NAME/{EXPORT_FOLDER}/"
#: The tutorial's exports that describe one VM's own chips to libtpu. A slice's trainer runs under Pathways
#: (JAX_PLATFORMS=proxy) on a CPU host, and its TPU hosts get their topology from GKE.
ONE_VM_ONLY = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_NAME",
    "TPU_SKIP_MDS_QUERY",
    "TPU_WORKER_HOSTNAMES",
    "TPU_TOPOLOGY",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
)
#: A slice's script is PID 1 of its container, which ignores a SIGTERM it has no handler for: a cancel, a
#: preemption or a node drain would wait out the grace period, then SIGKILL MaxText. So it traps SIGTERM and
#: passes it on to MaxText, run in the background, as xpk's wrapper does (`exec` would not help: MaxText as PID
#: 1 ignores it just the same).
FORWARD_TERM = (
    "trap 'kill -TERM \"$child\" 2>/dev/null' TERM  # PID 1 of its pod: a cancel or preemption reaches MaxText"
)
WAIT_CHILD = [
    "child=$!",
    'while code=0; wait "$child" || code=$?; kill -0 "$child" 2>/dev/null; do :; done  # a TERM ends wait early',
    '[ "$code" = 0 ] || exit "$code"',
]
#: In a slice's pod the token comes from a Kubernetes Secret as HF_TOKEN (tpu_grpo/cloud/jobset.py).
POD_TOKEN_CHECK = (
    '[ -n "${HF_TOKEN:-}" ] || { echo "no Hugging Face token in this pod (Secret tpu-grpo-hf-token); '
    'fix: HF_TOKEN=... uv run invoke pipeline" >&2; exit 1; }'
)


@dataclass(frozen=True)
class Placement:
    """Where a step's script runs, and all that differs there: on one VM, in MaxText's venv with the host's token file,
    its compile caches on the data disk and MaxText in the foreground; or in a slice's pod (`pod`), in the
    post-training image, which has MaxText on its PATH, the token from a Secret and no VM's files (no venv, token file
    or downloaded model), whose environment says where Pathways is, whose compile caches are in the bucket, and whose
    script is PID 1 of its container, so MaxText runs in the background under a SIGTERM trap. `slice_shape` names the
    slice a pod's training compiles for (SLICE x NUMBER)."""

    pod: bool = False
    slice_shape: str = ""

    def prologue(self, step: str, run: Run) -> list[str]:
        return [
            f"# tpu-grpo {step}: the tutorial's section {STEPS.index(step) + 4}",
            "set -eo pipefail",
            *([] if self.pod else [f"source {VENV}/bin/activate"]),
            "set -u",
            *token_lines(needed=run.row.gated, pod=self.pod),
            "export PYTHONUNBUFFERED=1  # log lines reach the job's log as they happen",
        ]

    def exports(self, run: Run, step: str) -> list[str]:
        """The tutorial's exports up to the step (a pod's, without those that describe one VM's own chips)."""
        return [
            f"{name}={value}; export {name}" if value.startswith("$(") else f"export {name}={value}"
            for name, value in environment(run, step, self)
            if not (self.pod and name in ONE_VM_ONLY)
        ]

    def keeps_best(self, run: Run) -> bool:
        """Whether the training keeps its best scored checkpoint from the manager's deletion (remote/keep_best.py): on
        one VM whose store is its own filesystem, where a hard link keeps it for nothing; a bucket keeps what Orbax
        keeps."""
        return not self.pod and run.store.name != "gs"

    def compile_cache_root(self, run: Run) -> str:
        """Where compile caches live: the data disk of one VM (a replaced VM gets the same disk), the store's bucket
        for a slice (its pods keep nothing)."""
        return f"{run.store.root}/compile-cache" if self.pod else COMPILE_CACHES

    def supervised(self, command: list[str]) -> list[str]:
        """The lines that run MaxText: as they are on a VM; in a pod, in the background, the TERM passed on to it."""
        return [FORWARD_TERM, *command, *WAIT_CHILD] if self.pod else command

    @property
    def background(self) -> str:
        return " &" if self.pod else ""


#: The one VM (the tutorial's).
VM = Placement()


@dataclass(frozen=True)
class Run(Training):
    """What the three command lines are made of: the stack's training values and this run's flags."""

    #: None until resolved: a run not named is the newest trained one (export), or the newest earlier pipeline of
    #: the same inputs, else a new one named by its start time (pipeline)
    run_name: str | None = None
    sets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # step -> key -> value
    step: int | None = None  # the checkpoint to export, `--step` (default: the best scored one, else the last)
    last: bool = False  # `--last`: the training's last checkpoint, not the best scored one
    scored_step: int | None = None  # the best scored checkpoint, once read from the training's log (pipeline.scored)

    @classmethod
    def of(cls, training: Training, **own) -> Run:
        """A run of the stack's training values and its own flags (`own`, which may override one: --batches)."""
        return cls(**{**{each.name: getattr(training, each.name) for each in fields(training)}, **own})

    @property
    def name(self) -> str:
        """The run's name, once resolved: what its scripts, paths and records are made of."""
        assert self.run_name is not None, "a run is named before its scripts, paths or records are made"
        return self.run_name

    def named(self, default: str) -> Run:
        """This run, named `default` if it was not named."""
        return self if self.run_name is not None else replace(self, run_name=default)

    @property
    def row(self) -> Model:
        return MODELS[self.model]

    @property
    def training_tokenizer(self) -> str:
        return self.tokenizer or self.row.training_tokenizer

    def data_overrides(self) -> dict[str, str]:
        """The train step's tokenizer, dataset and loss, each only where it is not MaxText's default (so the
        tutorial's command line stays the tutorial's)."""
        found = {}
        if self.training_tokenizer != self.row.hf_id:  # MaxText's default tokenizer_path is HF_IDS[model_name]
            found["tokenizer_path"] = self.training_tokenizer
        if self.dataset and self.dataset != DEFAULT_DATASET:
            # the four MaxText names as supported split 95/5 when evaluated on themselves; another, its test split
            found.update(dataset_name=self.dataset, eval_dataset_name=self.dataset, hf_name=self.dataset_config or "")
        elif self.dataset_config and self.dataset_config != DEFAULT_DATASET_CONFIG:
            found["hf_name"] = self.dataset_config
        if self.loss_algo and self.loss_algo != "grpo":
            found["rl.loss_algo"] = self.loss_algo
        return found

    @property
    def train_steps(self) -> int:
        """The training's GRPO steps, for the progress bar (rl.num_iterations checked by parse_sets)."""
        return total_steps(self.batches, self.iterations)

    @property
    def iterations(self) -> int:
        return iterations(self.sets.get("train", {}))

    @property
    def eval_interval(self) -> int:
        """The batches between intermediate evaluations: those between checkpoints, so that each checkpoint is scored
        and no evaluation is of weights nobody can export (MaxText's eval_interval counts outer steps, its
        checkpoint_period train steps: a batch is rl.num_iterations of them)."""
        return max(1, self.checkpoint_period // self.iterations)

    @property
    def eval_batch_size(self) -> int:
        """Examples per evaluation batch: MaxText's eval_batch_size, whose default (-1) is the training's batch_size."""
        train = self.sets.get("train", {})
        return int(train.get("eval_batch_size") or train.get("batch_size") or GRPO_DEFAULTS["batch_size"])

    @property
    def choosing_examples(self) -> int:
        """The test split's first examples, which every evaluation of the training scores and the best checkpoint is
        chosen on."""
        return self.test_batches * self.eval_batch_size

    @property
    def report_examples(self) -> range:
        """The test split's examples that score the exported checkpoint (once, in the export's job): those after the
        testBatches ones every evaluation of the training scores and the best checkpoint is chosen on. MaxText takes
        test_dataset[test_batch_start_index : num_test_batches * eval_batch_size] of its shuffled test split
        (train_rl.prepare_datasets: the end is not shifted by the start)."""
        return range(self.choosing_examples, self.choosing_examples + self.report_batches * self.eval_batch_size)

    def evaluation_load(self) -> dict[str, int]:
        """What evaluating costs the run, in answers generated beside the training's: every evaluation of the
        training (before, after each eval_interval batches, after) answers the choosing examples greedily once, the
        export's report its examples; the training samples rl.num_generations answers to each prompt of each batch."""
        train = {**GRPO_DEFAULTS, **self.sets.get("train", {})}
        passes = 2 + self.batches // self.eval_interval
        answers = passes * self.choosing_examples + len(self.report_examples)
        trained = self.batches * int(train["batch_size"]) * int(train["rl.num_generations"])
        return {
            "passes": passes,
            "choosing_examples": self.choosing_examples,
            "report_examples": len(self.report_examples),
            "eval_answers": answers,
            "train_answers": trained,
        }

    @property
    def export_step(self) -> int:
        """The checkpoint the export converts: `--step`, else the best scored (unless `--last`), else the last."""
        return self.step or (None if self.last else self.scored_step) or self.train_steps

    def to_record(self) -> dict:
        """Every input of the run, as a job's record keeps it (JSON); `Run.from_record` makes the same Run again."""
        return {
            **{each.name: getattr(self, each.name) for each in fields(self)},
            "machine": self.machine.machine_type,
            "sets": {step: dict(sets) for step, sets in self.sets.items()},
            "store": self.store.root if self.store.name == "gs" else self.store.name,
        }  # a checkpointStore value

    @classmethod
    def from_record(cls, record: dict) -> Run:
        return cls(**{**record, "machine": MACHINES[record["machine"]], "store": store_for(record["store"])})

    def export_of(self, trained: Run) -> Run:
        """The export of a trained run: everything as the training had it (model, export name, tokenizer, data,
        store, batches, its `--set`s), and what this export asks itself (its `--set`s, the checkpoint step)."""
        return replace(
            trained, step=self.step, last=self.last, sets={**trained.sets, "export": self.sets.get("export", {})}
        )

    def inputs(self, step: str) -> dict:
        """What a step's result depends on: equal inputs mean a done step can be reused."""
        common = {
            "model": self.model,
            "use_pathways": self.use_pathways,
            "store": self.store.name,
            "convert_set": dict(self.sets.get("convert", {})),
        }
        if step == "convert":
            return {**common, "lazy_load_tensors": self.lazy_load_tensors}
        trained = {
            **common,
            "run_name": self.run_name,
            "batches": self.batches,
            "test_batches": self.test_batches,
            "machine": self.machine.machine_type,
            "train_set": dict(self.sets.get("train", {})),
            **({"data": self.data_overrides()} if self.data_overrides() else {}),
        }
        if step == "train":
            return trained
        return {
            **trained,
            "export_model": self.export_model,
            "step": self.export_step,
            "export_set": dict(self.sets.get("export", {})),
        }


def export_reason(run: Run) -> str:
    """Why the export converts the checkpoint it does, as its log says it."""
    if run.step:
        return "as --step asked"
    if run.export_step == run.scored_step:
        return f"the best scored of those in the store; --last exports the last ({run.train_steps}), --step N another"
    return "the last, as --last asked" if run.last else "the last: no checkpoint of the run was scored"


def iterations(train_sets: Mapping[str, str]) -> int:
    """rl.num_iterations of a training's `--set`s (checked a count by parse_sets): the train steps of each batch."""
    return int(train_sets.get("rl.num_iterations", 1))


def trained_on(inputs: dict) -> dict[str, str]:
    """What a training's inputs (Run.inputs("train"), as its job records them) say it trained: the model, the
    dataset and its subset, the loss and the tokenizer, MaxText's defaults filled in."""
    data = inputs.get("data", {})
    model = inputs.get("model", DEFAULT_MODEL)
    dataset = data.get("dataset_name", DEFAULT_DATASET)
    return {
        "model": model,
        "dataset": dataset,
        "dataset_config": data.get("hf_name", DEFAULT_DATASET_CONFIG if dataset == DEFAULT_DATASET else ""),
        "loss": data.get("rl.loss_algo", "grpo"),
        "tokenizer": data.get("tokenizer_path", MODELS[model].hf_id),
    }


def timestamp_run_name(now: float | None = None) -> str:
    """The tutorial's `RUN_NAME=$(date +%Y-%m-%d-%H-%M-%S)`, taken on the laptop in UTC (the VM's clock zone)."""
    return time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now))


def check_run_name(name: str, flag: str = "--run-name") -> str:
    values.flag(flag, name, values.name, "gsm8k-50")
    if name.endswith(RESERVED_SUFFIX):
        raise BadFlag(
            f"{flag} {name!r} ends in {RESERVED_SUFFIX}, which marks a save still being written; "
            f"fix: e.g. {flag} {name.removesuffix(RESERVED_SUFFIX)}-2"
        )
    return name


def check_count(flag: str, text: object, minimum: int = 1, maximum: int = MAX_BATCHES) -> int:
    """`--batches 50` -> 50, by the one parser of whole numbers (values.whole)."""
    return values.flag(flag, text, values.whole(minimum, maximum), "50" if minimum else "3")


def parse_sets(items: list[str] | None, default_step: str | None) -> dict[str, dict[str, str]]:
    """`--set KEY=VALUE` or `--set STEP:KEY=VALUE` -> {step: {key: value}}.

    A step task (`default_step` given) takes its own step only; `pipeline` (None) takes any, and
    its bare `KEY=VALUE` is train's. The step is what comes before the first ':' of the part before
    the first '=', so a value may hold colons (`train:tokenizer_path=gs://bucket/x`)."""
    sets: dict[str, dict[str, str]] = {}
    for item in items or []:
        head, equals, value = item.partition("=")
        step, colon, key = head.partition(":")
        if not colon:
            step, key = default_step or "train", head
        if step not in STEPS:
            raise BadFlag(
                f"--set {item!r} names step {step!r}; fix: one of {', '.join(STEPS)}, "
                "e.g. --set train:learning_rate=1e-6"
            )
        if default_step and step != default_step:
            raise BadFlag(
                f"--set {item!r} is for {step}, but this task runs {default_step}; fix: pass it to "
                f"`invoke {step}`, or to `invoke pipeline` as --set {step}:{key}=..."
            )
        if not equals or not _SET_KEY.fullmatch(key) or not value:
            raise BadFlag(
                f"--set {item!r} is not KEY=VALUE (a MaxText key, a value); fix: e.g. --set rl.num_generations=4"
            )
        if key in OWNED_KEYS:
            raise BadFlag(f"--set {item!r} sets {key}, which comes from {OWNED_KEYS[key]}; fix: use that instead")
        if key not in MAXTEXT_KEYS:  # else the job's pyconfig refuses it once the paid host has started it
            nearest = nearest_key(key)
            fix = (
                f"did you mean {nearest}? e.g. --set {nearest}=..."
                if nearest
                else "a key of MaxText's config (base.yml)"
            )
            raise BadFlag(f"--set {item!r}: MaxText {MAXTEXT_VERSION} has no config key {key!r}; fix: {fix}")
        if key in COUNT_KEYS:
            try:
                COUNT_KEYS[key](value)
            except values.Refused as problem:
                raise BadFlag(f"--set {item!r}: {key} {problem}; fix: e.g. --set {key}=1") from None
        if key in sets.get(step, {}):  # as a flag given twice is refused, not the last one kept
            raise BadFlag(f"--set {item!r} sets {step}'s {key} again; fix: give it once")
        sets.setdefault(step, {})[key] = value
    return sets


def _q(value: object) -> str:
    return shlex.quote(str(value))


def environment(run: Run, step: str, at: Placement = VM) -> list[tuple[str, str]]:
    """The tutorial's exports up to this step, in its order, as (name, shell text of the value). In a
    slice's pod the export goes into the run's folder in the bucket: the pod's /dev/shm goes with it."""
    machine = run.machine.tpu_env()
    convert = [
        ("MODEL_NAME", _q(run.model)),
        ("MODEL_CHECKPOINT_DIRECTORY", f"{run.store.root}/$MODEL_NAME/mt-format/"),
        ("USE_PATHWAYS", "1" if run.use_pathways else "0"),
        ("LAZY_LOAD_TENSORS", "True" if run.lazy_load_tensors else "False"),
    ]
    train = [
        ("BASE_OUTPUT_DIRECTORY", f"{run.store.root}/$MODEL_NAME/{RUNS_FOLDER}/"),
        ("RUN_NAME", _q(run.name)),
        ("CHIPS_PER_VM", machine["CHIPS_PER_VM"]),
        ("NUM_BATCHES", str(run.batches)),
        ("MAXTEXT_CKPT_PATH", "$MODEL_CHECKPOINT_DIRECTORY/0/items"),
        ("TPU_ACCELERATOR_TYPE", machine["TPU_ACCELERATOR_TYPE"]),
        ("TPU_WORKER_ID", "0"),
        ("TPU_NAME", "$(hostname)"),
        ("TPU_SKIP_MDS_QUERY", "1"),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        ("TPU_TOPOLOGY", machine["TPU_TOPOLOGY"]),
        ("TPU_CHIPS_PER_HOST_BOUNDS", machine["TPU_CHIPS_PER_HOST_BOUNDS"]),
        ("TPU_HOST_BOUNDS", machine["TPU_HOST_BOUNDS"]),
    ]
    # the tutorial's $NUM_BATCHES for the last checkpoint, unless scores chose it: a chosen step is a number, whichever
    # (pipeline.chain_data renders a stand-in step, which the host replaces with the one its training's scores chose)
    last = run.export_step == run.batches and run.scored_step is None
    step_dir = "$NUM_BATCHES" if last else str(run.export_step)
    export = [
        ("HF_EXPORT", SLICE_EXPORT if at.pod else "/dev/shm/$MODEL_NAME/hf-trained/"),
        ("HF_MODEL_NAME", _q(run.export_model)),
        ("POST_TRAIN_PATH", f"$BASE_OUTPUT_DIRECTORY/$RUN_NAME/checkpoints/actor/{step_dir}/model_params"),
    ]
    return {"convert": convert, "train": convert + train, "export": convert + train + export}[step]


def overrides(run: Run, step: str, at: Placement = VM) -> dict[str, str]:
    """The step's `key=value` arguments (values as shell text), with the step's `--set`s applied last. In a slice's
    CPU pod the export runs as MaxText's convert_checkpoint.md runs to_huggingface on a CPU machine (`hardware=cpu
    skip_jax_distributed_system=true`): with base.yml's defaults it calls jax.distributed.initialize(), which no
    TPU host answers there ("coordinator_address should be defined", seen in the real-MaxText tier)."""
    zarr = "$((1 - USE_PATHWAYS))"
    mapping = {
        "convert": {
            "model_name": '"${MODEL_NAME?}"',
            "base_output_directory": '"${MODEL_CHECKPOINT_DIRECTORY?}"',
            "scan_layers": "True",
            "use_multimodal": "False",
            "hardware": "cpu",
            "skip_jax_distributed_system": "true",
            "checkpoint_storage_use_zarr3": zarr,
            "checkpoint_storage_use_ocdbt": zarr,
            "--lazy_load_tensors": '"${LAZY_LOAD_TENSORS?}"',
        },
        "train": {
            "model_name": '"${MODEL_NAME?}"',
            "load_parameters_path": '"${MAXTEXT_CKPT_PATH?}"',
            "run_name": '"${RUN_NAME?}"',
            "base_output_directory": '"${BASE_OUTPUT_DIRECTORY?}"',
            "chips_per_vm": '"${CHIPS_PER_VM?}"',
            "num_batches": '"${NUM_BATCHES?}"',
            "num_test_batches": str(run.test_batches),
            **run.row.rollout_parallelism(),
        },
        "export": {
            "model_name": '"${HF_MODEL_NAME?}"',
            "load_parameters_path": '"${POST_TRAIN_PATH?}"',
            "base_output_directory": '"${HF_EXPORT?}"',
            "scan_layers": "True",
            "use_multimodal": "False",
            "weight_dtype": "bfloat16",
        },
    }[step]
    mapping["jax_cache_dir"] = '"${COMPILE_CACHE?}"'  # compile_cache_lines
    if step == "convert" and run.row.eager_load_method:
        mapping["--eager_load_method"] = run.row.eager_load_method
    if step == "export" and at.pod:
        mapping.update(hardware="cpu", skip_jax_distributed_system="true")
    if step == "train":
        added = {**run.row.rollout_overrides(), **run.data_overrides()}
        mapping.update({key: _q(value) for key, value in added.items()})
        if run.checkpoint_period != MAXTEXT_CHECKPOINT_PERIOD:
            mapping["checkpoint_period"] = str(run.checkpoint_period)
        # an intermediate evaluation after each checkpoint's batch (trainers/post_train/rl/hooks.py), on
        # the test set of the pre- and post-training ones: `invoke export` exports the best scored checkpoint
        if run.eval_interval != MAXTEXT_EVAL_INTERVAL:
            mapping["eval_interval"] = str(run.eval_interval)
        if run.checkpoints_to_keep != MAXTEXT_CHECKPOINTS_TO_KEEP:
            mapping["max_num_checkpoints_to_keep"] = str(run.checkpoints_to_keep)
        # MaxText 0.2.3 (model_creation_utils.create_models_and_meshes) clones the reference model into the actor on
        # the same mesh instead of restoring the same weights a second time; a resumed run's actor is then restored
        # from its own checkpoint by the trainer, as without it, and train_rl checks that the reference is unchanged
        mapping["load_checkpoint_only_once"] = "true"
        # the learning rate's warm-up and decay over this run's steps, as MaxText's get_optimizer means its default
        # (-1): its config resolves -1 to base.yml's `steps` (150001) first, so the warm-up would last 15,000 steps and
        # the rate stay about 0 through any run this short (configs/types.py; utils_rl.get_optimizer)
        mapping["learning_rate_schedule_steps"] = str(run.train_steps)
    mapping.update({key: _q(value) for key, value in run.sets.get(step, {}).items()})
    return mapping


def token_lines(needed: bool, pod: bool = False) -> list[str]:
    """Bash that puts the host's Hugging Face token into HF_TOKEN, read from its file: never a command line. A job
    that `needed` it (a gated model's: checks.require_token asks the laptop for it first) stops without it; another
    uses it if it is there. A slice's pod has HF_TOKEN from its Secret already, or not at all."""
    if pod:
        return [POD_TOKEN_CHECK] if needed else []
    exported = f"HF_TOKEN=$(cat {TOKEN_FILE}); export HF_TOKEN"
    if not needed:
        return [f"[ ! -s {TOKEN_FILE} ] || {{ {exported}; }}"]
    return [
        f"[ -s {TOKEN_FILE} ] || {{ echo 'no Hugging Face token in {TOKEN_FILE} on this host; "
        "fix: HF_TOKEN=... uv run invoke provision --tags token' >&2; exit 1; }",
        exported,
    ]


#: Converted checkpoints kept on the data disk, one per model: /dev/shm loses them at every reboot.
KEPT = f"{ROOT}/converted"
KEPT_LINE = "tpu-grpo: converted checkpoint"


def kept_conversion(run: Run) -> str:
    """Where the data disk keeps the converted checkpoint of these conversion inputs."""
    digest = hashlib.sha256(json.dumps(run.inputs("convert"), sort_keys=True).encode()).hexdigest()[:12]
    return f"{KEPT}/{run.model}-{digest}"


def downloaded_model(run: Run) -> str:
    """Where provisioning downloads the model the conversion reads (playbooks/host.yml, "model download")."""
    return f"{BASE_MODELS}/{run.row.hf_id}"


def _restore_or_keep(run: Run) -> tuple[list[str], list[str]]:
    """Bash around a conversion into /dev/shm: before it, restore the copy the data disk keeps of the
    same conversion (same inputs, same MaxText version, every file checked) and stop there; after it,
    keep a copy (replacing the model's older one). Keeping is best effort: the conversion stands."""
    from tpu_grpo.host.artifacts import SUMS, save_script

    kept = kept_conversion(run)
    inputs = shlex.quote(json.dumps(run.inputs("convert"), sort_keys=True))
    before = [
        f"kept={kept}",
        f"version=$({remote.run('maxtext_version')}\n)",
        f'if [ -f "$kept/{SUMS}" ] && [ "$(cat "$kept.inputs" 2>/dev/null)" = {inputs} ] '
        '&& [ "$(cat "$kept.maxtext" 2>/dev/null)" = "$version" ]; then',
        '  rm -rf "$MODEL_CHECKPOINT_DIRECTORY" && mkdir -p "$MODEL_CHECKPOINT_DIRECTORY"',
        '  cp -a "$kept/." "$MODEL_CHECKPOINT_DIRECTORY"',
        f'  if (cd "$MODEL_CHECKPOINT_DIRECTORY" && sha256sum -c --quiet {SUMS}); then',
        f'    echo "{KEPT_LINE} restored from $kept (MaxText $version, the same conversion): not converted again"',
        "    exit 0",
        "  fi",
        f'  echo "{KEPT_LINE} in $kept does not match its {SUMS}: converting again"',
        "fi",
    ]
    after = [
        f"rm -rf {KEPT}/{run.model}-* && mkdir -p {KEPT}",
        "if bash <<'TPU_GRPO_KEEP'",
        save_script(f"{run.store.root}/{run.model}/mt-format", kept).rstrip("\n"),
        "TPU_GRPO_KEEP",
        "then",
        f'  echo {inputs} > "$kept.inputs" && echo "$version" > "$kept.maxtext"',
        f'  echo "{KEPT_LINE} kept in $kept: a VM that reboots restores it instead of converting again"',
        "else",
        f'  rm -rf "$kept" "$kept.partial"; echo "{KEPT_LINE} not kept (no room on the data disk?): a reboot '
        'converts again"',
        "fi",
    ]
    return before, after


#: Entries that compile in under JAX's default second are kept too where the cache is the data disk, on which writing
#: one costs little (marin and tpu-inference's CI set the minimum to 0); in a bucket each entry costs a round trip
#: to read, more than the quickest compilations take, so a slice keeps JAX's default.
KEEP_EVERY_COMPILATION = "export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0"


#: JAX 0.10.1 turns on an XLA GPU cache inside the compile cache by default (jax_persistent_cache_enable_xla_caches:
#: xla_gpu_per_fusion_autotune_cache_dir), whose path then enters every entry's key through the compile options: a
#: cache reached by another path (another home, another user) would never hit. A TPU or CPU has no use for it.
PATH_FREE_KEYS = "export JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none  # keys that do not hold the cache's path"


def compile_cache_name(run: Run, step: str, slice_shape: str = "") -> str:
    """The compile cache's folder below its versions: where the step compiles (the VM's machine; a slice's shape for
    its training, its CPU pool otherwise), the model, and the step's settings that fix what it compiles (its
    `--set`s; the training's data and loss), so that a folder with entries means a warm start. JAX's own key
    (jaxlib, XLA flags, devices, the program) still guards each entry."""
    settings = {"sets": dict(run.sets.get(step, {})), **({"data": run.data_overrides()} if step == "train" else {})}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    where = (slice_shape if step == "train" else "cpu-pool") if slice_shape else run.machine.machine_type
    return f"{where}/{run.model}/{step}-{digest}"


def compile_cache_lines(run: Run, step: str, at: Placement = VM) -> list[str]:
    """Bash that names and makes the step's compile cache and says whether this start is warm; MaxText's
    jax_cache_dir and (the trainer's rollout) tpu-inference's VLLM_XLA_CACHE_PATH both point there. If the cache
    cannot be had, the step runs on, compiling everything (MaxText's own ~/jax_cache)."""
    from tpu_grpo.host.remote.compile_cache import LINE

    named = compile_cache_name(run, step, at.slice_shape)
    make = remote.run("compile_cache", {"root": at.compile_cache_root(run), "named": named, "mode": "make"})
    lines = [
        f"COMPILE_CACHE=$({make}\n) || {{ COMPILE_CACHE=$HOME/jax_cache; "
        f"echo '{LINE} unavailable: this start compiles everything' >&2; }}",
        "export COMPILE_CACHE",
        PATH_FREE_KEYS,
    ]
    if step == "train":
        lines.append('export VLLM_XLA_CACHE_PATH="$COMPILE_CACHE"  # tpu-inference sets JAX\'s cache to it')
    return lines if at.pod else [*lines, KEEP_EVERY_COMPILATION]


def script(run: Run, step: str, at: Placement = VM) -> str:
    """The whole remote script of one step: what `--dry-run` prints and what the job runs."""
    return "\n".join(BUILDERS[step](run, at)) + "\n"


def _call(run: Run, step: str, at: Placement, *more: str) -> str:
    """`MODULE key=value ...`: the step's MaxText call, its arguments one a line."""
    return " \\\n".join(
        [MODULES[step], *(f"    {key}={value}" for key, value in overrides(run, step, at).items()), *more]
    )


def convert_script(run: Run, at: Placement) -> list[str]:
    """The tutorial's section 4: on a VM, from the model provisioning downloaded when it did (else MaxText
    downloads it), and into /dev/shm from the copy the data disk keeps of the same conversion."""
    before, after = _restore_or_keep(run) if run.store.name == "shm" else ([], [])
    more = []
    if not at.pod:
        before = [
            f"hf_model_path={downloaded_model(run)}",
            '[ -f "$hf_model_path.complete" ] || hf_model_path=',
            *before,
        ]
        more = ['    ${hf_model_path:+--hf_model_path="$hf_model_path"}']
    command = [f"python3 -m {_call(run, 'convert', at, *more)}{at.background}"]
    return [
        *at.prologue("convert", run),
        *at.exports(run, "convert"),
        *before,
        *compile_cache_lines(run, "convert", at),
        *at.supervised(command),
        *after,
    ]


def train_script(run: Run, at: Placement) -> list[str]:
    """The tutorial's section 5: through run_module, which ends the process MaxText's grading pool would keep from
    exiting; it says which checkpoint train_rl resumes from (for the progress bar), and on a VM its output goes
    through the keeper of the best scored checkpoint."""
    newest = " | grep -E '^[0-9]+$' | sort -n | tail -1"
    listing = (  # a bucket's steps: with its client, which `ls` is not
        remote.run("folder_children", {"folder": paths(run)["checkpoints"], "committed": COMMIT_FILE}, then=newest)
        if run.store.name == "gs"
        else f'ls -1 "$BASE_OUTPUT_DIRECTORY/$RUN_NAME/checkpoints/actor"{newest}'
    )
    written, keeper = keeper_lines(run, at)
    piped = f" 2>&1 | {keeper}" if keeper else ""
    command = [*written, remote.run("run_module", command_line=_call(run, "train", at), then=piped or at.background)]
    return [
        *at.prologue("train", run),
        *at.exports(run, "train"),
        f"newest=$( ({listing}\n) 2>/dev/null || true)",
        f'[ -z "$newest" ] || echo "{RESUMES} $newest"',
        *compile_cache_lines(run, "train", at),
        *at.supervised(command),
    ]


def export_script(run: Run, at: Placement) -> list[str]:
    """The tutorial's section 6: the chosen checkpoint (the kept copy of the best scored one, where the manager
    deleted it), scored once on the report examples on a VM, then the tokenizer the run trained with."""
    kept = []
    if at.keeps_best(run):  # the best scored checkpoint, kept from the manager's deletion (keeper_lines)
        folder = f'"$BASE_OUTPUT_DIRECTORY/$RUN_NAME/{KEPT_FOLDER}/{run.export_step}/model_params"'
        kept = [f'[ -d "$POST_TRAIN_PATH" ] || [ ! -d {folder} ] || POST_TRAIN_PATH={folder}']
    command = [f"python3 -m {_call(run, 'export', at)}{at.background}"]
    return [
        *at.prologue("export", run),
        *at.exports(run, "export"),
        *kept,
        f'echo "tpu-grpo: exports checkpoint {run.export_step}, {export_reason(run)}"',  # in its log
        *([] if at.pod or not run.report_batches else report_lines(run)),
        *compile_cache_lines(run, "export", at),
        *at.supervised(command),
        *trained_tokenizer(run),
    ]


BUILDERS = {"convert": convert_script, "train": train_script, "export": export_script}


def keeper_lines(run: Run, at: Placement) -> tuple[list[str], str]:
    """(bash that writes the keeper, the command the training's output is piped into), or nothing to pipe into."""
    if not at.keeps_best(run):
        return [], ""
    where = paths(run)
    data = {
        "checkpoints": where["checkpoints"],
        "kept": where["kept"],
        "iterations": run.iterations,
        "period": run.checkpoint_period,
        "last": run.train_steps,
        "pattern": EVAL.pattern,
        "field": EVAL_FIELD.pattern,
    }
    written, command = remote.filter_into("keep_best", data, "keeper")
    return [written], command


def report_lines(run: Run) -> list[str]:
    """Bash before a VM's export: train_rl scores the exported checkpoint on the report examples, once, and trains
    nothing (num_batches 0: its trainer then raises StopIteration on the empty data, after the score): its
    "Pre RL Training" evaluation is the score a user quotes, on examples no choice was made on. A failure leaves the
    export without that score, never without its model."""
    examples = run.report_examples
    mapping = {
        **overrides(run, "train"),
        "load_parameters_path": '"${POST_TRAIN_PATH?}"',
        # a folder of its own, removed after: train_rl would restore a checkpoint it found in its run's folder
        "base_output_directory": '"${report?}"',
        "num_batches": "0",
        "num_test_batches": str(examples.stop // run.eval_batch_size),
        "test_batch_start_index": str(examples.start),
        "eval_interval": "0",
    }
    call = " \\\n".join([MODULES["train"], *(f"    {key}={value}" for key, value in mapping.items())])
    return [
        f'echo "{REPORT_LINE} {run.export_step} on test examples {examples.start} to {examples.stop}"',
        *compile_cache_lines(run, "train"),
        "report=$(mktemp -d)",
        remote.run("run_module", command_line=call, then=' 2>&1 | tee "$report/log" || true'),
        f'if grep -q "{PRE_EVAL}" "$report/log"; then',
        f'  echo "{REPORT_LINE} done: train_rl then stops at its training of no batches (StopIteration), as meant"',
        "else",
        '  echo "tpu-grpo: the report evaluation failed: the export goes on, without its score"',
        "fi",
        'rm -rf "$report"',
    ]


def trained_tokenizer(run: Run) -> list[str]:
    """Bash after to_huggingface, which saves the tokenizer of HF_IDS[export name]: the tokenizer the run trained with
    (its chat template) in its place, where the two differ (the tutorial's: the base model's, then the Instruct's)."""
    if run.training_tokenizer == MODELS[run.export_model].hf_id:
        return []
    return [
        f"# the tokenizer the run trained with, not {MODELS[run.export_model].hf_id}'s",
        remote.run("save_tokenizer", {"tokenizer": run.training_tokenizer}),
    ]


def paths(run: Run) -> dict[str, str]:
    """The tutorial's paths as the host will see them (its exports expanded), for records and checks."""
    values: dict[str, str] = {}
    for name, value in environment(run, "export"):
        if not value.startswith("$("):
            values[name] = string.Template(shlex.split(value)[0] if value.startswith("'") else value).substitute(values)
    folder = f"{values['BASE_OUTPUT_DIRECTORY']}/{run.name}"
    return {
        "checkpoint": values["MAXTEXT_CKPT_PATH"],
        "run": folder,
        "checkpoints": f"{folder}/checkpoints/actor",
        "kept": f"{folder}/{KEPT_FOLDER}",
        "post_train": values["POST_TRAIN_PATH"],
        "hf_export": values["HF_EXPORT"],
        "run_export": f"{folder}/{EXPORT_FOLDER}",
        "shm_model": f"/dev/shm/{run.model}",
    }


def runs_folder(store: Store, model: str) -> str:
    """A store's folder of a model's runs (BASE_OUTPUT_DIRECTORY, expanded)."""
    return f"{store.root}/{model}/{RUNS_FOLDER}"

"""The stacks the real-MaxText tier runs, and everything it changes to run them on a CPU at tiny scale, in one place.

A test's run is made as `invoke pipeline` makes it: the stack file a user writes (Pulumi.dev.yaml with the model, a
short run and, for a slice, its bucket) -> settings.parse -> Settings.training -> pipeline.build_run, the tier's
changes given as a user gives changes, `--set`s; and its scripts are the ones the job runs (maxtext.script on one VM,
the container's command and environment of slice_jobs.manifest in a slice). What differs from production:

- `--set`s: tier_sets (the model's config shrunk, local rows, short sequences, a learning rate a few steps show).
- The environment: cpu_environment, chips_as_devices, pod_environment, bucket_environment (each with its
  reason).
- Code: standin/sitecustomize.py (vLLM's rollout, the tiny model's config in MaxText's table).
- Pathways cannot run here: its proxy, resource manager and workers are Google's TPU-only images. A slice's training
  runs as one CPU process that sees the slice's chips as CPU devices, as Pathways shows the trainer every chip of the
  slice in one process (JAX_PLATFORMS=cpu in place of proxy). The bucket is the Cloud Storage emulator the tests run.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.maxtext.families import Family
from tests.support import ROOT
from tpu_grpo.catalog.accelerators import ACCELERATORS, ONE_VM, SLICES
from tpu_grpo.catalog.models import MODELS
from tpu_grpo.cloud import jobset
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.settings import Settings
from tpu_grpo.jobs import maxtext, pipeline, slice_jobs

BATCHES, MORE_BATCHES = 4, 6
RUN_NAME = "tier"
#: What the stand-in rollout says in the job's log before each batch it answers: the digest of the weights it answers
#: with (standin/sitecustomize.py; readback.digest takes the same of a checkpoint).
WEIGHTS_LINE = "tier rollout: answers with weights"
TOKEN = "hf_tier_token"


def placements(models, every: bool = False) -> list[tuple[str, str]]:
    """(model, placement): one VM where the model fits one; a slice where it fits none, or where the export swaps the
    tokenizer (the export name's for the one the run trained with: the slice's export brings it through the bucket),
    since a slice runs the same scripts otherwise; `every`: a slice for every model too."""
    return [
        (model, placement)
        for placement in ("vm", "slice")
        for model in models
        if (placement == "slice" and (every or swaps_tokenizer(model) or not fits_one_vm(model)))
        or (placement == "vm" and fits_one_vm(model))
    ]


def fits_one_vm(model: str) -> bool:
    return MODELS[model].fits(ACCELERATORS[ONE_VM])


def swaps_tokenizer(model: str) -> bool:
    return MODELS[model].training_tokenizer != MODELS[MODELS[model].export_model].hf_id


#: The one VM row whose checkpoints and runs are on the data disk (the `disk` store), the others' in /dev/shm (the
#: stack's default): the keeper's hard links, the export's kept copy and the report on the disk's filesystem.
ON_THE_DATA_DISK = "qwen2.5-7b"


def stack(model: str, placement: str, bucket: str | None = None) -> Settings:
    """The stack a user would write for this run: the shipped Pulumi.dev.yaml with the model and a short run (a
    checkpoint every 2 steps, 3 kept, 1 on a VM, on the data disk for ON_THE_DATA_DISK); a slice's is the smallest
    slice that holds the model, with its runs in gs://`bucket` and Pathways (which the settings require of a slice)."""
    raw = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    raw.update(
        {
            "tpu-grpo:model": model,
            "tpu-grpo:batches": BATCHES,
            "tpu-grpo:testBatches": 2,
            "tpu-grpo:reportBatches": 1,
            "tpu-grpo:checkpointPeriod": 2,
            # one VM keeps the newest only: its training's keeper keeps the best scored (remote/keep_best.py)
            "tpu-grpo:checkpointsToKeep": 1 if placement == "vm" else 3,
        }
    )
    if placement == "vm" and model == ON_THE_DATA_DISK:
        raw["tpu-grpo:checkpointStore"] = "disk"
    if placement == "slice":
        smallest = next(shape.name for shape in SLICES.values() if MODELS[model].fits(shape))
        raw.update(
            {"tpu-grpo:slice": smallest, "tpu-grpo:checkpointStore": f"gs://{bucket}", "tpu-grpo:usePathways": True}
        )
    return settings_module.parse(raw, "tier", ROOT, lenient=True)  # lenient: the project and key are placeholders


def tier_sets(family: Family, data: Path, in_slice: bool) -> dict[str, dict[str, str]]:
    """The tier's `--set`s, step -> key -> value, each for its reason."""
    shrunk = family.maxtext_overrides  # MaxText's side of the tiny checkpoint: its config shrunk to match
    return {
        "convert": shrunk,
        "train": {
            **shrunk,
            # GSM8K-shaped rows on the disk (families.write_gsm8k): the Hub stand-in serves models, not datasets
            "hf_train_files": str(data / "train.parquet"),
            "hf_eval_files": str(data / "test.parquet"),
            "batch_size": "4",  # 4 prompts x 2 generations: one sequence for each of the trainer's 8 devices
            "max_prefill_predict_length": "128",
            "max_target_length": "160",  # short sequences compile in seconds
            # 4 steps at 3e-6 would not move a weight past bfloat16's rounding in the export; at 2e-3 the rollout's
            # greedy choice (standin/sitecustomize.py) turns right on a few more questions a checkpoint
            "learning_rate": "2e-3",
            # one grading process, spawned once: MaxText sizes its pool by the answers a call grades (one in an
            # evaluation, a batch's in training) and spawns it anew at each change, seconds each on two cores
            "math_verify_num_procs": "1",
        },
        # MaxText's export calls jax.distributed.initialize() for hardware=tpu (max_utils.
        # maybe_initialize_jax_distributed_system); on a TPU VM JAX's GceTpuCluster answers it from libtpu's chips and
        # the VM's metadata server (tpu-env), neither of which a CPU machine has. A slice's export skips it itself.
        "export": {**shrunk, **({} if in_slice else {"skip_jax_distributed_system": "true"})},
    }


def run(chosen: Settings, family: Family, data: Path, in_slice: bool, batches: int | None = None) -> maxtext.Run:
    """The run `invoke pipeline --run-name tier [--batches N] --set ...` makes of the stack, the tier's `--set`s given
    as flags."""
    sets = [
        f"{step}:{key}={value}"
        for step, values in tier_sets(family, data, in_slice).items()
        for key, value in values.items()
    ]
    return pipeline.build_run(chosen, batches=batches, run_name=RUN_NAME, sets=sets)


def script(chosen: Settings, run: maxtext.Run, step: str) -> tuple[str, dict[str, str]]:
    """The script a step's job runs and what its environment adds: a VM's job script; in a slice, the command and
    environment of the step's pod (the Pathways head's container for the training) as its JobSet declares them."""
    if not chosen.tpu_slice:
        return maxtext.script(run, step), chips_as_devices(chosen.chips)
    manifest = slice_jobs.manifest(chosen, run, step)
    head = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = next(each for each in head["containers"] if each["name"] == jobset.CONTAINER)
    assert container["command"][:2] == ["bash", "-c"]
    # the training sees the slice's chips (through Pathways); the CPU pool's pods, JAX's one CPU device
    return container["command"][2], {
        **pod_environment(container["env"]),
        **(chips_as_devices(chosen.chips) if step == "train" else {}),
    }


def chips_as_devices(chips: int) -> dict[str, str]:
    """A TPU's chips as as many CPU devices."""
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={chips}"}


#: What the tier does with a slice's pod environment: the token Secret's value given; what names Pathways' parts
#: (the head's address, the proxy) left out and JAX on the CPU, since Pathways cannot run here.
POD_CHANGES = {"JAX_PLATFORMS": "cpu", "JAX_BACKEND_TARGET": None, "PATHWAYS_HEAD": None, "HF_TOKEN": TOKEN}
#: What GKE puts in every pod.
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def pod_environment(declared: list[dict]) -> dict[str, str]:
    found = {**KUBERNETES, **{each["name"]: each.get("value") for each in declared}}
    for name, value in POD_CHANGES.items():
        if name in found:
            found[name] = value
    assert all(value is not None or name in POD_CHANGES for name, value in found.items()), found  # no other reference
    return {name: value for name, value in found.items() if value is not None}


def cpu_environment(family: Family) -> dict[str, str]:
    """JAX on the CPU, and the tiny model's config for MaxText's table (standin/sitecustomize.py)."""
    return {
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT / "tests/maxtext/standin"),
        "TPU_GRPO_TINY_MODEL_NAME": family.model,
        "HF_DATASETS_OFFLINE": "1",  # the rows are files: the datasets library asks the Hub nothing
        "TPU_GRPO_WEIGHTS_LINE": WEIGHTS_LINE,
    }


def bucket_environment(emulator: str) -> dict[str, str]:
    """Every client of the bucket pointed at the Cloud Storage emulator: google-cloud-storage (MaxText's gcs_utils,
    tpu-grpo's host programs) and gcsfs read STORAGE_EMULATOR_HOST; TensorStore (Orbax's arrays) its GCS driver's own
    endpoint and test token, as TensorStore's GCS tests set them; and etils' epath (Orbax's files, JAX's compile cache)
    goes through gcsfs, since TensorFlow's GCS file system, its default where TensorFlow is installed, takes no
    endpoint (only www.googleapis.com)."""
    return {
        "STORAGE_EMULATOR_HOST": emulator,
        "TENSORSTORE_GCS_HTTP_URL": emulator,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "tier",
        "EPATH_USE_TF": "false",
        "GOOGLE_CLOUD_PROJECT": "tier",
    }

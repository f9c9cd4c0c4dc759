"""Where MaxText's converted checkpoint and training runs live (`tpu-grpo:checkpointStore`: /dev/shm,
the data disk or a gs:// bucket), what survives there, and how often a training run writes a
checkpoint by default (on every store alike).

MaxText 0.2.3's `train_rl`, restarted with the same run_name and base_output_directory,
restores the newest checkpoint under `checkpoints/actor/` and goes on from its step; it writes
one every `checkpoint_period` steps (and the last) and keeps the newest
`max_num_checkpoints_to_keep`. So a run survives losing the VM exactly when its checkpoints are
kept somewhere the VM's loss does not take, and loses at most `checkpoint_period` steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: MaxText 0.2.3's rl.yml defaults, which the tutorial's command line leaves as they are.
MAXTEXT_CHECKPOINT_PERIOD = 50
MAXTEXT_CHECKPOINTS_TO_KEEP = 10
#: tpu-grpo's: a checkpoint every 10 steps, each scored by an intermediate evaluation (MaxText's eval_interval is
#: 10), so the tutorial's 50 batches have five to choose the best from where MaxText's 50 gives one; the newest 2
#: kept, and the best beside them (the keeper); a lost VM's run resumes at most 10 steps back.
CHECKPOINT_PERIOD = 10
CHECKPOINTS_TO_KEEP = 2
#: The file Orbax writes last into a checkpoint's step folder on Cloud Storage, where it writes the folder in place
#: (its CommitFileTemporaryPath, the default for gs:// paths: orbax/checkpoint/_src/path/atomicity_defaults.py); a
#: step folder without it is a save cut short (a preempted slice). Elsewhere Orbax writes STEP.orbax-checkpoint-tmp-*
#: and renames it: a folder named by its step alone is whole.
COMMIT_FILE = "commit_success.txt"
#: Room left over beside what a run writes, GB.
MARGIN_GB = 4.0
#: A Cloud Storage store: gs://BUCKET or gs://BUCKET/PREFIX (the bucket's name checked by values.bucket).
BUCKET_URL = re.compile(r"gs://(?P<bucket>[a-z0-9_.-]{1,222})(?P<prefix>(/[A-Za-z0-9_.-]+)*)/?")


#: What a Hyperdisk Balanced volume includes at no extra charge (Google's "About Hyperdisk Balanced": "up to 3,000
#: IOPS and 140 MiB/s of throughput"; provisioned performance above them is billed).
INCLUDED_IOPS, INCLUDED_THROUGHPUT_MIBPS = 3000, 140


@dataclass(frozen=True)
class Store:
    name: str
    #: The folder that holds `$MODEL_NAME/mt-format/` (the converted checkpoint) and
    #: `$MODEL_NAME/post-train/` (the runs), as the host's shell writes it.
    root: str
    survives: str
    #: The data disk's provisioned performance by default: what the store writes there. Only the disk store writes
    #: checkpoints to it (paid IOPS and throughput: a checkpoint of the 8B model in about 20 s); the others, a saved
    #: model now and then, which the included performance serves.
    disk_iops: int = INCLUDED_IOPS
    disk_throughput_mibps: int = INCLUDED_THROUGHPUT_MIBPS


STORES: dict[str, Store] = {
    store.name: store
    for store in (
        # The tutorial's: RAM, the fastest to write; a reboot, a preemption or the VM's deletion empties it.
        Store(
            "shm",
            "/dev/shm",
            "nothing: a reboot, a preemption or the VM's end empties /dev/shm",
        ),
        # ~/tpu-grpo is the data disk's (playbooks/host.yml, "caches on the data disk"), which outlives the
        # VM and is attached to the next one.
        Store(
            "disk",
            "~/tpu-grpo/maxtext",
            "a reboot, a preemption and the VM's deletion: the data disk stays",
            disk_iops=10_000,
            disk_throughput_mibps=2400,
        ),
    )
}


def store_for(value: str) -> Store:
    """The store a `checkpointStore` value names (checked by the settings first)."""
    if value in STORES:
        return STORES[value]
    # A bucket outlives the VM, its disks and the stack's teardown; Orbax and MaxText write gs:// paths
    # as they write local ones. tpu-grpo itself reads it from the laptop (tpu_grpo/host/gcs.py).
    return Store(
        "gs",
        value.rstrip("/"),
        "everything: a bucket outlives the VM, its disks and the stack",
    )


def bucket_of(store: Store) -> str | None:
    """The bucket of a Cloud Storage store, else None."""
    found = BUCKET_URL.fullmatch(store.root) if store.name == "gs" else None
    return found["bucket"] if found else None


def need_gb(store: Store, checkpoints_to_keep: int, weights_gb: float, checkpoint_gb: float) -> dict[str, float]:
    """Free space (GB) a run needs in /dev/shm and on the data disk, from the model's bfloat16 weights (the converted
    checkpoint, the export, the saved model) and a training checkpoint (weights and moments): the shm store holds
    the converted checkpoint, the kept training checkpoints and the export in /dev/shm, and keeps a copy of the
    conversion on the data disk beside the saved model; the disk store writes the conversion and the kept
    checkpoints to the data disk, the export to /dev/shm; a bucket's space is not the VM's. Beside a one-VM store's
    checkpoints, the weights of the best scored one once the manager deletes it (the training's keeper,
    tpu_grpo/host/remote/keep_best.py)."""
    kept = weights_gb
    if store.name == "shm":
        need = {"shm": weights_gb + checkpoint_gb * checkpoints_to_keep + kept + weights_gb, "data": 2 * weights_gb}
    elif store.name == "gs":
        need = {"shm": weights_gb, "data": weights_gb}
    else:
        need = {"shm": weights_gb, "data": 2 * weights_gb + checkpoint_gb * checkpoints_to_keep + kept}
    return {where: round(gb + MARGIN_GB, 1) for where, gb in need.items()}


def default_need_text(model) -> str:
    """`148.5,36.1 on shm, 20.1,148.5 on disk`: what `--need-gb` defaults to for `model` (a model table row) on each
    store of one VM, as the help and the docs say it."""
    found = {
        name: need_gb(store, CHECKPOINTS_TO_KEEP, model.weights_gb, model.checkpoint_gb)
        for name, store in STORES.items()
    }
    return ", ".join(f"{need['shm']:g},{need['data']:g} on {name}" for name, need in found.items())

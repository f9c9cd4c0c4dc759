"""Each family of the model table converts, trains and exports under MaxText 0.2.3's own code, from the scripts
tpu-grpo generates (the text `--dry-run` prints), on one VM and in a slice's pods; and what tpu-grpo reads back
(checkpoints, progress, evaluations, resumption, the export) is what MaxText really wrote."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from tests.maxtext.families import FAMILIES, ROWS
from tests.support import MAXTEXT_VENV as VENV, ROOT
from tpu_grpo.config import models
from tpu_grpo.host import facts
from tpu_grpo.jobs import maxtext, pipeline, progress
from tpu_grpo.config.accelerators import MACHINES
from tpu_grpo.config.stores import STORES

BATCHES, MORE_BATCHES = 4, 6


def tier_run(host, in_slice: bool) -> maxtext.Run:
    """The stack's defaults for the model (checkpoints on the data disk, every 2 steps), shrunk by `--set`s: the
    model's config, the local GSM8K rows, a small batch, short sequences. A machine of the family's chips, each a
    CPU device here; a mixture of experts multiplies densely (MaxText's sparse kernels are Pallas, TPU-only).
    The export of one VM skips JAX's distributed start-up, which a TPU VM's own cluster detection answers and a CPU
    cannot (on a slice's CPU pod the script says so itself)."""
    family, row = host.family, maxtext.MODELS[host.family.model]
    shrink = family.maxtext_overrides
    train = {**shrink, "hf_train_files": str(host.data / "train.parquet"),
             "hf_eval_files": str(host.data / "test.parquet"),
             "batch_size": str(max(2, family.chips // 2)),  # its prompts x 2 generations spread over the chips
             "max_prefill_predict_length": "128",
             "max_target_length": "160", "eval_interval": "2"}
    return maxtext.Run(model=family.model, export_model=row.export_model, batches=BATCHES, test_batches=2,
                       use_pathways=False, lazy_load_tensors=row.eager_load_method is None,
                       machine=next(row for row in MACHINES.values() if row.chips == family.chips),
                       run_name="tier", store=STORES["disk"], checkpoint_period=2, checkpoints_to_keep=3,
                       sets={"convert": shrink, "train": train,
                             "export": {**shrink, **({} if in_slice else {"skip_jax_distributed_system": "true"})}})


def tail(done, lines: int = 40) -> str:
    return "\n".join((done.stdout + done.stderr).splitlines()[-lines:])


#: One row of each family; every row with TPU_GRPO_MAXTEXT_ROWS=all (docs/development.md).
TESTED = ROWS if os.environ.get("TPU_GRPO_MAXTEXT_ROWS") == "all" else FAMILIES


# every family on a VM first, then in a slice: a slice's training finds the compile cache its VM's left (workers
# take tests in this order)
@pytest.mark.parametrize("model", list(TESTED))
@pytest.mark.parametrize("placement", ["vm", "slice"])
def test_a_family_converts_trains_resumes_and_exports(make_host, model, placement):
    host, in_slice = make_host(TESTED[model]), placement == "slice"
    run = tier_run(host, in_slice)
    where = maxtext.paths(run)
    cached = host.keep_compile_caches(maxtext.compile_cache_root(run, in_slice))

    convert = host.run(maxtext.script(run, "convert", in_slice=in_slice), in_slice=in_slice)
    assert convert.returncode == 0, tail(convert)
    assert (host.path(where["checkpoint"]) / "_METADATA").is_file()  # where the training loads it from

    train = host.run(maxtext.script(run, "train", in_slice=in_slice), in_slice=in_slice)
    assert train.returncode == 0, tail(train)
    events = progress.parse_lines((train.stdout + train.stderr).splitlines())
    steps = [event.step for event in events if isinstance(event, progress.TrainStep)]
    assert steps == list(range(1, run.train_steps + 1))
    evals = [event for event in events if isinstance(event, progress.Eval)]
    assert [event.stage for event in evals][0] == "pre" and evals[-1].stage == "post"
    assert any(isinstance(event, progress.Completed) for event in events)
    checkpoints = host.path(where["checkpoints"])
    found = pipeline.CHECKPOINTS.parse(facts.Answer("\n".join(p.name for p in checkpoints.iterdir())), str(checkpoints))
    assert found[-1] == BATCHES and set(found) <= {1, 2, 4}  # every checkpoint_period steps and the last
    weighed = json.loads(subprocess.run([VENV / "bin/python", "-m", "tests.maxtext.families", "bytes",
                                         checkpoints / str(BATCHES)], cwd=ROOT, capture_output=True, text=True,
                                        check=True).stdout)
    assert weighed == {"model_params": models.WEIGHT_BYTES, "optimizer_state": models.MOMENT_BYTES}  # the disk's

    # the actor is the reference model copied, not the checkpoint restored a second time (load_checkpoint_only_once)
    assert "Creating policy model by copying reference model instead of restoring" in train.stdout + train.stderr
    first = progress.startup((train.stdout + train.stderr).splitlines(), 2026)
    cache = host.path(first["cache"]["folder"])  # JAX wrote the trainer's compiled programs there
    assert cache.is_relative_to(host.path(maxtext.compile_cache_root(run, in_slice))) and any(cache.glob("*-cache"))
    # warm exactly when an earlier training of these settings (this run's other placement, an earlier run) left
    # entries in the folder the project names for them
    assert first["cache"]["warm"] == any(entry.parent == cache.resolve() for entry in cached)
    assert first["phases"].keys() == set(progress.STARTUP_LABELS)

    longer = dataclasses.replace(run, batches=MORE_BATCHES)
    resumed = host.run(maxtext.script(longer, "train", in_slice=in_slice), in_slice=in_slice)
    assert resumed.returncode == 0, tail(resumed)
    warm = progress.startup((resumed.stdout + resumed.stderr).splitlines(), 2026)
    assert warm["cache"]["warm"] and warm["cache"]["folder"] == first["cache"]["folder"]  # batches fix no shape
    events = progress.parse_lines((resumed.stdout + resumed.stderr).splitlines())
    assert progress.Resumed(BATCHES) in events  # the script's own line, before MaxText restores it
    assert [e.step for e in events if isinstance(e, progress.TrainStep)] == list(range(BATCHES + 1, MORE_BATCHES + 1))

    export = host.run(maxtext.script(longer, "export", in_slice=in_slice), in_slice=in_slice)
    assert export.returncode == 0, tail(export)
    folder = host.path(maxtext.paths(longer)["run"] + "/hf-trained" if in_slice else maxtext.paths(longer)["hf_export"])
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [host.family.architecture]
    loaded = json.loads(subprocess.run([VENV / "bin/python", "-m", "tests.maxtext.families", "load", folder], cwd=ROOT,
                                       capture_output=True, text=True, check=True,
                                       env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout)
    assert loaded["class"] == host.family.architecture and loaded["new_tokens"] > 0
    assert loaded["unexpected_keys"] == loaded["mismatched_keys"] == []  # the class's names and shapes
    assert all(key.startswith(host.family.untrained) for key in loaded["missing_keys"]), loaded["missing_keys"]
    # the tokenizer it trained with (the reply used it), not the export name's (Llama's base), whose template differs
    assert (folder / "chat_template.jinja").read_bytes() == (host.model_folder / "chat_template.jinja").read_bytes()

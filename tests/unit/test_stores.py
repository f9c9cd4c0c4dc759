"""`tpu-grpo:checkpointStore` and how often checkpoints are written: the defaults each capacity
gets, the stores a capacity refuses, and MaxText's command lines per store, key by key against
the tutorial's."""

from __future__ import annotations

import dataclasses

import pytest

from infra import offline
from tests import tutorial
from tests.support import FLEX, ON_DEMAND, SPOT, TEST_TOKEN
from tests.tutorial import RUN, run_ours
from tpu_grpo.catalog import stores
from tpu_grpo.config.errors import BadFlag, SettingsError
from tpu_grpo.jobs import pipeline


def settings_for(stack_values, **changes):
    values = {key: value for key, value in {**stack_values, **changes}.items() if value is not None}
    return offline.run(values, "dev")[0]


@pytest.mark.parametrize(
    "changes, store, period, keep",
    [
        ({}, "shm", 10, 2),
        (ON_DEMAND, "shm", 10, 2),
        (SPOT, "disk", 10, 2),
        (FLEX, "disk", 10, 2),
        ({"tpu-grpo:checkpointStore": "disk"}, "disk", 10, 2),
        ({**SPOT, "tpu-grpo:checkpointPeriod": "5", "tpu-grpo:checkpointsToKeep": "3"}, "disk", 5, 3),
        ({**SPOT, "tpu-grpo:checkpointStore": "gs://grpo-ckpts/runs/"}, "gs://grpo-ckpts/runs/", 10, 2),
    ],
    ids=["reservation", "on-demand", "spot", "flex-start", "reservation-on-disk", "spot-chosen", "spot-bucket"],
)
def test_the_store_and_its_checkpointing_default_to_what_fits_the_capacity(stack_values, changes, store, period, keep):
    settings = settings_for(stack_values, **changes)
    assert (settings.checkpoint_store, settings.checkpoint_period, settings.checkpoints_to_keep) == (
        store,
        period,
        keep,
    )


@pytest.mark.parametrize(
    "changes, key, message",
    [
        (
            {**SPOT, "tpu-grpo:checkpointStore": "shm"},
            "tpu-grpo:checkpointStore",
            "tpu-grpo:checkpointStore='shm' loses the run with capacity spot: a preempted spot VM is deleted, and its "
            "/dev/shm with the whole run; fix: pulumi config set tpu-grpo:checkpointStore disk (or `pulumi config rm "
            "tpu-grpo:checkpointStore`: disk is this capacity's default)",
        ),
        (
            {**FLEX, "tpu-grpo:checkpointStore": "shm"},
            "tpu-grpo:checkpointStore",
            "tpu-grpo:checkpointStore='shm' loses the run with capacity flex-start: a flex-start VM is deleted at its "
            "maximum run time, and its /dev/shm with the whole run; fix: pulumi config set "
            "tpu-grpo:checkpointStore disk "
            "(or `pulumi config rm tpu-grpo:checkpointStore`: disk is this capacity's default)",
        ),
        (
            {"tpu-grpo:checkpointStore": "ram"},
            "tpu-grpo:checkpointStore",
            "tpu-grpo:checkpointStore='ram' is not a checkpoint store (shm, disk, or gs://BUCKET[/PREFIX]); fix: "
            "pulumi config set tpu-grpo:checkpointStore disk",
        ),
        (
            {"tpu-grpo:checkpointStore": "gs://Bad_Bucket"},
            "tpu-grpo:checkpointStore",
            "tpu-grpo:checkpointStore='gs://Bad_Bucket' is not a bucket name (lowercase letters, digits, '-', '_', "
            "'.'; a letter or digit first and last; 3 to 63 characters, or up to 222 with dots, 63 between them); "
            "fix: pulumi config set tpu-grpo:checkpointStore gs://bad_bucket",
        ),
        (
            {"tpu-grpo:bucket": "true"},
            "tpu-grpo:bucket",
            "tpu-grpo:bucket=true asks for a bucket, but checkpointStore is shm; fix: pulumi config set "
            "tpu-grpo:checkpointStore gs://YOUR_BUCKET/runs (or pulumi config rm tpu-grpo:bucket)",
        ),
        (
            {"tpu-grpo:checkpointPeriod": "0"},
            "tpu-grpo:checkpointPeriod",
            "tpu-grpo:checkpointPeriod='0' is not a whole number from 1 to 1000000000 steps; fix: pulumi config set "
            "tpu-grpo:checkpointPeriod 10",
        ),
        (
            {"tpu-grpo:checkpointsToKeep": "none"},
            "tpu-grpo:checkpointsToKeep",
            "tpu-grpo:checkpointsToKeep='none' is not a whole number from 1 to 1000 (digits "
            "0-9); fix: pulumi config set tpu-grpo:checkpointsToKeep 2",
        ),
        (
            {"tpu-grpo:dataDiskIops": "500"},
            "tpu-grpo:dataDiskIops",
            "tpu-grpo:dataDiskIops='500' is not a whole number from 3000 to 160000 IOPS, Hyperdisk Balanced's; fix: "
            "pulumi config set tpu-grpo:dataDiskIops 10000",
        ),
        (
            {"tpu-grpo:dataDiskThroughputMibps": "5000"},
            "tpu-grpo:dataDiskThroughputMibps",
            "tpu-grpo:dataDiskThroughputMibps='5000' is not a whole number from 140 to 2400 MiB/s, Hyperdisk "
            "Balanced's; fix: pulumi config set tpu-grpo:dataDiskThroughputMibps 2400",
        ),
    ],
    ids=[
        "spot-shm",
        "flex-shm",
        "unknown-store",
        "bad-bucket",
        "bucket-without-gs",
        "period-0",
        "keep-text",
        "iops",
        "throughput",
    ],
)
def test_a_store_that_loses_the_run_or_a_bad_value_is_one_line_before_anything_is_declared(
    stack_values, changes, key, message
):
    values = {k: v for k, v in {**stack_values, **changes}.items() if v is not None}
    mocks = offline.RecordingMocks()
    with pytest.raises(SettingsError) as raised:
        offline.run(values, "dev", mocks=mocks)
    assert mocks.resources == [] and raised.value.key == key
    assert str(raised.value) == message


def keyed(argv: list[str]) -> dict[str, str]:
    """`key=value` arguments as a mapping (the module name, argv[0], aside)."""
    return dict(arg.split("=", 1) for arg in argv if "=" in arg)


def differences(ours: dict, theirs: dict) -> dict[str, dict[str, tuple]]:
    """module -> argument -> (tutorial's value, ours), for every argument that differs or is only one side's, our
    deliberate additions aside (tests/tutorial.py OURS_ADDED)."""
    found = {}
    for module in tutorial.MODULES:
        mine = {
            key: value for key, value in keyed(ours[module]["argv"]).items() if f"{key}=" not in tutorial.OURS_ADDED
        }
        tutorials = keyed(theirs[module]["argv"])
        tutorials.pop("hf_access_token", None)  # ours is in HF_TOKEN (test_maxtext)
        found[module] = {
            key: (tutorials.get(key), mine.get(key))
            for key in sorted(mine.keys() | tutorials.keys())
            if mine.get(key) != tutorials.get(key)
        }
    return found


@pytest.mark.parametrize("setting", ["disk", "gs://grpo-ckpts/runs"])
def test_a_store_moves_only_the_checkpoints_and_runs(tmp_path, setting):
    """Convert's output, train's input and output, and export's input go to the store (the data disk's
    ~/tpu-grpo/maxtext, or the bucket); every other argument stays the tutorial's (our additions aside: the
    checkpointing is every store's)."""
    run = dataclasses.replace(RUN, store=stores.store_for(setting))
    theirs = tutorial.calls(tmp_path, TEST_TOKEN, RUN.run_name)
    ours = run_ours(tmp_path, run)
    home = ours[tutorial.MODULES[0]]["env"]["HOME"]
    root = f"{home}/tpu-grpo/maxtext" if setting == "disk" else setting
    store = f"{root}/llama3.1-8b-Instruct"
    shm = "/dev/shm/llama3.1-8b-Instruct"
    assert differences(ours, theirs) == {
        "maxtext.checkpoint_conversion.to_maxtext": {
            "base_output_directory": (f"{shm}/mt-format/", f"{store}/mt-format/")
        },
        "maxtext.trainers.post_train.rl.train_rl": {
            "base_output_directory": (f"{shm}/post-train/", f"{store}/post-train/"),
            "load_parameters_path": (f"{shm}/mt-format//0/items", f"{store}/mt-format//0/items"),
        },
        "maxtext.checkpoint_conversion.to_huggingface": {
            "load_parameters_path": (
                f"{shm}/post-train//{RUN.run_name}/checkpoints/actor/50/model_params",
                f"{store}/post-train//{RUN.run_name}/checkpoints/actor/50/model_params",
            )
        },
    }
    export = ours["maxtext.checkpoint_conversion.to_huggingface"]
    assert keyed(export["argv"])["base_output_directory"] == f"{shm}/hf-trained/"  # the export stays in RAM


def test_the_shm_store_is_the_tutorial_exactly_but_for_checkpoints_every_10_steps_each_scored(tmp_path):
    theirs = tutorial.calls(tmp_path, TEST_TOKEN, RUN.run_name)
    assert RUN.store is stores.STORES["shm"]
    ours = run_ours(tmp_path, RUN)
    assert differences(ours, theirs) == {module: {} for module in tutorial.MODULES}
    train = keyed(ours[tutorial.MODULES[1]]["argv"])
    assert (train["checkpoint_period"], train["max_num_checkpoints_to_keep"]) == ("10", "2")
    assert "eval_interval" not in train  # MaxText's own 10: each checkpoint is scored


def test_a_run_name_trained_on_one_store_is_another_training_on_another(tmp_path):
    on_disk = dataclasses.replace(RUN, store=stores.STORES["disk"])
    assert RUN.inputs("train")["store"] == "shm" and on_disk.inputs("train")["store"] == "disk"
    assert pipeline.record_key(RUN, "convert") != pipeline.record_key(on_disk, "convert")


# The 8B model: 8.03 B parameters, 16.06 GB of bfloat16 weights, 48.18 GB a checkpoint (weights and two moments),
# 4 GB of margin, and the best scored checkpoint's weights kept beside a one-VM store's checkpoints; 70B: 141.1 GB and
# 423.3 GB. Without provisioning's download, an eager conversion downloads the whole repository: Llama's holds its
# weights twice (original/), Qwen's once.
@pytest.mark.parametrize(
    "model, store, keep, need",
    [
        ("llama3.1-8b-Instruct", "shm", 2, {"shm": 148.5, "data": 36.1, "download": 32.1}),
        ("llama3.1-8b-Instruct", "disk", 2, {"shm": 20.1, "data": 148.5, "download": 32.1}),
        ("llama3.1-8b-Instruct", "disk", 3, {"shm": 20.1, "data": 196.7, "download": 32.1}),
        ("qwen3-0.6b", "disk", 2, {"shm": 5.2, "data": 14.8, "download": 1.2}),
        ("llama3.1-70b", "shm", 1, {"shm": 850.6, "data": 286.2, "download": 282.2}),
    ],
)
def test_preflight_asks_for_the_space_the_model_and_store_need(model, store, keep, need):
    run = dataclasses.replace(RUN, model=model, store=stores.STORES[store], checkpoints_to_keep=keep)
    assert pipeline.parse_need_gb(None, run) == need
    assert run.row.conversion_download_gb(lazy=True) == run.row.weights_gb  # lazily: the safetensors alone
    assert pipeline.parse_need_gb("1,2", run) == {"shm": 1.0, "data": 2.0}  # what the user asks, nothing added


@pytest.mark.parametrize("key", ["checkpoint_period", "max_num_checkpoints_to_keep", "base_output_directory"])
def test_set_cannot_override_what_a_setting_owns(key):
    from tpu_grpo.jobs import maxtext

    with pytest.raises(BadFlag, match=f"sets {key}, which comes from tpu-grpo:"):
        maxtext.parse_sets([f"{key}=1"], "train")

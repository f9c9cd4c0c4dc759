"""The model table against what the maxtext 0.2.3 wheel says (tests/data/maxtext-0.2.3-models.json), the memory
arithmetic at each boundary, each row's three scripts, and the README's table."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.support import DATA, DOUBLES, FIXTURES, ROOT, invoke
from tests.tutorial import RUN, run_ours
from tpu_grpo.catalog.accelerators import ACCELERATORS, MACHINES, SLICES
from tpu_grpo.catalog.models import MODELS
from tpu_grpo.host import remote
from tpu_grpo.jobs import maxtext

WHEEL = json.loads((DATA / "maxtext-0.2.3-models.json").read_text())
CONFIGS = WHEEL["HF_MODEL_CONFIGS"]["configs"]


def parameters(name: str) -> float:
    """A decoder's parameters (billions) from its Hugging Face config's numbers, as the wheel records them."""
    c = CONFIGS[name]
    vocab, hidden, layers, heads, kv = (
        c["vocab_size"],
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    head = c.get("head_dim") or hidden // heads
    attention = 2 * hidden * heads * head + 2 * hidden * kv * head
    attention += (heads + 2 * kv) * head if c["class"] == "Qwen2Config" else 0  # q, k, v biases
    attention += 2 * head if c["class"] in ("Qwen3Config", "Qwen3MoeConfig", "Gemma3Config") else 0  # q, k norms
    if c["class"] == "Qwen3MoeConfig":
        mlp = c["num_experts"] * 3 * hidden * c["moe_intermediate_size"] + hidden * c["num_experts"]
    else:
        mlp = 3 * hidden * c["intermediate_size"]
    norms = (4 if c["class"] == "Gemma3Config" else 2) * hidden
    tied = c.get("tie_word_embeddings", c["class"] == "Gemma3Config")
    return (vocab * hidden * (1 if tied else 2) + layers * (attention + mlp + norms) + hidden) / 1e9


@pytest.mark.parametrize("name", MODELS)
def test_every_row_is_what_maxtext_0_2_3_can_post_train(name):
    row = MODELS[name]
    assert name in WHEEL["ModelName"]["names"] and name in WHEEL["HF_MODEL_CONFIGS"]["names"]
    assert row.hf_id == WHEEL["HF_IDS"]["ids"][name]
    for table in ("PARAM_MAPPING", "HOOK_FNS", "HF_SHAPE"):
        assert row.export_model in WHEEL[table]["names"], table
    assert row.export_model in WHEEL["HF_IDS"]["ids"]
    native = (
        name.startswith(tuple(WHEEL["native_rollout_prefixes"]["prefixes"]))
        and CONFIGS[name]["class"] != "Qwen3MoeConfig"
    )  # tunix's qwen3 mapping is the dense model's
    assert row.native_rollout == native
    assert row.params_b == pytest.approx(parameters(name), rel=0.01)
    assert row.tokenizer in (None, WHEEL["rl_yml"]["tokenizer_comments"].get(name))


def test_the_70b_instruct_name_is_no_rl_model_of_0_2_3():
    """In HF_IDS, not in HF_MODEL_CONFIGS: the 70B row is the base name with the Instruct tokenizer (rl.yml)."""
    assert "llama3.1-70b-Instruct" in WHEEL["HF_IDS"]["ids"]
    assert "llama3.1-70b-Instruct" not in WHEEL["HF_MODEL_CONFIGS"]["names"] and "llama3.1-70b-Instruct" not in MODELS
    assert MODELS["llama3.1-70b"].training_tokenizer == "meta-llama/Llama-3.1-70B-Instruct"


@pytest.mark.parametrize("name", MODELS)
def test_each_model_fits_its_smallest_shape_and_no_smaller_one(name):
    row = MODELS[name]
    shapes = list(ACCELERATORS.values())
    smallest = row.smallest
    assert row.fits(smallest)
    assert not any(row.fits(shape) for shape in shapes[: shapes.index(smallest)])


@pytest.mark.parametrize(
    "name, machine, fits",
    [
        ("qwen3-8b", "ct6e-standard-8t", True),
        ("qwen3-8b", "ct6e-standard-4t", False),
        ("qwen3-14b", "ct6e-standard-8t", True),
        ("qwen3-32b", "ct6e-standard-8t", False),
        ("qwen3-0.6b", "ct6e-standard-1t", True),
        ("qwen3-4b", "ct6e-standard-1t", False),
    ],
)
def test_one_vm_fits_the_trainer_and_rollout_in_vllms_share_of_its_hbm(name, machine, fits):
    """12 bytes a parameter within 72% of 32 GB a chip: 1.9B on a v6e-1, 7.7B on a v6e-4, 15.4B on a v6e-8."""
    row, shape = MODELS[name], MACHINES[machine]
    assert row.fits(shape) == fits == (12 * row.params_b <= 0.72 * 32 * shape.chips)


@pytest.mark.parametrize(
    "name, shape, slices, fits",
    [
        ("llama3.1-70b", "v6e-64", 1, True),
        ("llama3.1-70b", "v6e-32", 1, False),
        ("llama3.1-70b", "v6e-32", 2, True),
        ("qwen3-32b", "v6e-32", 1, True),
        ("qwen3-32b", "v6e-16", 1, False),
        ("gemma3-27b", "v6e-16", 2, True),
    ],
)
def test_a_slice_fits_the_trainer_in_half_its_hbm(name, shape, slices, fits):
    row = MODELS[name]
    assert row.fits(SLICES[shape], slices) == fits == (10 * row.params_b <= 0.5 * 32 * SLICES[shape].chips * slices)


def stack(stack_dir, stack_values, **changes) -> None:
    values = {key: value for key, value in {**stack_values, **changes}.items() if value is not None}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))


@pytest.mark.parametrize("task", ["settings", "plan", "up"])
def test_a_model_on_a_machine_too_small_is_one_line_with_the_arithmetic_and_the_fix(stack_dir, stack_values, task):
    stack(stack_dir, stack_values, **{"tpu-grpo:model": "llama3.1-70b"})
    result = invoke(task, cwd=stack_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "error: tpu-grpo:model='llama3.1-70b' does not fit a v6e-8: (10 training + 2 rollout bytes) x 70.55B "
        "parameters = 847 GB, within 72% (vLLM's hbm_utilization) of 256 GB of HBM = 184 GB; the smallest v6e that "
        "holds it is a v6e-64; fix: pulumi config set tpu-grpo:slice v6e-64 (docs/slices.md)\n"
    )
    stack(stack_dir, stack_values, **{"tpu-grpo:model": "qwen3-8b", "tpu-grpo:machineType": "ct6e-standard-4t"})
    smaller = invoke(task, cwd=stack_dir)
    assert smaller.returncode == 2 and smaller.stderr.endswith(
        "the smallest v6e that holds it is a v6e-8; fix: pulumi config set tpu-grpo:machineType ct6e-standard-8t\n"
    )


def test_an_export_name_of_another_model_is_refused(stack_dir, stack_values):
    stack(stack_dir, stack_values, **{"tpu-grpo:model": "qwen3-8b", "tpu-grpo:exportModel": "llama3.1-8b"})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and result.stderr == (
        "error: tpu-grpo:exportModel='llama3.1-8b' is not a name of model qwen3-8b for to_huggingface (qwen3-8b); "
        "fix: pulumi config rm tpu-grpo:exportModel (the model table's: qwen3-8b)\n"
    )


@pytest.mark.parametrize("model", ["llama3.1-8b-Instruct", "qwen3-8b"])
def test_an_export_name_that_is_the_models_own_is_taken_and_exported_as(stack_dir, stack_values, model):
    """docs/settings.md: exportModel is the model's own name or its export name."""
    stack(
        stack_dir,
        stack_values,
        **{"tpu-grpo:model": model, "tpu-grpo:exportModel": model, "tpu-grpo:machineType": "ct6e-standard-8t"},
    )
    shown = invoke("settings", "--json", cwd=stack_dir)
    assert shown.returncode == 0, shown.stderr
    dry = invoke("export", "--run-name", "r1", "--dry-run", cwd=stack_dir)
    assert dry.returncode == 0, dry.stderr
    assert f"export HF_MODEL_NAME={model}" in dry.stdout and "export RUN_NAME=r1" in dry.stdout  # the run asked


def arguments(script: str, module: str) -> dict[str, str]:
    """The `key=value` arguments of the script's call of `module`, as bash would split them."""
    line = re.split(rf"python3 -m? ?{re.escape(module)}", script, maxsplit=1)[1]  # the training's: `python3 - MODULE`
    line = line.split(" <<'")[0].split("\n\n")[0].split("\nset +x")[0]
    words = shlex.split(line.replace("\\\n", " "))
    return dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("--"))


@pytest.mark.parametrize("name", MODELS)
def test_each_rows_scripts_pass_maxtext_only_keys_it_has(tmp_path, name):
    """Every argument of the three steps is a key of MaxText 0.2.3's config (rl.KEY: of its `rl` section); the row
    decides the model, the download, the tokenizer, the rollout and the export name."""
    row = MODELS[name]
    run = maxtext.Run(**{**RUN.__dict__, "model": name, "export_model": row.export_model})
    calls = run_ours(tmp_path, run)
    keys, rl_keys = set(WHEEL["config_keys"]["names"]), set(WHEEL["rl_keys"]["names"])
    for module, call in calls.items():
        given = dict(arg.split("=", 1) for arg in call["argv"] if "=" in arg and not arg.startswith("--"))
        assert {key for key in given if not key.startswith("rl.")} <= keys, module
        assert {key[3:] for key in given if key.startswith("rl.")} <= rl_keys, module
        assert given["model_name"] == (row.export_model if module.endswith("to_huggingface") else name)
        # scanned in every step, as MaxText's RL recipes train (test_gemma3_rl.sh: scan_layers=true on the scanned
        # checkpoint; run_qwen3_30b_rl.sh: scan_layers=True)
        assert given.get("scan_layers", "true").lower() == "true"
    train = calls[maxtext.MODULES["train"]]
    assert f"hf_model_path=~/tpu-grpo/base-models/{row.hf_id}\n" in maxtext.script(run, "convert")  # provisioning's
    train_args = dict(arg.split("=", 1) for arg in train["argv"] if "=" in arg)
    assert train_args.get("tokenizer_path") == row.tokenizer  # only where MaxText's default is not it
    if row.native_rollout:
        assert "vllm_hf_overrides" not in train_args
    else:
        assert train_args["vllm_hf_overrides"] == '{architectures: ["MaxTextForCausalLM"]}'
        assert json.loads(train_args["vllm_additional_config"])["maxtext_config"] == {
            "model_name": name,
            "log_config": "false",
            **dict(row.maxtext_in_vllm),
        }
    convert = calls[maxtext.MODULES["convert"]]["argv"]
    assert ("--eager_load_method=transformers" in convert) == name.startswith("gemma3")  # to_maxtext's own rule


@pytest.mark.parametrize(
    "name, data, tensor",
    [
        ("llama3.1-8b-Instruct", "1", "-1"),  # the tutorial's: one replica over the sampler's chips
        ("llama3.1-70b", "-1", "8"),  # MaxText's rl_on_multi_host.md
        ("qwen3-30b-a3b", "-1", "4"),
    ],
)  # MaxText's scripts/run_qwen3_30b_rl.sh (data 16 on its 64 sampler chips)
def test_the_rollout_is_split_as_maxtexts_recipe_for_the_model(name, data, tensor):
    row = MODELS[name]
    run = maxtext.Run(**{**RUN.__dict__, "model": name, "export_model": row.export_model})
    assert (
        maxtext.overrides(run, "train")["rollout_data_parallelism"],
        maxtext.overrides(run, "train")["rollout_tensor_parallelism"],
    ) == (data, tensor)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, {}),
        ({"dataset": "openai/gsm8k", "dataset_config": "main", "loss_algo": "grpo"}, {}),
        (
            {"dataset": "nvidia/OpenMathInstruct-2"},
            {
                "dataset_name": "nvidia/OpenMathInstruct-2",
                "eval_dataset_name": "nvidia/OpenMathInstruct-2",
                "hf_name": "",
            },
        ),
        (
            {"dataset": "org/math", "dataset_config": "v2"},
            {"dataset_name": "org/math", "eval_dataset_name": "org/math", "hf_name": "v2"},
        ),
        ({"loss_algo": "gspo-token"}, {"rl.loss_algo": "gspo-token"}),
        ({"tokenizer": "org/chat-tokenizer"}, {"tokenizer_path": "org/chat-tokenizer"}),
    ],
)
def test_dataset_loss_and_tokenizer_reach_the_training_only_where_not_maxtexts_default(tmp_path, changes, expected):
    calls = run_ours(tmp_path, maxtext.Run(**{**RUN.__dict__, **changes}))
    train = calls[maxtext.MODULES["train"]]["argv"]
    given = dict(arg.split("=", 1) for arg in train if "=" in arg)
    owned = ("dataset_name", "eval_dataset_name", "hf_name", "rl.loss_algo", "tokenizer_path")
    assert {key: value for key, value in given.items() if key in owned} == expected


def test_the_done_when_stacks_go_through_plan_and_the_pipelines_dry_run(stack_dir, stack_values):
    """qwen3-8b on a v6e-8, llama3.1-70b on the smallest slice the table allows (a v6e-64)."""
    stack(stack_dir, stack_values, **{"tpu-grpo:model": "qwen3-8b"})
    assert invoke("plan", cwd=stack_dir).returncode == 0
    dry = invoke("pipeline", "--dry-run", "--run-name", "q1", cwd=stack_dir)
    assert dry.returncode == 0, dry.stderr
    assert "export MODEL_NAME=qwen3-8b" in dry.stdout and "export HF_MODEL_NAME=qwen3-8b" in dry.stdout
    assert "tokenizer_path" not in dry.stdout  # Qwen/Qwen3-8B's own, MaxText's default
    stack(
        stack_dir,
        stack_values,
        **{
            "tpu-grpo:model": "llama3.1-70b",
            "tpu-grpo:slice": "v6e-64",
            "tpu-grpo:usePathways": "true",
            "tpu-grpo:bucket": "true",
            "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
        },
    )
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    assert plan["outputs"]["slice"] == "v6e-64" and plan["outputs"]["chips"] == 64
    slice_dry = invoke("pipeline", "--dry-run", "--json", "--run-name", "big-1", cwd=stack_dir)
    assert slice_dry.returncode == 0, slice_dry.stderr
    train = json.loads(slice_dry.stdout)["steps"][1]["jobset"]
    text = json.dumps(train)
    assert "MODEL_NAME=llama3.1-70b" in text and "tokenizer_path=meta-llama/Llama-3.1-70B-Instruct" in text


def test_the_documented_model_table_is_the_code_s():
    readme = (ROOT / "docs/models.md").read_text()
    rows = re.findall(
        r"^\| `([^`]+)` \| \[([^\]]+)\]\(https://huggingface.co/\2\) \| ([0-9.]+)B \| (v6e-[0-9]+) "
        r"\(`(?:machineType|slice): [^`]+`\) \| (vLLM|MaxText in vLLM) \|$",
        readme,
        re.M,
    )
    assert [
        (name, hf_id, float(params), smallest, rollout == "vLLM") for name, hf_id, params, smallest, rollout in rows
    ] == [(row.name, row.hf_id, row.params_b, row.smallest.name, row.native_rollout) for row in MODELS.values()]
    assert f"any of {len(MODELS)} models" in (ROOT / "README.md").read_text()


def test_the_export_carries_the_tokenizer_the_run_trained_with(tmp_path):
    """to_huggingface saves HF_IDS[export name]'s tokenizer: the tutorial's export would ship the base model's (no
    Instruct chat template); a line after it saves the training tokenizer in its place. Not where they are one."""
    calls = [call for call in json_lines(tmp_path, RUN) if call["argv"][0] == "-"]  # a program on its stdin
    saves = [
        (json.loads(call["env"][remote.INPUT]), call["env"]["HF_EXPORT"])
        for call in calls
        if call["stdin"] == remote.text("save_tokenizer")
    ]
    assert saves == [({"tokenizer": "meta-llama/Llama-3.1-8B-Instruct"}, "/dev/shm/llama3.1-8b-Instruct/hf-trained/")]
    qwen = maxtext.Run(**{**RUN.__dict__, "model": "qwen3-8b", "export_model": "qwen3-8b"})
    assert "AutoTokenizer" not in maxtext.script(qwen, "export")


def json_lines(folder, run) -> list[dict]:
    run_ours(folder, run)
    return [json.loads(line) for line in (folder / "ours.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_the_tokenizer_is_saved_into_a_folder_or_a_bucket(tmp_path, where, request):
    """The save program itself, run by Python with the stand-in's AutoTokenizer (tests/doubles/standin): into the
    export folder, or through a local copy into a gs:// export (the storage emulator), as a slice's pod writes it."""
    env = {
        **os.environ,
        "PYTHONPATH": str(DOUBLES / "standin"),
        "HOME": str(tmp_path),
        remote.INPUT: json.dumps({"tokenizer": "meta-llama/Llama-3.1-8B-Instruct"}),
    }
    if where == "bucket":
        bucket = request.getfixturevalue("bucket")
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
        target = f"gs://{bucket}/runs/r1/hf-trained/"
    else:
        target = str(tmp_path / "hf-trained")
    done = subprocess.run(
        [sys.executable, ROOT / "tpu_grpo/host/remote/save_tokenizer.py"],
        env={**env, "HF_EXPORT": target},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    if where == "bucket":
        from google.cloud import storage

        saved = {blob.name: blob.download_as_bytes() for blob in storage.Client().list_blobs(bucket)}
        assert saved == {f"runs/r1/hf-trained/{name}": (FIXTURES / "hf-export" / name).read_bytes() for name in names}
    else:
        assert {path.name for path in (tmp_path / "hf-trained").iterdir()} == set(names)
    asked = (tmp_path / ".standin" / "tokenizers.jsonl").read_text()
    assert json.loads(asked) == {"from_pretrained": "meta-llama/Llama-3.1-8B-Instruct"}


def test_what_a_run_trained_on_is_read_back_from_its_inputs():
    """The model card and `invoke metrics` name the model, dataset, loss and tokenizer from the job's record."""
    tutorial = maxtext.trained_on(RUN.inputs("train"))
    assert tutorial == {
        "model": "llama3.1-8b-Instruct",
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "loss": "grpo",
        "tokenizer": "meta-llama/Llama-3.1-8B-Instruct",
    }
    other = maxtext.Run(
        **{**RUN.__dict__, "model": "llama3.1-8b", "dataset": "nvidia/OpenMathInstruct-2", "loss_algo": "gspo-token"}
    )
    assert maxtext.trained_on(other.inputs("train")) == {
        "model": "llama3.1-8b",
        "dataset": "nvidia/OpenMathInstruct-2",
        "dataset_config": "",
        "loss": "gspo-token",
        "tokenizer": "meta-llama/Llama-3.1-8B-Instruct",
    }


def test_a_model_maxtext_converts_only_eagerly_refuses_the_lazy_loader(stack_dir, stack_values):
    stack(
        stack_dir,
        stack_values,
        **{
            "tpu-grpo:model": "gemma3-4b",
            "tpu-grpo:machineType": "ct6e-standard-4t",
            "tpu-grpo:lazyLoadTensors": "true",
        },
    )
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and result.stderr == (
        "error: tpu-grpo:lazyLoadTensors=true cannot convert gemma3-4b: MaxText's to_maxtext converts it only with "
        "the transformers eager loader; fix: pulumi config set tpu-grpo:lazyLoadTensors false\n"
    )


def test_the_maxtext_tier_has_a_checkpoint_for_every_row_of_the_model_table():
    """tests/maxtext/families.py makes each row's tiny checkpoint: a family of its own, or (SAME_FAMILY) a family's
    under the row's name. A row added to the model table without one fails here, not silently in the all-rows run."""
    from tests.maxtext import families

    assert set(families.ROWS) == set(MODELS)
    assert {family for family, _ in families.SAME_FAMILY.values()} <= set(families.FAMILIES)
    assert not set(families.SAME_FAMILY) & set(families.FAMILIES)

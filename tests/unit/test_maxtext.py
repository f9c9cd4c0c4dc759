"""The three MaxText command lines against the tutorial, run for real in bash on both sides."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import tutorial
from tests.support import ROOT, TEST_TOKEN, invoke, this_python
from tests.tutorial import RUN, assert_same_as_tutorial, job_home, run_ours
from tpu_grpo.catalog import stores
from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.catalog.models import MODELS
from tpu_grpo.config import settings
from tpu_grpo.config.errors import BadFlag
from tpu_grpo.config.keys import KEYS
from tpu_grpo.jobs import maxtext, progress

#: Variables our scripts set that the tutorial does not, each on purpose (see maxtext.py).
OURS_ONLY = {
    "PYTHONUNBUFFERED",
    "COMPILE_CACHE",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "VLLM_XLA_CACHE_PATH",
    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES",
}


def test_every_step_gets_the_tutorials_argv_and_environment(tmp_path):
    theirs = tutorial.calls(tmp_path, TEST_TOKEN, RUN.run_name)
    ours = run_ours(tmp_path, RUN)
    assert_same_as_tutorial(ours, theirs)
    tutorial_only = {n for n in tutorial.exported_names()}
    for module in tutorial.MODULES:
        extra = set(ours[module]["env"]) - set(theirs[module]["env"]) - {"PWD", "SHLVL", "_", "OLDPWD"}
        assert extra <= OURS_ONLY, (module, extra - OURS_ONLY)
        assert tutorial_only & set(theirs[module]["env"]) <= set(ours[module]["env"])


def test_the_export_scores_its_checkpoint_on_the_report_examples_with_the_trainings_own_argv(tmp_path):
    """Before converting, a VM's export runs train_rl as the training ran it, but loading the checkpoint it exports,
    training no batch, in a folder of its own, and evaluating the test examples after those the training scored:
    MaxText's slice [test_batch_start_index : num_test_batches x batch] (the end is not shifted)."""
    env, record = job_home(tmp_path)
    for step in maxtext.STEPS:
        subprocess.run(["bash", "-c", maxtext.script(RUN, step)], check=True, cwd=env["HOME"], env=env)
    train = maxtext.MODULES["train"]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    trained, scored = [call for call in calls if call["argv"][1:2] == [train]]
    changed = {"load_parameters_path", "base_output_directory", "num_batches", "num_test_batches",
               "test_batch_start_index", "eval_interval"}  # fmt: skip

    def keyed(argv):
        return dict(arg.split("=", 1) for arg in argv[2:])

    ran = keyed(scored["argv"])
    assert ran["num_batches"] == "0" and ran["num_test_batches"] == "20" and ran["test_batch_start_index"] == "10"
    assert ran["load_parameters_path"].endswith(f"/{RUN.run_name}/checkpoints/actor/50/model_params")
    assert ran["base_output_directory"].startswith("/tmp/") and not Path(ran["base_output_directory"]).exists()
    assert {k: v for k, v in ran.items() if k not in changed} == {
        k: v for k, v in keyed(trained["argv"]).items() if k not in changed
    }
    said = script_output(tmp_path / "again", maxtext.script(RUN, "export"))
    assert f"{progress.REPORT_LINE} 50 on test examples 10 to 20" in said
    assert "the report evaluation failed: the export goes on" in said  # python3 here records, scores nothing
    assert progress.REPORT_LINE not in maxtext.script(dataclasses.replace(RUN, report_batches=0), "export")


def test_the_conversion_reads_the_model_provisioning_downloaded_the_one_argument_the_tutorial_lacks(tmp_path):
    """With the base model downloaded and verified on the data disk (playbooks/host.yml, "model download"),
    to_maxtext gets `--hf_model_path` to it, after the tutorial's arguments; everything else is the tutorial's."""
    (tmp_path / "theirs").mkdir()
    theirs = tutorial.calls(tmp_path / "theirs", TEST_TOKEN, RUN.run_name)
    env, _ = job_home(tmp_path)
    folder = Path(env["HOME"]) / "tpu-grpo/base-models/meta-llama/Llama-3.1-8B-Instruct"
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00004.safetensors").write_bytes(b"half")  # a download still going, or unverified
    module = "maxtext.checkpoint_conversion.to_maxtext"
    partial = run_ours(tmp_path, RUN, env)
    assert not [arg for arg in partial[module]["argv"] if "hf_model_path" in arg]  # MaxText downloads it itself
    (tmp_path / "ours.jsonl").unlink()
    folder.with_name(folder.name + ".complete").write_text("2026-12-04T09:00:00Z\n")
    ours = run_ours(tmp_path, RUN, env)
    assert ours[module]["argv"][-1] == f"--hf_model_path={folder}"
    ours[module]["argv"].pop()
    assert_same_as_tutorial(ours, theirs)


def test_the_token_is_never_on_a_command_line():
    for step in maxtext.STEPS:
        text = maxtext.script(RUN, step)
        assert "hf_access_token" not in text and TEST_TOKEN not in text
        assert "HF_TOKEN=$(cat ~/.cache/huggingface/token); export HF_TOKEN" in text


def script_output(folder, script: str) -> str:
    """What a job script prints (stdout and stderr, as the job's log gets them), run in bash."""
    env, _ = job_home(folder)
    done = subprocess.run(["bash", "-c", script], cwd=env["HOME"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("step", maxtext.STEPS)
def test_a_job_script_never_prints_the_token(tmp_path, step):
    """The job's log is the script's output: checked here on the script itself, not only by the
    end-to-end scan; and the check is shown to catch a script that would trace its lines."""
    script = maxtext.script(RUN, step)
    assert TEST_TOKEN not in script_output(tmp_path / "as-is", script)
    traced = script.replace("set -eo pipefail\n", "set -eo pipefail\nset -x\n", 1)
    assert TEST_TOKEN in script_output(tmp_path / "traced", traced)
    assert not re.search(r"^\s*set\s+(-\w*x|-o\s+xtrace)", script, re.MULTILINE)


#: Google's single-host v6e shapes (Cloud TPU documentation, "TPU v6e": v6e-1 1x1, v6e-4 2x2, v6e-8 2x4;
#: one VM each, so the host bounds are 1,1,1 and a host's chip bounds are the topology's, depth 1).
DOCUMENTED_V6E = {
    "ct6e-standard-1t": ("v6e-1", "1x1"),
    "ct6e-standard-4t": ("v6e-4", "2x2"),
    "ct6e-standard-8t": ("v6e-8", "2x4"),
}


@pytest.mark.parametrize("machine_type", sorted(DOCUMENTED_V6E))
def test_tpu_environment_of_every_machine_type_is_googles_topology(tmp_path, machine_type):
    accelerator, topology = DOCUMENTED_V6E[machine_type]
    x, y = (int(side) for side in topology.split("x"))
    run = maxtext.Run(**{**RUN.__dict__, "machine": MACHINES[machine_type]})
    env = run_ours(tmp_path, run)[tutorial.MODULES[1]]["env"]
    assert {
        name: env[name]
        for name in (
            "TPU_ACCELERATOR_TYPE",
            "TPU_TOPOLOGY",
            "TPU_CHIPS_PER_HOST_BOUNDS",
            "TPU_HOST_BOUNDS",
            "CHIPS_PER_VM",
        )
    } == {
        "TPU_ACCELERATOR_TYPE": accelerator,
        "TPU_TOPOLOGY": topology,
        "TPU_CHIPS_PER_HOST_BOUNDS": f"{x},{y},1",
        "TPU_HOST_BOUNDS": "1,1,1",
        "CHIPS_PER_VM": str(x * y),
    }
    assert accelerator == f"v6e-{x * y}" and MACHINES[machine_type].chips == x * y
    assert set(MACHINES) == set(DOCUMENTED_V6E)


def test_set_overrides_and_adds_keys_in_the_one_mapping(tmp_path):
    sets = maxtext.parse_sets(
        ["rl.num_generations=4", "rl.grpo_beta=0.04", "export:weight_dtype=float32", "learning_rate=1e-6 * 2"], None
    )
    run = maxtext.Run(**{**RUN.__dict__, "sets": sets})
    ours = run_ours(tmp_path, run)
    train = ours[tutorial.MODULES[1]]["argv"]
    assert train[-3:] == ["rl.num_generations=4", "rl.grpo_beta=0.04", "learning_rate=1e-6 * 2"]
    assert [arg for arg in ours[tutorial.MODULES[2]]["argv"] if "weight_dtype" in arg] == ["weight_dtype=float32"]
    assert ours[tutorial.MODULES[0]]["argv"] == run_ours(tmp_path / "plain", RUN)[tutorial.MODULES[0]]["argv"]


def test_exporting_an_earlier_step_changes_only_its_path(tmp_path):
    ours = run_ours(tmp_path, maxtext.Run(**{**RUN.__dict__, "step": 25}))
    assert ours[tutorial.MODULES[2]]["env"]["POST_TRAIN_PATH"] == (
        "/dev/shm/llama3.1-8b-Instruct/post-train//2026-12-02-22-10-00/checkpoints/actor/25/model_params"
    )
    assert (
        maxtext.paths(maxtext.Run(**{**RUN.__dict__, "step": 25}))["post_train"]
        == (ours[tutorial.MODULES[2]]["env"]["POST_TRAIN_PATH"])
    )


def test_paths_are_the_scripts_paths_expanded(tmp_path):
    ours = run_ours(tmp_path, RUN)
    env = ours[tutorial.MODULES[2]]["env"]
    paths = maxtext.paths(RUN)
    assert paths["checkpoint"] == env["MAXTEXT_CKPT_PATH"]
    assert paths["post_train"] == env["POST_TRAIN_PATH"]
    assert paths["hf_export"] == env["HF_EXPORT"]


def test_default_run_name_is_the_tutorials_timestamp():
    assert maxtext.timestamp_run_name(0) == "1970-01-01-00-00-00"


@pytest.mark.parametrize(
    "item, message",
    [
        ("novalue", "--set 'novalue' is not KEY=VALUE (a MaxText key, a value); fix: e.g. --set rl.num_generations=4"),
        ("=3", "--set '=3' is not KEY=VALUE"),
        ("bad key=1", "--set 'bad key=1' is not KEY=VALUE"),
        ("num_batches=3", "--set 'num_batches=3' sets num_batches, which comes from --batches; fix: use that instead"),
        ("hf_access_token=x", "comes from the host's token file"),
        ("deploy:x=1", "--set 'deploy:x=1' names step 'deploy'; fix: one of convert, train, export"),
    ],
)
def test_bad_set_is_refused(item, message):
    with pytest.raises(BadFlag) as error:
        maxtext.parse_sets([item], "train")
    assert message in str(error.value)


@pytest.mark.parametrize(
    "item, said",
    [
        ("Learning_Rate=1e-6", "has no config key 'Learning_Rate'; fix: did you mean learning_rate?"),
        ("rl.num_generation=4", "has no config key 'rl.num_generation'; fix: did you mean rl.num_generations?"),
        ("rl.bogus=1", "has no config key 'rl.bogus'"),
        ("bogus_key=1", "has no config key 'bogus_key'; fix: a key of MaxText's config"),
    ],
)
def test_a_key_maxtext_does_not_have_is_refused_with_the_nearest(item, said):
    """MaxText's pyconfig refuses an unknown key once the job has started on the paid host (`'KEY' not in ...`); the
    list of its keys (tpu_grpo/catalog/maxtext_keys.txt, held to the package by the MaxText tier) refuses it first."""
    with pytest.raises(BadFlag) as error:
        maxtext.parse_sets([item], "train")
    assert said in str(error.value)


def test_every_key_tpu_grpos_own_command_lines_pass_is_one_maxtext_has():
    """Each key of the three steps' command lines, for every model, store and placement, is in MaxText's list: the
    list is whole enough for what tpu-grpo itself sends."""
    known = (ROOT / "tpu_grpo/catalog/maxtext_keys.txt").read_text().split()
    passed = set(maxtext.GRPO_DEFAULTS) | set(maxtext.COUNT_KEYS)
    for model in MODELS:
        for store in ("/dev/shm", "gs://b/runs"):
            run = dataclasses.replace(RUN, model=model, export_model=model, store=stores.store_for(store))
            for step in maxtext.STEPS:
                for at in (maxtext.VM, maxtext.Placement(pod=True)):
                    passed |= {key for key in maxtext.overrides(run, step, at) if not key.startswith("--")}
    assert len(passed) > 30 and passed - set(known) == set()
    # what --set refuses as tpu-grpo's own: MaxText's keys, and to_maxtext's flag `--lazy_load_tensors`
    assert set(maxtext.OWNED_KEYS) - set(known) == {"lazy_load_tensors"}
    assert "--lazy_load_tensors" in maxtext.overrides(RUN, "convert")


@pytest.mark.parametrize(
    "setting, owned",
    [(key.name, owned) for key in KEYS for owned in key.maxtext if owned not in ("num_batches",)],  # --batches' own
)
def test_set_refuses_each_maxtext_key_a_setting_declares_its_own(setting, owned):
    """A setting that decides a MaxText key (keys.Key.maxtext) is what `--set` of that key is sent to, in every step."""
    for step in maxtext.STEPS:
        with pytest.raises(BadFlag) as error:
            maxtext.parse_sets([f"{step}:{owned}=1"], None)
        assert f"sets {owned}, which comes from " in str(error.value) and setting in str(error.value)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("train", "--batches", "0"),
            "error: --batches '0' is not a whole number from 1 to 100000; fix: e.g. --batches 50",
        ),
        (
            ("train", "--batches", "-1"),
            "error: --batches '-1' is negative (a whole number from 1 to 100000); fix: e.g. --batches 50",
        ),
        (("train", "--batches", "abc"), "error: --batches 'abc' is not a whole number from 1 to 100000"),
        (("pipeline", "--batches", "0"), "error: --batches '0' is not a whole number from 1 to 100000"),
        (("train", "--set", "oops"), "error: --set 'oops' is not KEY=VALUE"),
        (("train", "--run-name", "a b"), "error: --run-name 'a b' is not a name"),
        (("export", "--step", "x"), "error: --step 'x' is not a whole number from 1 to 100000"),
        (("pipeline", "--need-gb", "lots"), "error: --need-gb 'lots' is not SHM_GB,DATA_GB"),
        (
            ("status", "--host", "other@192.0.2.2"),
            "error: this task acts on one host, got 2 (other@192.0.2.2, nobody@192.0.2.1); fix: pass one --host",
        ),
    ],
)
def test_bad_flags_are_one_line_errors_before_any_connection(args, message, stack_dir):
    """The host named here does not exist: a connection attempt would fail differently."""
    result = invoke(*args, "--host", "nobody@192.0.2.1", cwd=stack_dir)
    assert result.returncode != 0
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_model_is_refused(stack_dir):
    config = yaml.safe_load((stack_dir / "Pulumi.dev.yaml").read_text())
    config["config"]["tpu-grpo:model"] = "llama9-70b"
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump(config))
    result = invoke("train", "--dry-run", cwd=stack_dir)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: tpu-grpo:model='llama9-70b' is not a model MaxText 0.2.3 post-trains "
        "here (llama3.1-8b, llama3.1-8b-Instruct, llama3.1-70b, "
    )
    assert "docs/models.md); fix: pulumi config set tpu-grpo:model" in result.stderr


def test_dry_run_prints_each_steps_script_without_connecting(stack_dir):
    result = invoke(
        "pipeline", "--dry-run", "--batches", "7", "--run-name", "r1", "--host", "nobody@192.0.2.1", cwd=stack_dir
    )
    assert result.returncode == 0, result.stderr
    run = maxtext.Run(**{**RUN.__dict__, "batches": 7, "run_name": "r1"})
    for step in maxtext.STEPS:
        assert maxtext.script(run, step) in result.stdout
    assert "# tpu-grpo save: the model of run r1 to the data disk\n" in result.stdout
    assert "SRC=/dev/shm/llama3.1-8b-Instruct/hf-trained\nDEST='~/tpu-grpo/models/r1'\n" in result.stdout


def test_plan_includes_the_scripts(stack_dir):
    result = invoke("plan", "--json", cwd=stack_dir)
    plan = json.loads(result.stdout)
    assert [job["step"] for job in plan["jobs"]] == list(maxtext.STEPS)
    assert "python3 - maxtext.trainers.post_train.rl.train_rl" in plan["jobs"][1]["script"]
    assert 'num_batches="${NUM_BATCHES?}"' in plan["jobs"][1]["script"]
    run = maxtext.Run.of(settings.load("dev", lenient=True, root=stack_dir).training)
    assert plan["compile_cache"].startswith(
        f"compile cache: ~/tpu-grpo/compile-cache/MAXTEXT_JAX_LIBTPU_VERSIONS/"
        f"{maxtext.compile_cache_name(run, 'train')}, on the data disk. The first "
        "training of these settings compiles (a cold start)"
    )


def _lines_about_the_newest_checkpoint(script: str) -> str:
    """From `newest=` (its listing may carry a program's text) to the line that says it."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("newest="))
    end = next(i for i, line in enumerate(lines) if line.startswith('[ -z "$newest" ]'))
    return "\n".join(lines[start : end + 1])


# ---------------------------------------------------------------- what a script does where it runs


@pytest.mark.parametrize("store", ["disk", "gs"])
def test_training_says_after_which_checkpoint_it_resumes_counting_steps_as_numbers(tmp_path, bucket, store):
    """The line the progress bar starts from: the newest checkpoint by number (100 after 90), listed with `ls` on a
    disk and with the Cloud Storage client (as MaxText's extra installs it) in a bucket, where `ls` lists nothing."""
    from dataclasses import replace

    from google.cloud import storage

    from tpu_grpo.catalog.stores import store_for
    from tpu_grpo.jobs.progress import RESUMES

    root = f"gs://{bucket}/runs" if store == "gs" else str(tmp_path / "maxtext")
    run = replace(RUN, store=store_for(root if store == "gs" else "disk"))
    base = f"{root}/llama3.1-8b-Instruct/post-train/"  # as the script exports it: `$BASE/$RUN` holds a `//`
    for step in ("9", "90", "100", "10"):
        if store == "gs":
            folder = f"runs/llama3.1-8b-Instruct/post-train/{RUN.run_name}/checkpoints/actor/{step}"
            storage.Client().bucket(bucket).blob(f"{folder}/model_params/x").upload_from_string(b"x")
            if step != "100":  # a save cut short: no commit_success.txt, so not the one train_rl resumes from
                storage.Client().bucket(bucket).blob(f"{folder}/commit_success.txt").upload_from_string(b"x")
        else:
            (tmp_path / f"maxtext/llama3.1-8b-Instruct/post-train/{RUN.run_name}/checkpoints/actor/{step}").mkdir(
                parents=True
            )
    tools = this_python(tmp_path)
    lines = _lines_about_the_newest_checkpoint(maxtext.script(run, "train"))
    env = {
        "PATH": f"{tools}:/usr/bin:/bin",
        "BASE_OUTPUT_DIRECTORY": base,
        "RUN_NAME": RUN.run_name,
        "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
    }
    said = subprocess.run(["bash", "-c", lines], env=env, capture_output=True, text=True)
    newest = "90" if store == "gs" else "100"  # on gs://, Orbax's step 100 without commit_success.txt: cut short
    assert said.stdout == f"{RESUMES} {newest}\n", said.stderr
    never = _lines_about_the_newest_checkpoint(maxtext.script(replace(run, run_name="never-trained"), "train"))
    fresh = subprocess.run(
        ["bash", "-c", never], env={**env, "RUN_NAME": "never-trained"}, capture_output=True, text=True
    )
    assert fresh.returncode == 0 and fresh.stdout == ""  # nothing to resume from: no line


def test_a_run_record_makes_the_same_run_again_and_its_export_keeps_what_the_training_had():
    from dataclasses import replace

    from tpu_grpo.catalog.stores import store_for

    trained = replace(
        RUN,
        tokenizer="someone/trained-tokenizer",
        dataset="openai/gsm8k",
        loss_algo="gspo-token",
        store=store_for("gs://bucket/runs"),
        sets={"train": {"rl.num_generations": "4"}},
        batches=7,
    )
    record = json.loads(json.dumps(trained.to_record()))  # as a job's record keeps it
    assert maxtext.Run.from_record(record) == trained
    asked = replace(RUN, tokenizer="someone/new-tokenizer", batches=9, step=5, sets={"export": {"a": "1"}})
    exported = asked.export_of(trained)
    assert exported == replace(trained, step=5, sets={"train": {"rl.num_generations": "4"}, "export": {"a": "1"}})


def test_a_training_recorded_before_whole_run_records_is_exported_with_what_its_inputs_say_it_trained_on():
    from dataclasses import replace

    from tpu_grpo.jobs import pipeline

    trained = replace(RUN, tokenizer="someone/trained-tokenizer", batches=7, sets={"train": {"x": "1"}})
    old = {"run": trained.run_name, "inputs": trained.inputs("train")}  # a job.json without "record"
    asked = replace(RUN, tokenizer="someone/new-tokenizer", batches=9)
    found = pipeline._trained_as(old, asked)
    assert (found.training_tokenizer, found.batches, found.sets["train"]) == (
        "someone/trained-tokenizer",
        7,
        {"x": "1"},
    )


def test_a_compile_cache_is_named_by_what_fixes_the_compiled_programs():
    """One folder for the settings that fix what a step compiles (the machine, the model, the step's `--set`s, the
    training's data and loss), so that a training of more batches or another name starts warm, and another
    `--set`, model or machine does not take a folder that is warm for something else."""
    name = maxtext.compile_cache_name
    assert name(RUN, "train") == name(dataclasses.replace(RUN, batches=200, run_name="other", step=3), "train")
    assert name(RUN, "train").startswith(f"{RUN.machine.machine_type}/{RUN.model}/train-")
    others = [
        dataclasses.replace(RUN, sets={"train": {"rl.num_generations": "4"}}),
        dataclasses.replace(RUN, loss_algo="gspo-token"),
        dataclasses.replace(RUN, model="qwen3-8b"),
    ]
    assert len({name(RUN, "train"), *(name(other, "train") for other in others)}) == 4
    assert name(RUN, "export") == name(dataclasses.replace(RUN, sets={"train": {"rl.num_generations": "4"}}), "export")
    assert name(RUN, "train", "v6e-16x2").startswith("v6e-16x2/") and name(RUN, "export", "v6e-16x2").startswith(
        "cpu-pool/"
    )
    assert maxtext.VM.compile_cache_root(RUN) == "~/tpu-grpo/compile-cache"  # the data disk's
    bucket = dataclasses.replace(RUN, store=stores.store_for("gs://b/runs"))
    assert maxtext.Placement(pod=True).compile_cache_root(bucket) == "gs://b/runs/compile-cache"


def test_every_step_compiles_into_its_cache_and_runs_on_when_there_is_none(tmp_path):
    """Each step's MaxText gets the folder the compile cache program printed as jax_cache_dir, and the training's
    vLLM the same folder; a cache that cannot be had leaves MaxText's own ~/jax_cache and says so."""
    env, record = tutorial.job_home(tmp_path)
    (tmp_path / "bin/python3").write_text(
        (tmp_path / "bin/python3").read_text()
        + (
            "given = json.loads(os.environ.get('TPU_GRPO_INPUT') or '{}')\n"
            "if given.get('mode') == 'make': print(os.path.expanduser(given['root']) + '/v/' + given['named'])\n"
        )
    )
    ours = tutorial.run_ours(tmp_path, RUN, env)
    for step, module in zip(maxtext.STEPS, tutorial.MODULES):
        folder = f"{env['HOME']}/tpu-grpo/compile-cache/v/{maxtext.compile_cache_name(RUN, step)}"
        assert f"jax_cache_dir={folder}" in ours[module]["argv"]
        assert ours[module]["env"]["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    trained = f"{env['HOME']}/tpu-grpo/compile-cache/v/{maxtext.compile_cache_name(RUN, 'train')}"
    assert ours[tutorial.MODULES[1]]["env"]["VLLM_XLA_CACHE_PATH"] == trained
    failing = tmp_path / "failing"
    failing.mkdir()
    env, record = tutorial.job_home(failing)
    (failing / "bin/python3").write_text(
        (failing / "bin/python3").read_text() + ("if 'make' in os.environ.get('TPU_GRPO_INPUT', ''): sys.exit(1)\n")
    )
    done = subprocess.run(
        ["bash", "-c", maxtext.script(RUN, "train")], capture_output=True, text=True, env=env, cwd=env["HOME"]
    )
    assert done.returncode == 0, done.stderr
    assert "tpu-grpo: compile cache unavailable: this start compiles everything" in done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    [trained] = [call for call in calls if call["argv"][1:2] == [maxtext.MODULES["train"]]]
    assert f"jax_cache_dir={env['HOME']}/jax_cache" in trained["argv"]


@pytest.mark.parametrize(
    ("hangs", "ending", "code"), [(True, "raise SystemExit(3)", 3), (False, "raise ValueError('bad data')", 1)]
)
def test_the_training_ends_though_its_exit_handlers_hang(tmp_path, hangs, ending, code):
    """The training's program (run_module) ends the process with the module's exit code (a traceback said as Python
    says it) though an exit handler never returns, as MaxText 0.2.3's grading pool's does (its docstring); `python3
    -m` waits forever."""
    from tpu_grpo.host import remote
    from tpu_grpo.host.remote import run_module

    (tmp_path / "module.py").write_text(
        "import atexit, threading\n"
        f"{'atexit.register(threading.Event().wait)' if hangs else ''}\n"
        f"if __name__ == '__main__':\n    {ending}\n"
    )
    done = subprocess.run(
        ["bash", "-c", remote.run("run_module", command_line="module", python=sys.executable)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert ("ValueError: bad data" in done.stderr) == (code == 1)
    if hangs:
        with pytest.raises(subprocess.TimeoutExpired):  # the command line without it
            subprocess.run([sys.executable, "-m", "module"], cwd=tmp_path, timeout=run_module.GRACE_SECONDS + 5)


def test_the_trainings_output_ends_though_a_pool_worker_outlives_it(tmp_path):
    """A worker a torn-down pool spawned anew (MaxText 0.2.3's grading pool, run_module's docstring) waits forever,
    holding the training's output: run_module ends it, so what reads the output (the keeper, the job's log) sees the
    end; `python3 -m` leaves it running and the reader waiting."""
    from tpu_grpo.host import remote

    (tmp_path / "module.py").write_text(
        "import multiprocessing, time\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.get_context('spawn').Process(target=time.sleep, args=(3600,)).start()\n"
        "    print('trained', flush=True)\n"
    )
    piped = " | cat"  # the reader of the output, as the keeper is
    done = subprocess.run(
        ["bash", "-c", remote.run("run_module", command_line="module", python=sys.executable, then=piped)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "trained\n", done.stderr
    without = subprocess.Popen(  # the command line without it, in a session of its own to end after
        f"{sys.executable} -m module{piped}", shell=True, cwd=tmp_path, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            without.communicate(timeout=20)
    finally:
        os.killpg(without.pid, signal.SIGKILL)  # the worker too, which nothing else ends
        without.communicate()


@pytest.mark.parametrize(
    "period, iterations, interval",
    [(50, "1", "50"), (10, "1", None), (2, "1", "2"), (4, "2", "2"), (25, "1", "25"), (40, "2", "20")],
)
def test_every_checkpoint_is_scored_by_an_intermediate_evaluation(period, iterations, interval):
    """eval_interval counts batches, checkpoint_period train steps (rl.num_iterations a batch): the batches between
    checkpoints, so no evaluation scores weights that are not saved (nothing passed when that is MaxText's own 10)."""
    run = dataclasses.replace(RUN, checkpoint_period=period, sets={"train": {"rl.num_iterations": iterations}})
    assert maxtext.overrides(run, "train").get("eval_interval") == interval
    assert (period // int(iterations)) % run.eval_interval == 0


def test_the_export_converts_the_best_scored_checkpoint_and_says_so():
    run = dataclasses.replace(RUN, scored_step=20)
    script = maxtext.script(run, "export")
    assert "/checkpoints/actor/20/model_params" in script
    assert 'echo "tpu-grpo: exports checkpoint 20, the best scored of those in the store;' in script
    said = {
        "last": 'exports checkpoint 50, the last, as --last asked"',
        "step": 'exports checkpoint 30, as --step asked"',
        "unscored": 'exports checkpoint 50, the last: no checkpoint of the run was scored"',
    }
    for why, chosen in (
        ("last", dataclasses.replace(run, last=True)),
        ("step", dataclasses.replace(run, step=30)),
        ("unscored", RUN),
    ):
        assert said[why] in maxtext.script(chosen, "export")
    assert dataclasses.replace(run, last=True).export_step == RUN.train_steps
    assert dataclasses.replace(RUN, sets={"train": {"rl.num_iterations": "2"}}).export_step == 2 * RUN.batches


@pytest.mark.parametrize("model, needed", [("llama3.1-8b-Instruct", True), ("qwen3-0.6b", False)])
def test_only_a_gated_models_job_needs_the_hosts_token(tmp_path, model, needed):
    """Qwen's weights are public, so a VM provisioned without a token (checks.require_token asks none for it) converts
    anyway, without HF_TOKEN; a gated model's job stops at once, naming the fix. With the token file both read it."""
    run = dataclasses.replace(RUN, model=model, export_model=model)
    env, record = tutorial.job_home(tmp_path)
    token = Path(env["HOME"]) / ".cache/huggingface/token"
    token.unlink()
    done = subprocess.run(
        ["bash", "-c", maxtext.script(run, "convert")], env=env, cwd=env["HOME"], capture_output=True, text=True
    )
    if needed:
        assert (
            done.returncode == 1 and "no Hugging Face token in ~/.cache/huggingface/token on this host" in done.stderr
        )
        assert not record.exists()
    else:
        assert done.returncode == 0, done.stderr
        assert all("HF_TOKEN" not in json.loads(line)["env"] for line in record.read_text().splitlines())
    token.write_text(TEST_TOKEN)
    record.unlink(missing_ok=True)
    again = subprocess.run(["bash", "-c", maxtext.script(run, "convert")], env=env, cwd=env["HOME"])
    assert again.returncode == 0
    assert all(json.loads(line)["env"]["HF_TOKEN"] == TEST_TOKEN for line in record.read_text().splitlines())

"""The tasks on a multi-host slice's stack: `train`, `convert`, `export`, `pipeline`, `logs`, `status` and
`cancel` create, follow, report and delete JobSets through the Kubernetes API (the stand-in of
tests/doubles/kubeapi.py, with JobSet's CRD schema), the progress fed by MaxText's recorded log, the exit
code from the JobSet's status, and what keeps a job from running said in one line."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.doubles import kubeapi
from tests.support import FIXTURES, ROOT, TEST_TOKEN, invoke, task_environment
from tpu_grpo.catalog.release import PIPELINE_ACCOUNT
from tpu_grpo.cloud import jobset

SLICE = {"tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true"}
IMAGE = "us-east5-docker.pkg.dev/grpo-lab-123/tpu-grpo/maxtext-post-training:0.2.3"
TRAIN_LOG = (FIXTURES / "train_rl.cpu-rehearsal.log").read_text().splitlines()


@pytest.fixture
def kube():
    api = kubeapi.KubeAPI()
    yield api
    api.close()


@pytest.fixture
def slice_stack(stack_dir, stack_values, bucket, storage_emulator, kube, home):
    """A slice stack whose cluster is the stand-in, whose store is an emulated bucket; the task environment."""
    values = {**stack_values, **SLICE, "tpu-grpo:checkpointStore": f"gs://{bucket}/runs"}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    env = {
        **home,
        "TPU_GRPO_KUBECONFIG": str(kube.kubeconfig(stack_dir / "kubeconfig")),
        "STORAGE_EMULATOR_HOST": storage_emulator,
        "HF_TOKEN": TEST_TOKEN,
        "TPU_GRPO_STATE": str(stack_dir / "state"),
    }
    kube.configmaps["tpu-grpo-image"] = {"metadata": {"name": "tpu-grpo-image"}, "data": {"image": IMAGE}}
    kube.serviceaccounts[PIPELINE_ACCOUNT] = {"metadata": {"name": PIPELINE_ACCOUNT}}  # as `invoke up` declares it
    kube.pod_env = {"STORAGE_EMULATOR_HOST": storage_emulator}
    return stack_dir, env, bucket


def run_task(slice_stack, *args, env=None):
    folder, base, _ = slice_stack
    result = invoke(*args, cwd=folder, env={**base, **(env or {})})
    assert TEST_TOKEN not in result.stdout + result.stderr
    return result


def test_train_runs_as_a_pathways_jobset_with_progress_and_its_exit_code(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(log=TRAIN_LOG)
    result = run_task(slice_stack, "train", "--batches", "4", "--run-name", "gsm8k-1")
    assert result.returncode == 0, result.stdout + result.stderr
    name = jobset.job_name("train", "gsm8k-1")
    created = kube.jobsets[name]
    assert created["metadata"]["labels"] == {jobset.RUN_LABEL: "gsm8k-1", jobset.STEP_LABEL: "train"}
    [head, worker] = created["spec"]["replicatedJobs"]
    assert worker["template"]["spec"]["parallelism"] == 4
    script = head["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert 'num_batches="${NUM_BATCHES?}"' in script and "export NUM_BATCHES=4" in script
    assert f"started train job {name} (run gsm8k-1) on slice v6e-16" in result.stdout
    assert "train finished" in result.stdout and "GRPO step 4/4" in result.stdout
    assert "Post RL Training" in result.stdout or "post eval" in result.stdout.lower()
    # The token went to the Secret, in a request body: never in a URL, a manifest or the output.
    secret = kube.secrets[jobset.TOKEN_SECRET]
    assert base64.b64decode(secret["data"][jobset.TOKEN_KEY]).decode() == TEST_TOKEN
    assert TEST_TOKEN not in json.dumps(kube.jobsets) + "".join(kube.requests)
    log = (slice_stack[0] / "state" / "logs" / f"{name}.log").read_text()
    assert log.splitlines() == TRAIN_LOG


def test_a_failed_training_exits_with_its_script_code_and_names_the_crashed_worker(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(
        log=TRAIN_LOG[:40] + ["Traceback (most recent call last):", "RuntimeError: worker lost"],
        exit_code=3,
        crash_worker=True,
    )
    result = run_task(slice_stack, "train", "--run-name", "gsm8k-2")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "RuntimeError: worker lost" in result.stdout
    assert "crashed (exit 1, Error); fix: read its log (kubectl logs" in result.stdout
    assert "train failed (exit 3)" in result.stdout


def test_status_says_in_one_line_why_a_job_cannot_run_and_cancel_deletes_it(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(unschedulable="0/3 nodes are available: 3 Insufficient google.com/tpu.")
    started = run_task(slice_stack, "train", "--run-name", "gsm8k-3", "--detach")
    assert started.returncode == 0, started.stderr
    status = json.loads(run_task(slice_stack, "status", "--json").stdout)
    assert list(status) == [
        "where",
        "jobs",
        "progress",
        "idle_stop",
        "tpu",
        "slice",
        "compile_cache",
    ]  # the VM's shape too
    assert (status["where"], status["slice"], status["tpu"]) == ("tpu-grpo", "v6e-16 x1", None)
    [job] = status["jobs"]
    assert (job["step"], job["run"], job["state"], job["exit_code"]) == ("train", "gsm8k-3", "pending", None)
    assert job["problem"].endswith(
        "cannot be scheduled: 0/3 nodes are available: 3 Insufficient google.com/tpu.; "
        "fix: check the TPU node pool's capacity and quota (gcloud container node-pools "
        "describe; the reservation, spot availability, TPU quota in the zone)"
    )
    shown = run_task(slice_stack, "status")
    assert "cannot be scheduled" in shown.stdout and "pending" in shown.stdout
    cancelled = run_task(slice_stack, "cancel")
    assert cancelled.returncode == 0 and f"cancelled {jobset.job_name('train', 'gsm8k-3')}" in cancelled.stdout
    assert kube.jobsets == {} and kube.pods == {}
    assert json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"] == []


def test_an_image_that_cannot_be_pulled_points_at_invoke_image(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(pull_error=jobset.CONTAINER)
    assert run_task(slice_stack, "convert", "--detach").returncode == 0
    [job] = json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
    assert job["step"] == "convert" and job["state"] == "pending"
    assert (
        "cannot pull us-east5-docker.pkg.dev/grpo-lab-123/tpu-grpo/maxtext-post-training:0.2.3 "
        "(ImagePullBackOff: Back-off pulling image" in job["problem"]
    )
    assert job["problem"].endswith("; fix: uv run invoke image")


@pytest.mark.parametrize(
    "cause, fix",
    [
        ("missing", "uv run invoke image"),
        (
            "denied",
            "the nodes' service account may not read the image repository: it needs "
            "roles/artifactregistry.reader on it, which `uv run invoke up` grants (see invoke plan)",
        ),
    ],
)
def test_a_pull_refused_to_the_nodes_is_told_from_a_missing_image(slice_stack, kube, cause, fix):
    """A 403 from the registry is the nodes' account lacking a role (no Editor is assumed for it), not an image
    to build."""
    kube.scenario = kubeapi.Scenario(pull_error=jobset.CONTAINER, pull_cause=cause)
    assert run_task(slice_stack, "convert", "--detach").returncode == 0
    [job] = json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
    assert "(ErrImagePull: rpc error: " in job["problem"] and job["problem"].endswith(f"; fix: {fix}")


def checkpoints_in_bucket(bucket: str, run: str, *steps: int, committed: bool = True) -> None:
    """What a training writes into the bucket (the stand-in cluster runs no MaxText): its checkpoints, each with the
    file Orbax writes last into a bucket's step (`committed`), or cut short before it."""
    from google.cloud import storage

    for step in steps:
        folder = f"runs/llama3.1-8b-Instruct/post-train/{run}/checkpoints/actor/{step}"
        storage.Client().bucket(bucket).blob(f"{folder}/model_params/_METADATA").upload_from_string("{}")
        if committed:
            storage.Client().bucket(bucket).blob(f"{folder}/commit_success.txt").upload_from_string("committed")


def test_convert_and_export_run_on_the_cpu_pool_and_export_takes_the_newest_trained_run(slice_stack, kube):
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "export").returncode == 1  # nothing trained yet: the cluster lacks it
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-4").returncode == 0
    checkpoints_in_bucket(slice_stack[2], "gsm8k-4", 25, 50)
    result = run_task(slice_stack, "export")
    assert result.returncode == 0, result.stdout + result.stderr
    made = kube.jobsets[jobset.job_name("export", "gsm8k-4")]
    pod = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    script = pod["containers"][0]["command"][2]
    assert "export RUN_NAME=gsm8k-4" in script
    assert "export HF_EXPORT=$BASE_OUTPUT_DIRECTORY$RUN_NAME/hf-trained/" in script  # no `//` in its object names
    assert "/checkpoints/actor/$NUM_BATCHES/model_params" in script  # the newest: 50, the stack's batches


def test_an_export_of_a_save_cut_short_is_refused_and_nothing_is_created(slice_stack, kube):
    """A spot slice preempted while Orbax wrote step 50 into the bucket: the step has its files but no commit file,
    so the run's last checkpoint is not there, and the export says which are."""
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-9").returncode == 0
    checkpoints_in_bucket(slice_stack[2], "gsm8k-9", 25)
    checkpoints_in_bucket(slice_stack[2], "gsm8k-9", 50, committed=False)
    result = run_task(slice_stack, "export")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "run gsm8k-9 has no checkpoint at step 50 in " in result.stderr
    assert result.stderr.rstrip().endswith("it has: 25; fix: --step 25")
    assert jobset.job_name("export", "gsm8k-9") not in kube.jobsets


def test_a_slice_export_is_made_of_the_run_its_training_ran_not_of_the_stack_as_it_is_now(slice_stack, kube):
    """The stack changed after the training (another tokenizer and batch count): the export still writes the trained
    tokenizer into the model and reads the trained run's checkpoint, from the training JobSet's record."""
    kube.scenario = kubeapi.Scenario()
    folder, _, bucket = slice_stack
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-7", "--batches", "6").returncode == 0
    checkpoints_in_bucket(bucket, "gsm8k-7", 6)
    stack = folder / "Pulumi.dev.yaml"
    config = yaml.safe_load(stack.read_text())["config"]
    stack.write_text(
        yaml.safe_dump({"config": {**config, "tpu-grpo:tokenizer": "someone/other-tokenizer", "tpu-grpo:batches": "9"}})
    )
    result = run_task(slice_stack, "export")
    assert result.returncode == 0, result.stderr
    made = kube.jobsets[jobset.job_name("export", "gsm8k-7")]
    script = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert '{"tokenizer": "meta-llama/Llama-3.1-8B-Instruct"}' in script and "someone/other-tokenizer" not in script
    assert "export NUM_BATCHES=6" in script


def test_a_slice_export_of_a_step_with_no_checkpoint_in_the_bucket_is_refused_before_a_job(slice_stack, kube):
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-14", "--batches", "90").returncode == 0
    checkpoints_in_bucket(slice_stack[2], "gsm8k-14", 9, 10, 90)  # ordered as numbers: 90 is the newest
    exports = len(kube.jobsets)
    refused = run_task(slice_stack, "export", "--step", "100")
    assert refused.returncode == 2 and refused.stderr.strip().endswith("it has: 9, 10, 90; fix: --step 90")
    assert "run gsm8k-14 has no checkpoint at step 100 in gs://" in refused.stderr and len(kube.jobsets) == exports
    newest = run_task(slice_stack, "export")
    assert newest.returncode == 0, newest.stderr
    made = kube.jobsets[jobset.job_name("export", "gsm8k-14")]
    script = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "export NUM_BATCHES=90" in script and "/checkpoints/actor/$NUM_BATCHES/model_params" in script  # the run's
    dry = run_task(slice_stack, "export", "--dry-run")  # which run is known once the cluster is asked
    assert dry.returncode == 0 and dry.stdout.startswith("# run name NEWEST: the newest trained run on the cluster")
    assert "RUN_NAME=NEWEST" in dry.stdout


def peaked(log: list[str], accuracy: dict[int | str, float]) -> list[str]:
    """The recorded training log with the accuracy given of its intermediate evaluation after each batch, and of its
    evaluations before and after training ("pre", "post")."""

    def scored(line: str) -> str:
        found = re.search(r"Intermediate Eval \(step=(\d+)\)|(Pre|Post) RL Training:", line)
        key = found and (int(found[1]) if found[1] else found[2].lower())
        if key not in accuracy:
            return line
        return re.sub(r"accuracy=[0-9.]+%", f"accuracy={accuracy[key]}%", line, count=1)

    return [scored(line) for line in log]


def export_script(kube, run: str) -> str:
    made = kube.jobsets[jobset.job_name("export", run)]
    return made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]


def test_a_slice_export_converts_the_best_scored_checkpoint_in_the_bucket_as_one_vms_does(slice_stack, kube):
    """The training's evaluations after batches 2 and 4 score 50% and 25%: export converts 2 and says why, --last
    converts 4; status and runs show the curve and the best beside before and after; the pipeline's export chooses
    the same way."""
    kube.scenario = kubeapi.Scenario(log=peaked(TRAIN_LOG, {"pre": 5.0, 2: 50.0, 4: 25.0, "post": 20.0}))
    bucket = slice_stack[2]
    assert run_task(slice_stack, "train", "--run-name", "peak", "--batches", "4").returncode == 0
    progress = json.loads(run_task(slice_stack, "status", "--json").stdout)["progress"]
    assert (progress["run"], progress["step"], progress["best"]["step"], progress["best"]["accuracy"]) == (
        "peak",
        4,
        2,
        50,
    )
    assert [each["accuracy"] for each in progress["evals"]] == [5, 50, 25, 20]
    checkpoints_in_bucket(bucket, "peak", 2, 4)
    best = run_task(slice_stack, "export")
    assert best.returncode == 0, best.stderr
    assert "/checkpoints/actor/2/model_params" in export_script(kube, "peak")
    assert "exports checkpoint 2, the best scored of those in the store" in export_script(kube, "peak")
    [row] = json.loads(run_task(slice_stack, "runs", "--json").stdout)["runs"]
    assert (row["accuracy_before"], row["best_batch"], row["best_accuracy"], row["accuracy_after"]) == (5, 2, 50, 20)
    assert [(each["step"], each["accuracy"]) for each in row["curve"]] == [(2, 50.0), (4, 25.0)]
    last = run_task(slice_stack, "export", "--last")
    assert last.returncode == 0, last.stderr
    assert "/checkpoints/actor/$NUM_BATCHES/model_params" in export_script(kube, "peak")
    assert "exports checkpoint 4, the last, as --last asked" in export_script(kube, "peak")

    checkpoints_in_bucket(bucket, "piped", 2)  # the training's last (4) is not there yet: the pipeline trains
    assert run_task(slice_stack, "pipeline", "--run-name", "piped", "--batches", "4").returncode == 0
    assert "exports checkpoint 2, the best scored of those in the store" in export_script(kube, "piped")


def test_pipeline_runs_the_three_steps_in_order_and_skips_what_the_bucket_holds(slice_stack, kube):
    from google.cloud import storage

    kube.scenario = kubeapi.Scenario()
    _, _, bucket = slice_stack
    storage.Client().bucket(bucket).blob("runs/llama3.1-8b-Instruct/mt-format/0/items/_METADATA").upload_from_string(
        "{}"
    )
    result = run_task(slice_stack, "pipeline", "--run-name", "gsm8k-5", "--batches", "4", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stderr)
    assert "convert: done (its output is in the bucket)" in result.stderr
    assert "run gsm8k-5 is complete" in result.stderr
    assert [j["metadata"]["labels"][jobset.STEP_LABEL] for j in kube.jobsets.values()] == ["train", "export"]
    assert json.loads(result.stdout) == {
        "run": "gsm8k-5",
        "model": f"gs://{bucket}/runs/llama3.1-8b-Instruct/post-train//gsm8k-5/hf-trained/",
        "steps": [
            {"step": "convert", "state": "done", "job": None},
            {"step": "train", "state": "finished", "job": jobset.job_name("train", "gsm8k-5"), "exit_code": 0},
            {"step": "export", "state": "finished", "job": jobset.job_name("export", "gsm8k-5"), "exit_code": 0},
        ],
    }


def test_logs_prints_or_follows_a_slice_jobs_log(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(log=TRAIN_LOG)
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-10", "--batches", "4", "--detach").returncode == 0
    followed = run_task(slice_stack, "logs", "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "GRPO step 4/4" in followed.stdout and "train finished" in followed.stdout
    printed = run_task(slice_stack, "logs", "--job", jobset.job_name("train", "gsm8k-10"))
    assert printed.returncode == 0 and printed.stdout.splitlines() == TRAIN_LOG
    unknown = run_task(slice_stack, "logs", "--job", "train-nope")
    assert unknown.returncode == 2 and "--job 'train-nope' is no job on the cluster" in unknown.stderr


def test_a_step_job_of_the_same_run_still_running_is_refused_and_dry_run_prints_the_jobset(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(unschedulable="0/1 nodes are available")
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-6", "--detach").returncode == 0
    again = run_task(slice_stack, "train", "--run-name", "gsm8k-6", "--detach")
    assert again.returncode == 1 and "is still on the cluster; fix: wait for it" in again.stderr  # busy
    requests = len(kube.requests)
    dry = run_task(slice_stack, "train", "--run-name", "gsm8k-7", "--dry-run")
    assert dry.returncode == 0 and len(kube.requests) == requests  # printed, nothing sent
    printed = yaml.safe_load(dry.stdout)
    assert printed["kind"] == "JobSet" and printed["metadata"]["name"] == jobset.job_name("train", "gsm8k-7")
    kube.validator.validate(printed)
    script = printed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert '\n    num_batches="${NUM_BATCHES?}" \\\n' in script  # a script, line for line
    assert "  - |\n" in dry.stdout  # shown as a block, as a person reads it
    text = run_task(slice_stack, "pipeline", "--run-name", "gsm8k-7", "--dry-run").stdout
    documents = list(yaml.safe_load_all(text))
    assert [d["metadata"]["labels"][jobset.STEP_LABEL] for d in documents] == ["convert", "train", "export"]
    assert not re.search(r"[&*]id\d+", text)  # plain YAML: a value that repeats is written where it stands
    as_json = run_task(slice_stack, "pipeline", "--run-name", "gsm8k-7", "--dry-run", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {
        "run": "gsm8k-7",
        "steps": [
            {"step": step, "jobset": document} for step, document in zip(("convert", "train", "export"), documents)
        ],
    }
    assert len(kube.requests) == requests


def test_a_run_name_that_is_no_label_is_refused_before_anything_is_sent(slice_stack, kube):
    result = run_task(slice_stack, "train", "--run-name", "x" * 70)
    assert result.returncode == 2 and "cannot label a slice's jobs" in result.stderr
    assert kube.requests == []


def test_fetch_and_metrics_read_a_slice_run_from_the_bucket(slice_stack, kube):
    from google.cloud import storage

    folder, _, bucket = slice_stack
    kube.scenario = kubeapi.Scenario(log=TRAIN_LOG)
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-8", "--batches", "4").returncode == 0
    checkpoints_in_bucket(bucket, "gsm8k-8", 2, 4)
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "export").returncode == 0
    store = storage.Client().bucket(bucket)
    run_folder = "runs/llama3.1-8b-Instruct/post-train/gsm8k-8"
    exported = sorted(path for path in (FIXTURES / "hf-export").iterdir() if path.is_file())
    for path in exported:
        store.blob(f"{run_folder}/hf-trained/{path.name}").upload_from_filename(str(path))
    for path in (FIXTURES / "tensorboard").iterdir():
        store.blob(f"{run_folder}/tensorboard/{path.name}").upload_from_filename(str(path))

    fetched = run_task(slice_stack, "fetch", "--json")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    result = json.loads(fetched.stdout)
    assert result["files"] == [path.name for path in exported] and result["skipped"] == []
    for path in exported:
        assert (folder / "models" / "gsm8k-8" / path.name).read_bytes() == path.read_bytes()
    again = json.loads(run_task(slice_stack, "fetch", "--json").stdout)
    assert again["skipped"] == result["files"] and again["bytes_transferred"] == 0

    metrics = run_task(slice_stack, "metrics", "--json")
    assert metrics.returncode == 0, metrics.stdout + metrics.stderr
    found = json.loads(metrics.stdout)
    assert found["run"] == "gsm8k-8" and found["plot"].endswith("runs/gsm8k-8/metrics.png")
    assert [row["step"] for row in found["rows"]] == [1, 2, 3, 4]  # the recorded run's steps, from its events
    assert {e["stage"] for e in found["evals"]} >= {"pre", "post"}  # from the training log this laptop kept


def fake_docker(folder, push_exit: int = 0):
    """A stand-in for the docker CLI at its boundary: `docker info` answers, `build` and `push` record their
    argv and the Dockerfile they were given, and exit as docker does (0, or `push_exit`)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = folder / "docker-calls"
    (bin_dir / "docker").write_text(f"""#!/bin/bash
echo "$@" >> {record}
case "$1" in
  build) cp "${{@: -1}}/Dockerfile" {folder}/Dockerfile.seen ;;
  push) exit {push_exit} ;;
esac
""")
    (bin_dir / "docker").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, record


def test_image_builds_pushes_and_records_the_image_that_jobs_then_run(slice_stack, kube):
    folder, _, _ = slice_stack
    del kube.configmaps["tpu-grpo-image"]
    refused = run_task(slice_stack, "train", "--run-name", "gsm8k-9")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"error: the cluster has no record of {IMAGE} being pushed; fix: uv run invoke image"
    )
    assert kube.jobsets == {}
    path, record = fake_docker(folder)
    built = run_task(slice_stack, "image", env=path)
    assert built.returncode == 0, built.stdout + built.stderr
    calls = [line for line in record.read_text().splitlines() if line != "info"]  # `docker info`: is a daemon up?
    assert calls == [f"build --platform=linux/amd64 -t {IMAGE} {calls[0].split()[-1]}", f"push {IMAGE}"]
    dockerfile = (folder / "Dockerfile.seen").read_text()
    assert (
        'uv pip install "maxtext[tpu-post-train]==0.2.3" jax==0.10.1 jaxlib==0.10.1 --resolution=lowest' in dockerfile
    )
    assert "RUN install_tpu_post_train_extra_deps" in dockerfile
    assert kube.configmaps["tpu-grpo-image"]["data"]["image"] == IMAGE
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-9").returncode == 0


def test_a_failed_push_says_how_to_log_docker_in(slice_stack, kube):
    folder, _, _ = slice_stack
    del kube.configmaps["tpu-grpo-image"]
    path, _ = fake_docker(folder, push_exit=1)
    failed = run_task(slice_stack, "image", "--builder", "docker", env=path)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == (
        f"error: `docker push {IMAGE}` failed building {IMAGE}; fix: gcloud auth configure-docker "
        "us-east5-docker.pkg.dev (then run this again)"
    )
    assert "tpu-grpo-image" not in kube.configmaps


def test_image_dry_run_and_its_refusals(slice_stack, stack_values, home):
    dry = run_task(slice_stack, "image", "--dry-run", "--builder", "cloud-build")
    assert dry.returncode == 0
    assert dry.stdout.splitlines()[-1] == (
        f"$ gcloud builds submit --project=grpo-lab-123 --region=us-east5 --tag={IMAGE} "
        "--machine-type=e2-highcpu-32 --timeout=3600s CONTEXT"
    )
    bad = run_task(slice_stack, "image", "--builder", "kaniko")
    assert bad.returncode == 2 and "--builder 'kaniko' is not a builder" in bad.stderr
    folder, _, _ = slice_stack
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": stack_values}))
    one_vm = run_task(slice_stack, "image")
    assert one_vm.returncode == 2 and "is one VM, which `invoke provision` installs MaxText on" in one_vm.stderr


def test_a_job_without_any_token_is_refused_before_it_is_created(slice_stack, kube):
    result = run_task(slice_stack, "train", "--run-name", "gsm8k-11", env={"HF_TOKEN": ""})
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: no Hugging Face token for the slice's pods: HF_TOKEN is not set and the cluster has no Secret "
        "tpu-grpo-hf-token; fix: HF_TOKEN=hf_... uv run invoke pipeline"
    )
    assert kube.jobsets == {} and kube.secrets == {}


@pytest.mark.parametrize("token", ["hf_...", "hf_" + "a" * 20 + " " + "b" * 14, "e"])
def test_a_token_that_is_none_is_refused_before_the_cluster_is_asked(slice_stack, kube, token):
    """The token goes to the cluster's Secret: the project's own placeholder, a token with a space inside, one letter
    are no token, said as such before any request (a one-letter token hides no letter of the line)."""
    for args in (("train", "--run-name", "gsm8k-12"), ("pipeline", "--run-name", "gsm8k-12")):
        result = run_task(slice_stack, *args, env={"HF_TOKEN": token})
        assert result.returncode == 2 and result.stderr.startswith("error: HF_TOKEN holds no Hugging Face token ("), (
            result.stderr
        )
        assert len(result.stderr.splitlines()) == 1 and (token not in result.stderr or len(token) == 1)
    assert kube.requests == [] and kube.jobsets == {} and kube.secrets == {}


def test_a_public_models_job_runs_without_a_token(slice_stack, stack_values, bucket, kube):
    """Qwen's weights are public: with no token here and no Secret in the cluster, its job is created anyway, its
    pods read the Secret as optional and its script asks for no token (a gated model's is refused, above)."""
    folder, _, _ = slice_stack
    values = {**stack_values, **SLICE, "tpu-grpo:checkpointStore": f"gs://{bucket}/runs", "tpu-grpo:model": "qwen3-8b"}
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    kube.scenario = kubeapi.Scenario(log=TRAIN_LOG)
    result = run_task(slice_stack, "train", "--batches", "4", "--run-name", "qwen-1", env={"HF_TOKEN": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    [head, _] = kube.jobsets[jobset.job_name("train", "qwen-1")]["spec"]["replicatedJobs"]
    [container, *_] = head["template"]["spec"]["template"]["spec"]["containers"]
    assert "no Hugging Face token in this pod" not in container["command"][2] and kube.secrets == {}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {**jobset.TOKEN_ENV["valueFrom"]["secretKeyRef"]}}} in (
        container["env"]
    )


def test_cloud_build_without_a_gcloud_login_is_refused_before_gcloud_runs(slice_stack, kube):
    """No Docker daemon and no gcloud login: one line naming `gcloud auth login`, and gcloud never runs (it would
    write its configuration folder and print its own errors)."""
    folder, base, _ = slice_stack
    tools = folder / "gcloud-bin"
    tools.mkdir()
    ran = folder / "gcloud-ran"
    (tools / "gcloud").write_text(f'#!/bin/sh\necho "$*" >> {ran}\nexit 1\n')
    (tools / "gcloud").chmod(0o755)
    refused = run_task(slice_stack, "image", env={"PATH": f"{tools}:/usr/bin:/bin"})
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: Cloud Build needs a gcloud login, and gcloud has none (no credentials.db in its configuration folder); "
        "fix: gcloud auth login (or start Docker: --builder docker)"
    )
    assert not ran.exists() and not (Path(base["HOME"]) / ".config/gcloud").exists()
    config = folder / "gcloud-config"
    config.mkdir()
    (config / "credentials.db").write_bytes(b"")  # logged in: Cloud Build is asked (the stand-in fails it)
    failed = run_task(slice_stack, "image", env={"PATH": f"{tools}:/usr/bin:/bin", "CLOUDSDK_CONFIG": str(config)})
    assert failed.returncode == 1 and ran.read_text().startswith("builds submit --project=grpo-lab-123")


def test_a_failed_slice_job_that_left_no_exit_code_still_fails_and_stops_the_pipeline(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(exit_code=137, pods_gone=True)  # the pods went with the node
    result = run_task(slice_stack, "pipeline", "--run-name", "gsm8k-15", "--batches", "4")
    assert result.returncode == 1, result.stdout + result.stderr
    assert set(kube.jobsets) == {jobset.job_name("convert", "gsm8k-15")}  # no training, no export after it
    found = json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
    assert sorted((job["step"], job["state"], job["exit_code"]) for job in found) == [
        ("convert", "failed", 1),
        ("pipeline", "failed", 1),
    ]


def test_status_and_cancel_on_a_slice_see_only_tpu_grpos_jobsets(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(unschedulable="0/1 nodes are available")
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-16", "--detach").returncode == 0
    kube.jobsets["someone-elses"] = {
        "apiVersion": jobset.API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": "someone-elses",
            "labels": {"team": "serving"},
            "creationTimestamp": "2026-12-04T10:00:00Z",
        },
        "spec": {"replicatedJobs": []},
    }
    found = json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
    assert [job["id"] for job in found] == [jobset.job_name("train", "gsm8k-16")]
    cancelled = run_task(slice_stack, "cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert set(kube.jobsets) == {"someone-elses"}  # ours deleted, theirs untouched
    other = run_task(slice_stack, "cancel", "--job", "someone-elses")
    assert other.returncode == 2 and "someone-elses" in kube.jobsets


def test_runs_on_a_slice_lists_each_run_of_the_clusters_jobsets(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(unschedulable="0/1 nodes are available")
    assert run_task(slice_stack, "train", "--run-name", "gsm8k-21", "--detach").returncode == 0
    found = json.loads(run_task(slice_stack, "runs", "--json").stdout)
    assert found["sources"] == {"cluster": "answered", "bucket": "answered", "laptop": "answered"}
    [row] = found["runs"]
    assert (row["run"], row["state"], row["model"], row["chips"], row["capacity"]) == (
        "gsm8k-21",
        "training",
        "llama3.1-8b-Instruct",
        16,
        "reservation",
    )


def export_in_bucket(bucket: str, run: str) -> None:
    """What a slice's export writes into the run's folder (some of it, if the export has not ended well)."""
    from google.cloud import storage

    storage.Client().bucket(bucket).blob(
        f"runs/llama3.1-8b-Instruct/post-train/{run}/hf-trained/config.json"
    ).upload_from_string("{}")


def test_a_slice_run_is_exported_only_by_an_export_that_finished_well_and_runs_are_newest_first(slice_stack, kube):
    """A failed export, or one still running, leaves its run trained even with files of it in the bucket; the one
    that finished makes its run exported; the runs are listed newest first; its steps are its newest checkpoint as a
    number (10 after 2, though the bucket lists "10" first)."""
    bucket = slice_stack[2]
    outcomes = {
        "ended-well": kubeapi.Scenario(),
        "failed": kubeapi.Scenario(exit_code=1),
        "running": kubeapi.Scenario(unschedulable="0/1 nodes are available"),
    }
    for run, outcome in outcomes.items():
        kube.scenario = kubeapi.Scenario()
        assert run_task(slice_stack, "train", "--run-name", run, "--batches", "10").returncode == 0
        checkpoints_in_bucket(bucket, run, 2, 10)
        export_in_bucket(bucket, run)
        kube.scenario = outcome
        run_task(slice_stack, "export", "--run-name", run, *(["--detach"] if run == "running" else []))
    found = json.loads(run_task(slice_stack, "runs", "--json").stdout)
    assert [(row["run"], row["state"], row["steps"]) for row in found["runs"]] == [
        ("running", "trained", 10),
        ("failed", "trained", 10),
        ("ended-well", "exported", 10),
    ]


def test_a_slice_fetch_brings_the_newest_exported_run_not_the_newest_trained(slice_stack, kube, tmp_path):
    bucket = slice_stack[2]
    kube.scenario = kubeapi.Scenario()
    assert run_task(slice_stack, "train", "--run-name", "older", "--batches", "4").returncode == 0
    checkpoints_in_bucket(bucket, "older", 4)
    assert run_task(slice_stack, "export", "--run-name", "older").returncode == 0
    export_in_bucket(bucket, "older")
    assert run_task(slice_stack, "train", "--run-name", "newer", "--batches", "4").returncode == 0
    checkpoints_in_bucket(bucket, "newer", 4)
    fetched = run_task(slice_stack, "fetch", "--json", "--to", str(tmp_path / "model"))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert json.loads(fetched.stdout)["files"] == ["config.json"] and (tmp_path / "model" / "config.json").is_file()
    assert json.loads((slice_stack[0] / "state/fetched/older.json").read_text())["dir"] == str(tmp_path / "model")


def test_a_slice_exports_dry_run_shows_the_export_of_the_run_it_names(slice_stack, kube):
    kube.scenario = kubeapi.Scenario()
    for run in ("asked", "newer"):
        assert run_task(slice_stack, "train", "--run-name", run, "--batches", "4").returncode == 0
        checkpoints_in_bucket(slice_stack[2], run, 4)
    shown = run_task(slice_stack, "export", "--run-name", "asked", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "export RUN_NAME=asked" in shown.stdout and "RUN_NAME=newer" not in shown.stdout
    assert jobset.job_name("export", "asked") in shown.stdout and not any(
        name.startswith("export-") for name in kube.jobsets
    )  # shown, not created


def test_status_on_a_slice_says_whether_the_next_training_starts_warm_from_the_buckets_cache(slice_stack, kube):
    """The compile cache of the stack's training in the bucket (as a training's pods leave it: JAX's KEY-cache files
    in the folder of the image's versions): cold while empty, warm with its entries once a training wrote them."""
    from google.cloud import storage

    from tpu_grpo.catalog import release
    from tpu_grpo.config import settings
    from tpu_grpo.jobs import maxtext

    folder, env, bucket = slice_stack
    cold = json.loads(run_task(slice_stack, "status", "--json").stdout)["compile_cache"]
    assert (cold["warm"], cold["entries"]) == (False, 0)
    chosen = settings.load("dev", folder, lenient=True)
    named = maxtext.compile_cache_name(maxtext.Run.of(chosen.training), "train", "v6e-16x1")
    versions = f"maxtext-{release.MAXTEXT_VERSION}_jax-{release.JAX_VERSION}_jaxlib-0.10.1_libtpu-0.0.52"
    for name, size in (
        ("jit_train_step-1a2b-cache", 3000),
        ("jit_train_step-1a2b-atime", 8),
        ("jit_logprobs-3c4d-cache", 1000),
    ):
        storage.Client().bucket(bucket).blob(f"runs/compile-cache/{versions}/{named}/{name}").upload_from_string(
            b"x" * size
        )
    warm = json.loads(run_task(slice_stack, "status", "--json").stdout)["compile_cache"]
    assert warm == {
        "warm": True,
        "entries": 2,
        "bytes": 4000,
        "folder": f"gs://{bucket}/runs/compile-cache/{versions}/{named}",
    }
    shown = " ".join(run_task(slice_stack, "status").stdout.split())
    assert (
        f"next training of the stack's settings: starts warm (2 compiled programs, 0.0 MB) from gs://{bucket}" in shown
    )


def driver_of(kube, run: str) -> tuple[dict, dict]:
    """A pipeline's driver Job as the cluster got it, and the data its ConfigMap gave it."""
    name = jobset.job_name("pipeline", run)
    return kube.jobs[name], json.loads(kube.configmaps[name]["data"]["chain.json"])


def laptop_pipeline(slice_stack, run: str) -> subprocess.Popen:
    """`invoke pipeline` as a process of its own, as a laptop runs it (to be killed)."""
    folder, env, _ = slice_stack
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "pipeline", "--run-name", run, "--batches", "4"],
        cwd=folder,
        env=task_environment(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(condition, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found


def test_a_slices_pipeline_is_one_driver_job_that_creates_each_steps_jobset_after_the_one_before(slice_stack, kube):
    """The chain as manifests: a batch Job on the CPU pool, as the stack's service account, running chain.py from its
    ConfigMap; its steps are the JobSets `pipeline --dry-run` prints, in order; the cluster saw each created only once
    the one before had ended."""
    kube.scenario = kubeapi.Scenario(log=TRAIN_LOG[:30])
    result = run_task(slice_stack, "pipeline", "--run-name", "ordered", "--batches", "4", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    job, data = driver_of(kube, "ordered")
    name = jobset.job_name("pipeline", "ordered")
    labels = {jobset.RUN_LABEL: "ordered", jobset.STEP_LABEL: "pipeline"}
    assert job["metadata"]["labels"] == labels
    assert job["spec"] == {
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": "tpu-grpo-pipeline",
                "nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-np"},
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "driver",
                        "image": IMAGE,
                        "imagePullPolicy": "Always",
                        "command": ["python3", "/tpu-grpo/chain.py", "/tpu-grpo/chain.json"],
                        "resources": {"limits": {"cpu": "1", "memory": "2G"}},
                        "volumeMounts": [{"name": "chain", "mountPath": "/tpu-grpo", "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "chain", "configMap": {"name": name}}],
            },
        },
    }
    shipped = kube.configmaps[name]["data"]["chain.py"]
    assert shipped == (Path(__file__).parents[2] / "tpu_grpo/host/remote/chain.py").read_text()
    dry = json.loads(
        run_task(slice_stack, "pipeline", "--run-name", "ordered", "--batches", "4", "--dry-run", "--json").stdout
    )
    printed = {step["step"]: step["jobset"] for step in dry["steps"]}
    assert [step["name"] for step in data["steps"]] == ["convert", "train"]
    assert [step["manifest"] for step in data["steps"]] == [printed["convert"], printed["train"]]
    assert data["variants"]["last"][0]["manifest"] == printed["export"]
    assert [name for name, _ in kube.created] == [
        jobset.job_name(step, "ordered") for step in ("convert", "train", "export")
    ]
    assert all(running == [] for _, running in kube.created), kube.created  # each after the one before had ended
    [driver] = [
        each
        for each in json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
        if each["step"] == "pipeline"
    ]
    assert (driver["id"], driver["state"], driver["exit_code"]) == (name, "finished", 0)
    lines = run_task(slice_stack, "logs", "--job", name).stdout.splitlines()
    assert lines == [
        f"tpu-grpo pipeline: convert job {jobset.job_name('convert', 'ordered')}",
        "tpu-grpo pipeline: convert exit 0",
        f"tpu-grpo pipeline: train job {jobset.job_name('train', 'ordered')}",
        "tpu-grpo pipeline: train exit 0",
        f"tpu-grpo pipeline: export job {jobset.job_name('export', 'ordered')}",
        "tpu-grpo pipeline: export exit 0",
    ]


@pytest.mark.parametrize("iterations", [1, 2])
def test_the_drivers_export_of_a_chosen_step_is_the_jobset_the_laptop_renders_for_it(stack_values, bucket, iterations):
    from infra import offline
    from tpu_grpo.host.remote import chain
    from tpu_grpo.jobs import maxtext, pipeline, slice_jobs

    values = {**stack_values, **SLICE, "tpu-grpo:checkpointStore": f"gs://{bucket}/runs"}
    settings = offline.run(values, "dev")[0]
    run = maxtext.Run.of(settings.training, batches=50, run_name="peak")
    run = replace(run, sets={**run.sets, "train": {**run.sets.get("train", {}), "rl.num_iterations": str(iterations)}})
    data = json.loads(json.dumps(slice_jobs.chain_data(settings, run)))
    steps = range(run.checkpoint_period, run.train_steps + 1, run.checkpoint_period)
    assert run.train_steps in steps and len(steps) > 2
    for step in steps:
        [export] = chain.variant(data, step)
        wanted = slice_jobs.manifest(settings, replace(run, scored_step=step), "export")
        assert export["manifest"] == json.loads(json.dumps(wanted)), step
    [last] = chain.variant(data, None)
    assert last["manifest"] == json.loads(json.dumps(slice_jobs.manifest(settings, run, "export")))
    assert str(pipeline.SENTINEL) not in json.dumps(last)


def test_a_slices_pipeline_goes_on_without_the_laptop_and_exports_the_best_scored_checkpoint(slice_stack, kube):
    """The laptop's invoke is killed while the training runs: the driver trains to the end, chooses the checkpoint
    the evaluations scored best (2 of 2 and 4) and exports it; status, logs and a later follow see it all."""
    bucket = slice_stack[2]
    kube.scenario = kubeapi.Scenario(
        log=peaked(TRAIN_LOG, {"pre": 5.0, 2: 50.0, 4: 25.0, "post": 20.0}), line_delay=0.002
    )
    checkpoints_in_bucket(bucket, "alone", 2)
    laptop = laptop_pipeline(slice_stack, "alone")
    train = jobset.job_name("train", "alone")
    wait_for(
        lambda: train in kube.jobsets and any(kube.logs.get(pod) for pod in kube.pods if pod.startswith(train)),
        "the training started",
    )
    laptop.kill()
    laptop.wait()
    assert "terminalState" not in kube.jobsets[train]["status"]  # killed while it trained
    checkpoints_in_bucket(bucket, "alone", 4)  # as the training writes its last
    name = jobset.job_name("pipeline", "alone")
    wait_for(lambda: kube.jobs[name]["status"].get("conditions"), "the driver ended")
    assert kube.jobs[name]["status"]["conditions"][0]["type"] == "Complete"
    assert "exports checkpoint 2, the best scored of those in the store" in export_script(kube, "alone")
    assert kube.jobsets[jobset.job_name("export", "alone")]["status"]["terminalState"] == "Completed"
    followed = run_task(slice_stack, "logs", "--job", name, "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "convert finished" in followed.stdout and "export finished" in followed.stdout
    again = run_task(slice_stack, "pipeline", "--run-name", "alone", "--batches", "4")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "convert: skipped (a later step is done)\ntrain: done (its output is in the bucket)\n" in again.stdout
    assert "export finished" in again.stdout  # no JobSet writes the bucket here: only the training's checkpoints are


def test_cancel_stops_a_slices_pipeline_and_the_step_it_waits_for(slice_stack, kube):
    kube.scenario = kubeapi.Scenario(unschedulable="0/1 nodes are available")
    laptop = laptop_pipeline(slice_stack, "stopped")
    convert, name = jobset.job_name("convert", "stopped"), jobset.job_name("pipeline", "stopped")
    wait_for(lambda: convert in kube.jobsets, "the conversion was created")
    laptop.kill()
    laptop.wait()
    found = json.loads(run_task(slice_stack, "status", "--json").stdout)["jobs"]
    assert sorted((job["step"], job["state"]) for job in found) == [("convert", "pending"), ("pipeline", "running")]
    process = kube.processes[name]
    cancelled = run_task(slice_stack, "cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled {name}, {convert}")
    assert kube.jobs == {} and kube.jobsets == {} and process.poll() is not None


def test_a_cluster_without_the_drivers_service_account_is_told_to_run_up(slice_stack, kube):
    kube.serviceaccounts.clear()  # a stack made before its pipelines ran in the cluster
    refused = run_task(slice_stack, "pipeline", "--run-name", "old", "--batches", "4")
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith("a stack made before pipelines ran in the cluster); fix: uv run invoke up")
    assert kube.jobs == {} and kube.jobsets == {}

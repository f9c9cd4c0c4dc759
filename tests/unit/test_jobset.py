"""The JobSets a slice's steps run as: the Pathways training JobSet against what xpk 1.16.0 itself
renders for the same inputs (`xpk workload create-pathways --dry-run --output-manifest-file`), every
difference named; every rendered JobSet against JobSet v0.10.1's CRD schema, strictly (an unknown
field is an error, as the API server's strict field validation makes it); and the slice's MaxText
scripts against the one VM's, difference by difference."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.doubles import kubeapi
from tpu_grpo.catalog import images
from tpu_grpo.catalog.accelerators import SLICES
from tpu_grpo.cloud import jobset
from tpu_grpo.config import settings
from tpu_grpo.jobs import maxtext, pipeline

IMAGE = "us-east5-docker.pkg.dev/grpo-lab-123/tpu-grpo/maxtext-post-training:0.2.3"
SCRATCH = "gs://grpo-lab-runs/runs/pathways-scratch"
#: One line: xpk pastes --command into a YAML block unindented, so a second line breaks its manifest.
SCRIPT = "set -eo pipefail; python3 -m maxtext.trainers.post_train.rl.train_rl model_name=llama3.1-8b-Instruct"
HEAD = "spec.replicatedJobs.0.template.spec.template.spec"
WORKER = "spec.replicatedJobs.1.template.spec.template"
#: Where tpu-grpo's Pathways JobSet differs from xpk's, and why (tpu_grpo/cloud/jobset.py says the same).
DIFFERENCES = {
    "metadata.labels": "tpu-grpo's run and step labels, by which it finds its jobs; no Kueue queue (the "
    "cluster runs no Kueue: one workload at a time)",
    f"{HEAD}.containers.0.command": "the step's script itself, without xpk's wrapper: bash runs it in the "
    "foreground, so its exit code is the container's and SIGTERM reaches it",
    f"{HEAD}.containers.0.env": "ENABLE_PATHWAYS_PERSISTENCE=1 (MaxText's multi-host tutorial) and HF_TOKEN from a "
    "Secret added to xpk's four",
    f"{HEAD}.containers.0.securityContext": "not privileged: the head's container runs on a CPU host and opens no "
    "device",
    f"{WORKER}.metadata.labels": "tpu-grpo's run label instead of xpk's workload label",
    f"{WORKER}.spec.priorityClassName": "no priority class: the cluster defines none (xpk's come with Kueue)",
}


def differences(ours, theirs, path="") -> dict[str, tuple]:
    """The paths where two manifests differ, as deep as both are mappings or lists of one length."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found = {}
        for key in ours.keys() | theirs.keys():
            found.update(differences(ours.get(key), theirs.get(key), f"{path}.{key}".lstrip(".")))
        return found
    if (
        isinstance(ours, list)
        and isinstance(theirs, list)
        and len(ours) == len(theirs)
        and all(isinstance(item, dict) for item in ours + theirs)
    ):
        found = {}
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            found.update(differences(mine, other, f"{path}.{index}"))
        return found
    return {} if ours == theirs else {path: (ours, theirs)}


def xpk_manifest(xpk: Path, tmp_path: Path, shape: str, num_slices: int, capacity: list[str]) -> dict:
    manifest = tmp_path / "xpk.yaml"
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "TELEMETRY_ENABLED": "false",
        "DEPENDENCY_AUTO_DOWNLOAD": "false",
    }
    made = subprocess.run(
        [
            str(xpk),
            "workload",
            "create-pathways",
            "--dry-run",
            f"--output-manifest-file={manifest}",
            f"--tpu-type={shape}",
            f"--num-slices={num_slices}",
            "--workload=train-run-1",
            "--cluster=tpu-grpo",
            "--project=grpo-lab-123",
            "--project-number=123456789",
            "--zone=us-east5-b",
            f"--docker-image={IMAGE}",
            f"--command={SCRIPT}",
            f"--server-image={images.PATHWAYS_SERVER}",
            f"--proxy-server-image={images.PATHWAYS_PROXY}",
            f"--pathways-gcs-location={SCRATCH}",
            "--skip-validation",
            *capacity,
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    return yaml.safe_load(manifest.read_text())


@pytest.fixture(scope="module")
def jobset_schema():
    return kubeapi.jobset_validator()


@pytest.mark.parametrize(
    "shape, num_slices, capacity",
    [
        ("v6e-16", 1, ["--reservation=v6e-calendar"]),
        ("v6e-256", 1, ["--spot"]),
        ("v6e-64", 2, ["--on-demand"]),
        ("v6e-32", 1, ["--flex"]),  # xpk's workload is the same for every capacity: that lives in the node pool
    ],
)
def test_the_pathways_jobset_is_xpks_with_each_difference_named(
    xpk, tmp_path, jobset_schema, shape, num_slices, capacity
):
    ours = jobset.pathways("train-run-1", "train", "run-1", IMAGE, SCRIPT, SLICES[shape], num_slices, SCRATCH)
    theirs = xpk_manifest(xpk, tmp_path, shape, num_slices, capacity)
    found = differences(ours, theirs)
    named = {path: [name for name in DIFFERENCES if path == name or path.startswith(name + ".")] for path in found}
    assert {path: found[path] for path, names in named.items() if not names} == {}  # nothing unexplained
    assert {name for names in named.values() for name in names} == set(DIFFERENCES)  # each one real
    # Within the named differences, only what each names differs.
    assert ours["metadata"]["labels"] == {jobset.RUN_LABEL: "run-1", jobset.STEP_LABEL: "train"}
    wrapper = theirs["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert wrapper[:2] == ["bash", "-c"] and f"({SCRIPT})" in wrapper[2]
    head = ours["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    their_head = theirs["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert head["command"] == ["bash", "-c", SCRIPT]
    assert head["env"][:4] == [{**e, "value": e["value"].strip()} if "value" in e else e for e in their_head["env"]]
    assert head["env"][4:] == [
        {"name": "ENABLE_PATHWAYS_PERSISTENCE", "value": "1"},
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "tpu-grpo-hf-token", "key": "token", "optional": True}},
        },
    ]
    assert their_head["securityContext"] == {"privileged": True} and "securityContext" not in head
    # The Pathways images are pinned, never `latest`, and the worker count is the slice's.
    pods = [job["template"]["spec"]["template"]["spec"] for job in ours["spec"]["replicatedJobs"]]
    pinned = [c["image"] for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]
    assert all(not image.endswith(":latest") for image in pinned) and images.PATHWAYS_SERVER in pinned
    worker = ours["spec"]["replicatedJobs"][1]
    assert (worker["replicas"], worker["template"]["spec"]["parallelism"]) == (num_slices, SLICES[shape].hosts)
    jobset_schema.validate(ours)
    jobset_schema.validate(theirs)  # the check itself accepts what xpk makes


def test_the_cpu_jobset_and_a_misspelt_field_meet_the_crd_schema(jobset_schema):
    made = jobset.cpu("convert-run-1", "convert", "run-1", IMAGE, SCRIPT)
    jobset_schema.validate(made)
    pod = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    assert {"name": "JAX_PLATFORMS", "value": "cpu"} in pod["containers"][0]["env"]
    assert "google.com/tpu" not in pod["containers"][0]["resources"]["limits"]
    misspelt = copy.deepcopy(made)
    misspelt["spec"]["replicatedJobs"][0]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="'replica' was unexpected"):
        jobset_schema.validate(misspelt)


@pytest.mark.parametrize("run_name", ["2026-12-04-10-00-00", "GSM8K.Run_7", "x" * 100])
def test_job_names_are_dns_labels_unique_per_run(run_name):
    name = jobset.job_name("train", run_name)
    assert len(name) <= 40 and name[0].isalpha() and name[-1].isalnum()
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert name != jobset.job_name("train", run_name + "2")


def _parts(script: str) -> tuple[dict, list[str], list[str]]:
    """A step script's exports, its MaxText argv and its other lines."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("python3 -m ", "python3 - maxtext.")))
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    # the training's program (run_module) follows as a heredoc
    argv = [re.sub(r" <<'\w+'", "", line).strip().removesuffix("\\").strip() for line in lines[start : end + 1]]
    assigned = [line for line in lines if re.match(r"export \w+=", line)]
    exports = dict(line.removeprefix("export ").split("=", 1) for line in assigned)
    exports.update(line.split(";")[0].split("=", 1) for line in lines if line.startswith("TPU_NAME="))
    return (
        exports,
        argv,
        [
            line
            for line in lines[:start] + lines[end + 1 :]
            if line not in assigned and not line.startswith("TPU_NAME=")
        ],
    )


@pytest.mark.parametrize("step", maxtext.STEPS)
def test_a_slice_runs_the_one_vm_argv_without_what_describes_one_vm(stack_dir, stack_values, monkeypatch, step):
    values = {
        **stack_values,
        "tpu-grpo:slice": "v6e-16",
        "tpu-grpo:usePathways": "true",
        "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
    }
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    monkeypatch.chdir(stack_dir)
    run = pipeline.build_run(settings.load("dev", lenient=True), run_name="gsm8k-1")
    # a VM's export first scores its checkpoint on the report examples (a train_rl on the TPU), which a slice's CPU
    # pod cannot
    vm_exports, vm_argv, vm_other = _parts(maxtext.script(dataclasses.replace(run, report_batches=0), step))
    exports, argv, other = _parts(maxtext.script(run, step, maxtext.Placement(pod=True, slice_shape="v6e-16x1")))
    # The exports: the one VM's, less those that describe one VM's chips to libtpu, and the export into the
    # run's folder in the bucket rather than a pod's /dev/shm.
    expected = {
        name: value
        for name, value in vm_exports.items()
        if name not in maxtext.ONE_VM_ONLY and f"export {name}={value}" != maxtext.KEEP_EVERY_COMPILATION
    }
    if step == "export":
        assert expected["HF_EXPORT"] == "/dev/shm/$MODEL_NAME/hf-trained/"
        expected["HF_EXPORT"] = "$BASE_OUTPUT_DIRECTORY$RUN_NAME/hf-trained/"  # no `//` in its object names
    assert exports == expected
    assert exports.get("CHIPS_PER_VM", "4") == "4" and exports["USE_PATHWAYS"] == "1"
    # The argv: the one VM's, less the model folder that provisioning downloads onto a VM; the export runs on a CPU
    # pod as MaxText's convert_checkpoint.md runs it on a CPU machine (no jax.distributed start-up to answer).
    assert argv[-1].endswith(" &")  # in the background of its pod's PID 1, which passes a SIGTERM on to it
    argv[-1] = argv[-1].removesuffix(" &")
    on_cpu = ["hardware=cpu", "skip_jax_distributed_system=true"] if step == "export" else []
    assert argv == [arg for arg in vm_argv if "hf_model_path" not in arg] + on_cpu
    # The rest: the image has MaxText on its PATH, the token comes from a Secret, and the compile cache is the
    # bucket's, for the slice's shape (the training) or its CPU pool (the others).
    cache = [line for line in vm_other if line.startswith("COMPILE_CACHE=$(")]
    assert [line for line in vm_other if line not in other] == [
        "source ~/maxtext_venv/bin/activate",
        *maxtext.token_lines(needed=run.row.gated),
        *[line for line in vm_other if "hf_model_path" in line],
        *cache,
    ]
    where = "v6e-16x1" if step == "train" else "cpu-pool"
    cache_line = [line for line in other if line.startswith("COMPILE_CACHE=$(")]
    assert cache_line == [
        cache[0]
        .replace(f'"{run.machine.machine_type}/', f'"{where}/')
        .replace('"~/tpu-grpo/compile-cache"', '"gs://grpo-lab-runs/runs/compile-cache"')
    ]
    assert [line for line in other if line not in vm_other] == [
        maxtext.POD_TOKEN_CHECK,
        *cache_line,
        maxtext.FORWARD_TERM,
        *maxtext.WAIT_CHILD,
    ]

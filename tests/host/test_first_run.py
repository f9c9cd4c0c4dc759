"""The README's cheap first run, as a newcomer types it, with no Hugging Face token anywhere: Qwen3 0.6B on one spot
chip is public on the Hub, so neither the laptop, the playbook, the preflight nor the jobs ask for one. On a throwaway
host provisioned for real by the playbook (its MaxText the stand-in, installed from a wheel: tests/doubles/wheels.py),
the model downloaded from a stand-in of the Hub (tests/doubles/hub.py) that serves it without a token, as
huggingface.co serves a public repository."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.doubles.hub import HubServer
from tests.doubles.wheels import workload_standin_wheel
from tests.host.test_recovery import provisioning_vars, vm_image
from tests.support import statuses

QWEN = "Qwen/Qwen3-0.6B"
QWEN_FILES = {
    "model.safetensors": os.urandom(1 << 20),
    "config.json": b'{"hidden_size": 1024}',
    "generation_config.json": b"{}",
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
}
#: docs/first-run.md's "A cheap first run", its `pulumi config set` lines as the stack file they write
CHEAP_RUN = {
    "tpu-grpo:capacity": "spot",
    "tpu-grpo:machineType": "ct6e-standard-1t",
    "tpu-grpo:model": "qwen3-0.6b",
}


def test_the_cheap_first_run_needs_no_token_from_provision_to_a_fetched_model(make_host, stack_values, tmp_path):
    project = tmp_path / "checkout"
    project.mkdir()
    (project / "Pulumi.yaml").write_text((Path(__file__).parents[2] / "Pulumi.yaml").read_text())
    values = {key: value for key, value in {**stack_values, **CHEAP_RUN}.items() if key != "tpu-grpo:reservation"}
    (project / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    laptop_home = tmp_path / "laptop"
    laptop_home.mkdir()
    wheels = tmp_path / "wheels"
    workload_standin_wheel(wheels)
    host = make_host(boot=False, disk_mb=256)
    vm_image(host, wheels)
    control = host.user.home / ".standin.json"  # the stand-in's JAX sees the one chip of a ct6e-standard-1t
    control.write_text(json.dumps({**json.loads(control.read_text()), "device_count": 1}))
    host.vm.boot()
    with HubServer() as hub:
        hub.seed(QWEN, QWEN_FILES, gated=False)
        env = {
            **{key: value for key, value in host.env().items() if not key.startswith("HF_")},
            "HOME": str(laptop_home),  # no token file in the laptop's huggingface_hub cache either
            "HF_ENDPOINT": hub.url,
        }
        vars = [arg for arg in provisioning_vars(host) if arg != "hf_model="]  # the stack's model is downloaded

        def invoke(*args: str) -> subprocess.CompletedProcess:
            argv = [*host.argv(args[0], vars=False), *args[1:]]
            return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=project, timeout=600)

        provisioned = invoke("provision", "--json", *vars)
        assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
        steps = statuses(provisioned)
        assert steps["Hugging Face token"] == "skipped"
        assert steps["model downloaded"] == "changed"
        assert hub.authorizations == set()  # the Hub was asked without a token
        ran = invoke("pipeline", "--batches", "4", "--need-gb", "0.001,0.001")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        fetched = invoke("fetch", "--to", str(tmp_path / "models"))
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert not host.vm.path(f"/home/{host.user.name}/.cache/huggingface/token").exists()
    fetched_files = {path.name for path in (tmp_path / "models").iterdir()}
    assert {"SHA256SUMS", "config.json", "tokenizer.json"} <= fetched_files  # the model, checked against its sums

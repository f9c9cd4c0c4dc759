"""The real-MaxText tier: the project's own generated convert, train and export scripts, run by bash against MaxText
0.2.3 itself on the CPU (tests/maxtext/install makes its venv; standin/sitecustomize.py says the one substitution,
vLLM's rollout, and the shrinking of the model). Each script runs as the VM or a slice's pod would run it: in a
home laid out as provisioning leaves one (the venv at ~/maxtext_venv, the token file, the downloaded model), with
the Hub's stand-in (tests/doubles/hub.py) serving the model's repositories as HF_ENDPOINT, in a mount namespace of
its own whose /dev/shm is a folder of the test's (root, as the host tier)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles.hub import Hub, HubServer
from tests.maxtext.families import TOKENIZER, Family
from tests.support import MAXTEXT_VENV as VENV, ROOT, built_once

STANDIN = ROOT / "tests/maxtext/standin"
#: The tier's compile caches, kept beside its venv between runs, as a VM's data disk keeps them between jobs: each
#: step's folder is named as the project names it (maxtext.compile_cache_name, below the versions), so a step whose
#: family, placement's machine and settings were compiled before, in this run or an earlier one, starts warm.
COMPILE_CACHES = VENV.parent / f"{VENV.name}-compile-cache"
BASE_TEMPLATE_MARK = b"{# the base model's template #}"
#: The tier's inputs, each written once beside its venv by the code that describes it (families.py, with the tokenizer
#: it copies; a change of either writes them anew): every family's tiny checkpoint, and the GSM8K-shaped rows, whose
#: one path then names the same compile cache folder in every test that trains on them.
INPUTS = VENV.parent / f"{VENV.name}-inputs"
#: A pod's environment as a slice's CPU JobSet gives it (tpu_grpo/cloud/jobset.py `cpu`), and what GKE puts in every pod.
POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "JAX_PLATFORMS": "cpu",
           "HF_TOKEN": "hf_tier_token"}


@dataclass
class Host:
    """A home laid out as `invoke provision` leaves a VM, for one model's tiny checkpoint."""
    home: Path
    family: Family
    data: Path
    hub: Hub

    def run(self, script: str, *, in_slice: bool = False, timeout: int = 900) -> subprocess.CompletedProcess:
        """The script as the job (or the pod) runs it: bash, in its own mounts with the host's /dev/shm."""
        env = {"HOME": str(self.home), "PATH": f"{VENV / 'bin'}:/usr/bin:/bin" if in_slice else "/usr/bin:/bin",
               "PYTHONPATH": str(STANDIN), "HF_ENDPOINT": self.hub.url, "HF_DATASETS_OFFLINE": "1",
               "JAX_PLATFORMS": "cpu", "TPU_GRPO_TINY_MODEL": str(self.model_folder),
               "TPU_GRPO_TINY_MODEL_NAME": self.family.model, "LANG": "C.UTF-8",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={self.family.chips}",  # the machine's chips
               **(POD_ENV if in_slice else {})}
        self.shm.mkdir(exist_ok=True)
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                               f"mount --bind {self.shm} /dev/shm && exec bash -s"], input=script, text=True,
                              capture_output=True, env=env, cwd=self.home, timeout=timeout)

    def keep_compile_caches(self, root: str) -> set[Path]:
        """Make the scripts' compile cache root (`root`, as they name it) the tier's kept one; returns the entries it
        holds now."""
        COMPILE_CACHES.mkdir(parents=True, exist_ok=True)
        self.path(root).parent.mkdir(parents=True, exist_ok=True)
        self.path(root).symlink_to(COMPILE_CACHES)
        return set(COMPILE_CACHES.rglob("*-cache"))

    @property
    def shm(self) -> Path:
        return self.home.parent / "shm"

    def path(self, path: str) -> Path:
        """A path as the scripts name it (`~/...`, `/dev/shm/...`), where it is here."""
        if path.startswith("/dev/shm/"):
            return self.shm / path.removeprefix("/dev/shm/")
        return Path(path.replace("~", str(self.home), 1))

    @property
    def model_folder(self) -> Path:
        from tpu_grpo.config.models import MODELS

        return self.home / "tpu-grpo/base-models" / MODELS[self.family.model].hf_id


@pytest.fixture
def hub():
    with HubServer() as served:
        yield served


def lay_out_host(folder: Path, hub: Hub, family: Family) -> Host:
    """A host for `family` in `folder`: the venv, the token file, the model downloaded as provisioning does (with its
    `.complete` mark), GSM8K-shaped rows; and on the Hub, the repositories MaxText downloads the model, its
    tokenizers and configs from (the export name's with a chat template of its own where it is another model's)."""
    from tpu_grpo.jobs.maxtext import MODELS

    home = folder / "home"
    (home / ".cache/huggingface").mkdir(parents=True)
    (home / ".cache/huggingface/token").write_text("hf_tier_token")
    (home / "maxtext_venv").symlink_to(VENV)
    row = MODELS[family.model]
    host = Host(home, family, tier_input("gsm8k"), hub)
    shutil.copytree(tier_input(family.model), host.model_folder, ignore=shutil.ignore_patterns(".complete"))
    host.model_folder.with_name(host.model_folder.name + ".complete").touch()
    files = {path.name: path.read_bytes() for path in host.model_folder.iterdir()}
    for repo_id in {row.hf_id, row.training_tokenizer}:
        hub.seed(repo_id, files, gated=False)
    export_repo = MODELS[row.export_model].hf_id
    if export_repo not in {row.hf_id, row.training_tokenizer}:  # an instruct model exported under its base's name
        # the base's own chat template, as the Hub has it apart: the export must carry the one the run trained with
        hub.seed(export_repo, {**files, "chat_template.jinja": files["chat_template.jinja"] + BASE_TEMPLATE_MARK},
                 gated=False)
    return host


def tier_input(what: str) -> Path:
    """A family's checkpoint (`what`: its model) or the rows (`gsm8k`), as `python -m tests.maxtext.families` writes
    them in the tier's venv, once."""
    sources = [ROOT / "tests/maxtext/families.py", *sorted(TOKENIZER.iterdir())]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]
    return built_once(INPUTS / f"{what}-{digest}", lambda folder: subprocess.run(
        [VENV / "bin/python", "-m", "tests.maxtext.families", what, folder], cwd=ROOT, check=True, capture_output=True))


@pytest.fixture
def make_host(tmp_path, hub):
    """A host for a family (lay_out_host) in the test's folder."""
    return lambda family: lay_out_host(tmp_path, hub, family)

"""The real-MaxText tier: the project's own generated convert, train and export scripts, run by bash against MaxText
0.2.3 itself on the CPU (tests/maxtext/install makes its venv; stack.py says how each run is made from a stack file
and everything the tier changes for a CPU). Each script runs as the VM or a slice's pod would run it: in a home laid
out as provisioning leaves one (the venv at ~/maxtext_venv, the token file, the downloaded model), with the Hub's
stand-in (tests/doubles/hub.py) serving the model's repositories as HF_ENDPOINT and, in a slice, its bucket on the
Cloud Storage emulator, in a mount namespace of its own whose /dev/shm is a folder of the test's (root, as the host
tier)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles.hub import Hub, HubServer
from tests.maxtext import stack
from tests.maxtext.families import TOKENIZER, Family
from tests.support import MAXTEXT_VENV as VENV
from tests.support import ROOT, built_once
from tpu_grpo.host import gcs

#: The tier's compile caches, kept beside its venv between runs, as a VM's data disk keeps them between jobs: each
#: step's folder is named as the project names it (maxtext.compile_cache_name, below the versions), so a step whose
#: family, placement's machine and settings were compiled before, in this run or an earlier one, starts warm.
COMPILE_CACHES = VENV.parent / f"{VENV.name}-compile-cache"
#: What the base model's own chat template (the Hub stand-in's) puts before the trained one's: a rendering shows it.
BASE_TEMPLATE_MARK = b"[the base model's template] "
#: The tier's inputs, each written once beside its venv by the code that describes it (families.py, with the tokenizer
#: it copies; a change of either writes them anew): every family's tiny checkpoint, and the GSM8K-shaped rows, whose
#: one path then names the same compile cache folder in every test that trains on them.
INPUTS = VENV.parent / f"{VENV.name}-inputs"


def die_with_parent() -> None:
    """In the child, before it runs: SIGKILL when the process that started it dies (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Host:
    """A home laid out as `invoke provision` leaves a VM, for one model's tiny checkpoint."""

    home: Path
    family: Family
    data: Path
    hub: Hub

    def run(
        self, script: str, added: Mapping[str, str], in_slice: bool = False, timeout: int = 900
    ) -> subprocess.CompletedProcess:
        """The script as the job (or the pod) runs it, its environment and `added` (stack.script's), its output and
        errors one stream as a job's log is: bash, in its own mounts and PIDs with the host's /dev/shm, JAX on the CPU
        (stack.cpu_environment)."""
        env = {
            "HOME": str(self.home),
            "PATH": f"{VENV / 'bin'}:/usr/bin:/bin" if in_slice else "/usr/bin:/bin",
            "HF_ENDPOINT": self.hub.url,
            "LANG": "C.UTF-8",
            "TPU_GRPO_TINY_MODEL": str(self.model_folder),
            "TPU_GRPO_ROLLOUT_LOG": str(self.rollout_log),
            **stack.cpu_environment(self.family),
            **added,
        }
        self.shm.mkdir(exist_ok=True)
        # a PID namespace of its own, whose init unshare kills when it dies (--kill-child), and unshare dies with this
        # worker (die_with_parent): a killed test run leaves no training running on, as its own session would
        command = [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--mount-proc",  # its /proc, whose PIDs are the namespace's (what getpid says inside it)
            "--propagation",
            "private",
            "bash",
            "-c",
            f"mount --bind {self.shm} /dev/shm && exec bash -s",
        ]
        # the log in a file of the test's as it is written (what a hung or failed step said is there to read)
        self.logs.mkdir(exist_ok=True)
        log = self.logs / f"{len(list(self.logs.iterdir())):02d}.log"
        with (
            log.open("w+") as written,
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=written,
                stderr=subprocess.STDOUT,  # one stream in the order written, as a job's log (job_wrapper.sh)
                text=True,
                env=env,
                cwd=self.home,
                start_new_session=True,
                preexec_fn=die_with_parent,
            ) as process,
        ):
            try:
                process.communicate(script, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # MaxText and its pools too, not the shell alone
                raise
            stdout = log.read_text()
        return subprocess.CompletedProcess(command, process.returncode, stdout, "")

    @property
    def logs(self) -> Path:
        return self.home.parent / "logs"

    @property
    def rollout_log(self) -> Path:
        return self.home.parent / "rollout.jsonl"

    def keep_compile_caches(self, root: str) -> set[Path]:
        """Make the scripts' compile cache root (`root`, as they name it) the tier's kept one; returns the entries it
        holds now."""
        COMPILE_CACHES.mkdir(parents=True, exist_ok=True)
        self.path(root).parent.mkdir(parents=True, exist_ok=True)
        self.path(root).symlink_to(COMPILE_CACHES)
        return set(COMPILE_CACHES.rglob("*-cache"))

    @staticmethod
    def keep_bucket_compile_caches(root: str, model: str) -> set[Path]:
        """Copy the tier's kept compile caches of `model` into the bucket's root (`root`, gs://, as a slice's scripts
        name it), as an earlier run would have left them there; returns the entries it holds now, where they are
        kept (bring_back_compile_caches copies the new ones back)."""
        from google.cloud import storage

        name, prefix = gcs.split(root)
        bucket = storage.Client().bucket(name)
        kept = set(COMPILE_CACHES.glob(f"*/*/{model}/*/*-cache"))
        for path in kept:
            bucket.blob(f"{prefix}{path.relative_to(COMPILE_CACHES)}").upload_from_filename(path)
        return kept

    @staticmethod
    def bring_back_compile_caches(root: str) -> None:
        """Keep the entries a slice's steps wrote in the bucket (`root`) beside the others, for the next run."""
        from google.cloud import storage

        bucket, prefix = gcs.split(root)
        for blob in storage.Client().list_blobs(bucket, prefix=prefix):
            path = COMPILE_CACHES / blob.name.removeprefix(prefix)
            if not blob.name.endswith("/") and not path.exists():  # a folder's own object (TensorFlow's) aside
                path.parent.mkdir(parents=True, exist_ok=True)
                blob.download_to_filename(path.with_name(path.name + ".tmp"))
                path.with_name(path.name + ".tmp").rename(path)  # whole or not at all, for a worker reading it

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
        from tpu_grpo.catalog.models import MODELS

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
    (home / ".cache/huggingface/token").write_text(stack.TOKEN)
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
        hub.seed(
            export_repo,
            {**files, "chat_template.jinja": BASE_TEMPLATE_MARK + files["chat_template.jinja"]},
            gated=False,
        )
    return host


def tier_input(what: str) -> Path:
    """A family's checkpoint (`what`: its model) or the rows (`gsm8k`), as `python -m tests.maxtext.families` writes
    them in the tier's venv, once."""
    sources = [ROOT / "tests/maxtext/families.py", *sorted(TOKENIZER.iterdir())]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]
    return built_once(
        INPUTS / f"{what}-{digest}",
        lambda folder: subprocess.run(
            [VENV / "bin/python", "-m", "tests.maxtext.families", what, folder],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ),
    )


@pytest.fixture
def make_host(tmp_path, hub):
    """A host for a family (lay_out_host) in the test's folder."""
    return lambda family: lay_out_host(tmp_path, hub, family)

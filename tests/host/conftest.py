"""The host tier's fixtures: throwaway hosts (tests/host/rootfs.py) as the tests drive them, and workload hosts
whose MaxText venv holds the stand-in (tests/doubles/standin)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.host import rootfs, sshd
from tests.support import DOUBLES, FIXTURES, MODELS_KNOWN, ROOT, TEST_TOKEN, built_once, ctrl_c_as_in_a_terminal


@dataclass
class TestHost:
    """A throwaway host (tests/host/rootfs.py) as the tests drive it: `invoke ... --host` with its key and
    known_hosts, and root's view of its files and processes."""

    vm: rootfs.ThrowawayHost
    disk: rootfs.DataDisk | None
    key: Path
    state: Path

    @property
    def user(self):
        return self.vm.user

    @property
    def spec(self) -> str:
        port = "" if self.vm.port == 22 else f":{self.vm.port}"
        return f"{self.user.name}@{self.vm.address}{port}"

    @property
    def vars(self) -> list[str]:
        """What this machine allows: no apt upgrade, uv from PyPI, a small real package for MaxText."""
        disk = [f"data_device={self.disk.device}"] if self.disk else ["data_device="]
        return [*rootfs.TEST_VARS, *disk]

    def argv(self, task: str, *args: str, vars: bool = True) -> list[str]:
        argv = [sys.executable, "-m", "invoke", "-r", str(ROOT), task, "--host", self.spec, "--identity", str(self.key)]
        for item in self.vars if vars else []:
            argv += ["--var", item]
        return [*argv, *args]

    def env(self, extra: dict | None = None) -> dict:
        return {
            **os.environ,
            "TPU_GRPO_STATE": str(self.state),
            "HF_TOKEN": TEST_TOKEN,
            "COLUMNS": "200",
            **(extra or {}),
        }

    def invoke(
        self,
        task: str,
        *args: str,
        vars: bool = True,
        timeout: int = 600,
        env: dict | None = None,
        project: Path = ROOT,
    ) -> subprocess.CompletedProcess:
        """Run `invoke TASK --host ... --identity ...` for real, as a user would (in `project`: whose
        Pulumi.dev.yaml is the stack)."""
        return subprocess.run(
            self.argv(task, *args, vars=vars),
            capture_output=True,
            text=True,
            env=self.env(env),
            cwd=project,
            timeout=timeout,
        )

    def on_host(self, *argv: str) -> subprocess.CompletedProcess:
        """Run a command as root in the host's own namespaces and root (its processes, mounts, /dev/shm)."""
        return subprocess.run(
            ["nsenter", f"--target={self.vm.first_process()}", "--mount", "--pid", "--root", "--wd", *argv],
            capture_output=True,
            text=True,
        )

    def run_as_user(self, command: str) -> subprocess.CompletedProcess:
        """Run a bash command as the host's user, in the host's namespaces, with a session's environment."""
        return self.on_host(
            "/usr/sbin/runuser",
            "-u",
            self.user.name,
            "--",
            "env",
            "-i",
            f"HOME=/home/{self.user.name}",
            f"PATH={rootfs.python312_bin()}:/usr/bin:/bin",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "bash",
            "-c",
            command,
        )

    def read_text(self, inside: str) -> str:
        """A file of the running host, its data disk's included."""
        return self.vm.path(inside).read_text()

    def own(self, path: Path) -> None:
        """Give a tree under the user's home (a path as this machine sees it) to the user."""
        inside = "/" + str(path.relative_to(self.vm.root))
        self.vm.chroot("chown", "-R", f"{self.user.name}:{self.user.name}", inside)

    @property
    def python(self) -> str:
        """A Python 3.12 the user can run (the VM's, as the tutorial has it)."""
        return f"{rootfs.python312_bin()}/python3.12"


@pytest.fixture
def throwaway_host(key_pair):
    """A host of its own root file system and namespaces (tests/host/rootfs.py): what a test provisions
    there never lands on this machine. Removed afterwards, every process and mount of it."""
    host = rootfs.ThrowawayHost(rootfs.host_folder(), key_pair[1].read_text())
    try:
        yield host.start()
    finally:
        host.remove()


@pytest.fixture
def make_host(key_pair, tmp_path_factory):
    """Factory of fresh throwaway hosts, each with a data disk (a loop device) unless `disk_mb=0`,
    and the state folder (known_hosts) of a laptop that knows it. `boot=False` leaves it powered off
    (host.vm.boot() starts it). Everything goes afterwards: processes, mounts, loop devices."""
    made: list[TestHost] = []

    def make(disk_mb: int = 64, boot: bool = True, disk: rootfs.DataDisk | None = None, **where) -> TestHost:
        """`disk`: another host's data disk, attached to this one (a VM created anew around it)."""
        if disk is None and disk_mb:
            disk = rootfs.DataDisk.attach(tmp_path_factory.mktemp("disk") / "data.img", disk_mb)
        vm = rootfs.ThrowawayHost(
            rootfs.host_folder(), key_pair[1].read_text(), disk_device=disk.device if disk else None, **where
        )
        made.append(TestHost(vm, disk, key_pair[0], tmp_path_factory.mktemp("state")))
        vm.prepare()
        (made[-1].state / "known_hosts").write_text(vm.known_hosts_line)
        if boot:
            vm.boot()
        return made[-1]

    yield make
    for host in made:
        host.vm.remove()
    for disk in {host.disk.device: host.disk for host in made if host.disk}.values():
        disk.detach()


# ---------------------------------------------------------------- workload hosts (tests/doubles/standin)

SHM_DIRS = ("/dev/shm/llama3.1-8b-Instruct", "/dev/shm/llama3.1-8b")


@dataclass
class WorkloadHost:
    """A test host ready for MaxText jobs: ~/maxtext_venv holds the stand-in maxtext and jax
    (tests/doubles/standin), the token is in its file, and ~/.standin.json sets the stand-in's pace."""

    host: TestHost

    def control(self, **values) -> None:
        control = {"fixtures": f"/home/{self.host.user.name}/fixtures", "line_delay_s": 0.0, **values}
        (self.host.user.home / ".standin.json").write_text(json.dumps(control))

    def records(self, name: str = "records") -> list[dict]:
        """What the stand-in recorded: each run ("records"), or each SIGTERM it got ("signals")."""
        path = self.host.user.home / f".standin/{name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def invoke(
        self, task: str, *args: str, timeout: int = 600, env: dict | None = None, project: Path = ROOT
    ) -> subprocess.CompletedProcess:
        return self.host.invoke(task, *args, vars=False, timeout=timeout, env=env, project=project)

    def chain(self, *tasks: tuple[str, ...]) -> subprocess.CompletedProcess:
        """Several tasks in one `invoke` command line, as the README's one-command run does."""
        argv = self.host.argv(*tasks[0], vars=False)
        for task, *args in tasks[1:]:
            argv += [task, "--host", self.host.spec, "--identity", str(self.host.key), *args]
        return subprocess.run(argv, capture_output=True, text=True, env=self.host.env(), cwd=ROOT, timeout=600)

    def popen(self, task: str, *args: str, project: Path = ROOT) -> subprocess.Popen:
        """`invoke TASK` started in the background, as a user's terminal would run it."""
        return subprocess.Popen(
            self.host.argv(task, *args, vars=False),
            env=self.host.env(),
            cwd=project,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=ctrl_c_as_in_a_terminal,  # its Ctrl-C tests send SIGINT
        )

    def give_client(self, client: Path) -> None:
        """Put a library MaxText's extra brings on a real VM (the hub_client, storage_client fixtures) into the host's
        MaxText venv (a copy in the home, named by a .pth)."""
        host = self.host
        shutil.copytree(client, host.user.home / client.name)
        host.own(host.user.home / client.name)
        made = host.run_as_user(
            f"echo $HOME/{client.name} > $(ls -d ~/maxtext_venv/lib/python3.*/site-packages)/{client.name}.pth"
        )
        assert made.returncode == 0, made.stderr

    def processes(self) -> list[str]:
        """The user's processes still alive on the host (command lines), sshd's own aside."""
        result = self.host.on_host("ps", "-u", self.host.user.name, "-o", "args=")
        return [line for line in result.stdout.splitlines() if line.strip() and not line.startswith("sshd")]

    def restart_empties_shm(self) -> None:
        """What a VM restart does to /dev/shm: MaxText's converted and trained checkpoints are gone."""
        self.host.on_host("rm", "-rf", *SHM_DIRS)


def prepare_workload(host: TestHost) -> WorkloadHost:
    """Give a test host the stand-in MaxText: a Python 3.12 venv at ~/maxtext_venv whose .pth adds
    tests/doubles/standin, the fixtures the stand-in replays, and the token in its file."""
    home = host.user.home
    shutil.copytree(DOUBLES / "standin", home / "standin", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(FIXTURES, home / "fixtures")
    shutil.copy(MODELS_KNOWN, home)  # beside the fixtures: what the stand-in checks model names against
    (home / ".cache/huggingface").mkdir(parents=True)
    (home / ".cache/huggingface/token").write_text(TEST_TOKEN)
    subprocess.run(["chmod", "-R", "u+w", str(home / "fixtures")], check=True)
    host.own(home)
    made = host.run_as_user(
        f"{host.python} -m venv --without-pip ~/maxtext_venv && "
        "echo $HOME/standin > $(ls -d ~/maxtext_venv/lib/python3.*/site-packages)/standin.pth"
    )
    assert made.returncode == 0, made.stderr
    workload = WorkloadHost(host)
    workload.control()
    return workload


def client_for_the_host(name: str, leave_out: str = "") -> Path:
    """A library for the test hosts' MaxText venv, at the laptop's version (the MaxText extra brings it on a real
    VM), installed once into a folder of the test cache; `leave_out`: a glob of its dependencies to remove."""
    from importlib.metadata import version

    def install(folder: Path) -> None:
        python = f"{rootfs.python312_bin()}/python3.12"
        subprocess.run(
            [
                "uv",
                "pip",
                "install",
                "--quiet",
                "--python",
                python,
                "--target",
                str(folder),
                f"{name}=={version(name)}",
            ],
            check=True,
        )
        for path in folder.glob(leave_out) if leave_out else ():
            shutil.rmtree(path)

    return built_once(rootfs.CACHE / f"{name}-{version(name)}", install)


@pytest.fixture(scope="session")
def hub_client() -> Path:
    """huggingface_hub without hf_xet: the stand-in Hub (tests/doubles/hub.py) speaks LFS, which huggingface_hub uses
    when hf_xet is missing."""
    return client_for_the_host("huggingface_hub", leave_out="hf_xet*")


@pytest.fixture(scope="session")
def storage_client() -> Path:
    """google-cloud-storage, with which the host looks at a bucket (remote/folder_children.py)."""
    return client_for_the_host("google-cloud-storage")


@pytest.fixture
def workload_host(make_host):
    """One fresh host with the stand-in MaxText in its venv: a throwaway host, whose /dev/shm and
    processes are its own and go with it."""
    return prepare_workload(make_host(disk_mb=0))


@pytest.fixture
def make_workload_host(make_host):
    """Factory of workload hosts: a fresh host (make_host's arguments) given the stand-in MaxText."""
    return lambda **where: prepare_workload(make_host(disk_mb=0, **where))


@pytest.fixture
def namespaced_workload_host(make_host):
    """A workload host behind its own network namespace, whose link a test can cut and mend."""
    bridge = sshd.Bridge(("a",))
    try:
        bridge.up()
        yield (
            bridge,
            prepare_workload(make_host(disk_mb=0, address=bridge.address("a"), port=22, netns=bridge.netns("a"))),
        )
    finally:
        bridge.down()


# ---------------------------------------------------------------- a stack's VM (tests/doubles/pulumi_cli.py)


@pytest.fixture
def spot_project(stack_dir, stack_values) -> Path:
    """A spot stack (so the disk store) writing a checkpoint every 2 steps, keeping 2."""
    import yaml

    from tests.support import SPOT

    values = {key: value for key, value in {**stack_values, **SPOT}.items() if value is not None}
    values.update({"tpu-grpo:checkpointPeriod": "2", "tpu-grpo:checkpointsToKeep": "2"})
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    return stack_dir


def invoke_on_stack(host, cloud, project: Path, *args: str, **popen) -> subprocess.Popen:
    """A task on the stack's VM (no --host: its address comes from the stack's outputs, which `cloud`, the Pulumi
    CLI's double, answers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args, "--identity", str(host.key)],
        cwd=project,
        env=host.env(cloud.on_path()),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


@pytest.fixture
def bridge():
    made = sshd.Bridge(("a", "b", "c"))  # a VM, and the VMs brought back at new addresses
    try:
        yield made.up()
    finally:
        made.down()

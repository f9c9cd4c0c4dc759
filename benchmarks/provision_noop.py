"""A no-op `invoke provision` against ansible-core doing the same checks, on one throwaway host.

    uv run python -m benchmarks.provision_noop [--runs N] [--json] [--no-bytecode-cache] [--rtt-ms MS]   (as root)

In one run, against ONE throwaway host (tests/host/rootfs.py, as the tests' `make_host` makes it: a root
file system and namespaces of its own, its sshd on 127.0.0.1, a user with passwordless sudo, a loop
device as the data disk):

1. converge the host once with the real CLI, `invoke provision`, with the tests' variables;
2. install ansible-core into a throwaway venv in a temp folder (never the project's
   dependencies), generate from playbooks/host.yml a playbook with one `ansible.builtin.shell`
   task per step the engine would not skip, running exactly the engine's rendered check
   command line (`changed_when: false`), and check that it succeeds (rc 0, failed=0, changed=0);
3. make a second venv for tpu-grpo in the temp folder, on the same Python as ansible's (the
   project's locked dependencies, `uv sync --locked`), so that the two tools are compared on one
   interpreter: the Python version alone moves a run by about 10 %;
4. time N rounds; each round times, one after the other, a no-op re-provision with the real CLI
   (a subprocess; the whole process's wall time; it must report only ok/skipped), on ansible's
   Python and, when it differs, on this checkout's venv's, and ansible
   with its defaults (fact gathering on, OpenSSH with ControlMaster/ControlPersist, host keys
   checked against a known_hosts file). ansible's default ControlPersist keeps an SSH master
   alive for 60 s between runs, so it is timed twice a round: "cold" (a fresh master, like
   tpu-grpo's fresh connection; the ratio is reported on this one) and "warm" (the master of its
   previous run). Rounds, rather than all of one tool's runs and then the other's, keep a
   machine whose speed drifts (shared cores) from favouring either tool;
5. both tools' local Python runs with a bytecode cache (__pycache__ in each tool's venv), as on a user's
   machine; this machine's PYTHONDONTWRITEBYTECODE=1 would recompile fabric/ansible every run
   (`--no-bytecode-cache` keeps it);
6. print median seconds, the ratio to the median of tpu-grpo on ansible's Python (the baseline), and the SSH
   connections each tool opened per run (from the sshd log's "Accepted publickey for USER");
7. with --rtt-ms, both tools reach the sshd through a relay that delays each direction by half that
   round-trip time (benchmarks/latency.py), as from a laptop to a VM;
8. remove everything it made, even on failure: the host (its processes and mounts go with it),
   the loop device, the relay, the temp folder (with the venvs and ansible's SSH masters).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks.latency import DelayedRelay

ROOT = Path(__file__).resolve().parent.parent
MADE_UP_TOKEN = "hf_" + "BenchMadeUpToken" + "q8Wd3Kx1Nv"  # never a real token
_RECAP = re.compile(r"^\S+\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def say(message: str) -> None:
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


def sh(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


class BenchError(Exception):
    """A benchmark that cannot be measured fairly: a run failed or did not report a no-op."""


# ---------------------------------------------------------------- the test host (as in tests/host/conftest.py)


@dataclass
class Host:
    vm: object
    disk: object
    key: Path
    state: Path
    folder: Path
    port: int  # where the tools connect: the sshd's, or the delaying relay's in front of it (--rtt-ms)
    bytecode_cache: bool = True  # see python_env

    @property
    def user(self):
        return self.vm.user

    @property
    def spec(self) -> str:
        return f"{self.user.name}@{self.vm.address}:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        return self.vm.known_hosts_line_at(self.port)

    @property
    def vars(self) -> list[str]:
        """The tests' variables: what this machine allows."""
        from tests.host.rootfs import TEST_VARS

        return [*TEST_VARS, f"data_device={self.disk.device}"]


def _guarded(what: str, action, *args) -> None:
    """A cleanup action that reports its failure instead of stopping the cleanups after it."""
    try:
        action(*args)
    except Exception as error:  # noqa: BLE001 - keep cleaning up
        say(f"cleanup: {what} failed: {error}")


def make_host(stack: contextlib.ExitStack, rtt_ms: float) -> Host:
    """A throwaway host (tests/host/rootfs.py: a root file system and namespaces of its own, its sshd on
    127.0.0.1, behind a relay adding `rtt_ms` if any) with a loop-device data disk; every undo
    registered on `stack`."""
    from tests.host import rootfs

    rootfs.python312_bin()  # fails early, with its message, on a machine without Python 3.12
    folder = Path(tempfile.mkdtemp(prefix="tpu-grpo-bench-"))
    stack.callback(_guarded, f"remove {folder}", shutil.rmtree, folder)

    keys = folder / "client"
    keys.mkdir(mode=0o700)
    key = keys / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench@tpu-grpo", "-f", str(key))

    disk = rootfs.DataDisk.attach(folder / "data.img", 64)
    stack.callback(_guarded, "detach the data disk", disk.detach)
    vm = rootfs.ThrowawayHost(
        rootfs.host_folder(), Path(f"{key}.pub").read_text(), disk_device=disk.device, login_shell="/bin/bash"
    )  # bash as on a VM, not the tests' recording shell
    stack.callback(_guarded, "remove the throwaway host", vm.remove)  # runs before the detach
    vm.start()
    say(f"throwaway host with its sshd on 127.0.0.1:{vm.port} (log {vm.log}), data disk {disk.device}")

    port = vm.port
    if rtt_ms:
        relay = DelayedRelay((vm.address, vm.port), rtt_ms / 1000).start()
        stack.callback(_guarded, "stop the delaying relay", relay.stop)
        port = relay.port
        say(f"relay on 127.0.0.1:{port} adding {rtt_ms:g} ms to every round trip to the sshd")
    state = folder / "state"
    state.mkdir()
    host = Host(vm, disk, key, state, folder, port)
    (state / "known_hosts").write_text(host.known_hosts_line)
    return host


def python_env(env: dict, bytecode_cache: bool) -> dict:
    """The environment for a tool's local Python process: with a bytecode cache (__pycache__ next to
    the sources, in each tool's own venv), as on a user's machine. This machine sets
    PYTHONDONTWRITEBYTECODE=1 and uv installs without .pyc, so otherwise every run compiles fabric,
    paramiko, invoke and rich (or ansible) from source again."""
    if not bytecode_cache:
        return env
    return {name: value for name, value in env.items() if name != "PYTHONDONTWRITEBYTECODE"}


def run_once(label: str, action, host: Host, problem) -> tuple[subprocess.CompletedProcess, float, int]:
    """One run of a tool: (result, wall seconds, SSH connections it opened); `problem(result)` says
    what is wrong with a run (None: nothing), and a wrong run stops the benchmark."""
    before = host.vm.accepted(host.user.name)
    started = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - started
    why = problem(result)
    if why is not None:
        raise BenchError(f"{label}: {why}")
    return result, seconds, host.vm.accepted(host.user.name) - before


# ---------------------------------------------------------------- tpu-grpo


def invoke_provision(host: Host, timeout: int, python: str = sys.executable) -> subprocess.CompletedProcess:
    """The real CLI, as a user runs it (and as TestHost.invoke does), on `python` (a venv's)."""
    argv = [
        str(python),
        "-m",
        "invoke",
        "-r",
        str(ROOT),
        "provision",
        "--host",
        host.spec,
        "--identity",
        str(host.key),
        "--json",
    ]
    for item in host.vars:
        argv += ["--var", item]
    env = python_env(
        {**os.environ, "TPU_GRPO_STATE": str(host.state), "HF_TOKEN": MADE_UP_TOKEN, "COLUMNS": "200"},
        host.bytecode_cache,
    )
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def statuses(result: subprocess.CompletedProcess) -> dict[str, str]:
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {}
    return {step["step"]: step["status"] for step in report["hosts"][0]["steps"]}


def converge_problem(result: subprocess.CompletedProcess) -> str | None:
    if result.returncode == 0:
        return None
    return (
        f"`invoke provision` exited {result.returncode}: {statuses(result) or 'no JSON report'}\n"
        f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )


def noop_problem(result: subprocess.CompletedProcess) -> str | None:
    found = statuses(result)
    if result.returncode == 0 and found and set(found.values()) <= {"ok", "skipped"}:
        return None
    changed = {step: status for step, status in found.items() if status not in {"ok", "skipped"}}
    return (
        f"not a no-op (exit {result.returncode}): {changed or 'no JSON report'}\n"
        f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )


@dataclass
class Timing:
    tool: str
    seconds: list[float] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def add(self, seconds: float, connections: int) -> None:
        self.seconds.append(seconds)
        self.connections.append(connections)


# ---------------------------------------------------------------- ansible-core


class _Unsafe(str):
    """Emitted as `!unsafe`: ansible must not template the check scripts (they are already rendered)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value), style="|"))


def engine_checks(host: Host) -> list[tuple[str, str]]:
    """(step name, the exact check command line) for each step the engine would not skip.

    `Planned` is the engine's per-step plan; it is the only place that renders the check command
    line (prelude, `cd`, sudo for `become`, the secret's hash comparison)."""
    from tpu_grpo.provision import engine, playbook

    book = playbook.load(ROOT / playbook.PLAYBOOK)
    values = playbook.resolve(book, host.vars)
    os.environ["HF_TOKEN"] = MADE_UP_TOKEN
    planned = engine.plan(book, values)
    return [(item.step.name, item.check) for item in planned if not item.skip]


def write_ansible_project(host: Host, folder: Path, checks: list[tuple[str, str]]) -> tuple[Path, Path]:
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(host.known_hosts_line)
    ssh_args = (
        f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
        "-o IdentitiesOnly=yes"
    )  # only --identity, as tpu-grpo (look_for_keys=False, no agent)
    inventory = folder / "inventory.yml"
    bench = {
        "ansible_host": host.vm.address,
        "ansible_port": host.port,
        "ansible_user": host.user.name,
        "ansible_ssh_private_key_file": str(host.key),
        "ansible_ssh_common_args": ssh_args,
    }
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"bench": bench}}}, sort_keys=False, width=1000))
    tasks = [
        {
            "name": name,
            # the non-secret checks are `bash -c ...`/`sudo -n bash -c ...` command lines, as the
            # engine runs them after a change; its one round trip runs the same scripts in subshells
            "ansible.builtin.shell": {"cmd": _Unsafe(command), "executable": "/bin/bash"},
            "changed_when": False,
        }
        for name, command in checks
    ]
    playbook = folder / "host-checks.yml"
    playbook.write_text(
        "# generated by benchmarks/provision_noop.py from playbooks/host.yml: checks only\n"
        + yaml.dump(
            [{"name": "tpu-grpo host.yml checks", "hosts": "bench", "tasks": tasks}],
            Dumper=_Dumper,
            sort_keys=False,
            width=1000,
        )
    )
    return inventory, playbook


def ansible_python() -> Path:
    """The Python both tools are timed on: this machine's 3.12 (recent ansible-core needs >= 3.12)."""
    from tests.host.rootfs import python312_bin

    return Path(python312_bin()) / "python3.12"


def python_version(python: str | Path) -> str:
    return sh(str(python), "-c", "import platform; print(platform.python_version())").stdout.strip()


def tpu_grpo_venv(folder: Path, python: Path) -> Path:
    """A venv for tpu-grpo on `python`, with exactly the project's locked dependencies (and the
    project itself, editable, as in .venv); returns its interpreter."""
    venv = folder / "tpu-grpo-venv"
    sh(
        "uv",
        "sync",
        "-q",
        "--locked",
        "--no-dev",
        "--python",
        str(python),
        cwd=ROOT,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)},
    )
    return venv / "bin" / "python"


def install_ansible(folder: Path, spec: str) -> tuple[Path, str]:
    """ansible-core in a throwaway venv under `folder`, on ansible_python()."""
    venv = folder / "venv"
    sh("uv", "venv", "-q", "--python", str(ansible_python()), str(venv))
    sh("uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"), spec)
    version = sh(
        str(venv / "bin" / "python"), "-c", "import ansible.release; print(ansible.release.__version__)"
    ).stdout.strip()
    return venv, version


@dataclass
class Ansible:
    venv: Path
    folder: Path
    inventory: Path
    playbook: Path
    tasks: int
    bytecode_cache: bool = True
    masters: list[Path] = field(default_factory=list)

    def env(self, control_dir: Path) -> dict:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("ANSIBLE_") and name not in {"VIRTUAL_ENV", "PYTHONPATH"}
        }
        return python_env(
            {
                **env,
                "LC_ALL": "C.UTF-8",
                "ANSIBLE_HOME": str(self.folder / "ansible-home"),
                "ANSIBLE_HOST_KEY_CHECKING": "True",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
            },
            self.bytecode_cache,
        )

    def run(self, control_dir: Path) -> subprocess.CompletedProcess:
        self.masters.append(control_dir)
        return subprocess.run(
            [str(self.venv / "bin" / "ansible-playbook"), "-i", str(self.inventory), str(self.playbook)],
            capture_output=True,
            text=True,
            env=self.env(control_dir),
            cwd=self.folder,
            timeout=600,
        )

    def problem(self, result: subprocess.CompletedProcess) -> str | None:
        """None when ansible-playbook passed every check: exit 0 and ok=tasks+1 changed=0 unreachable=0 failed=0."""
        recap = _RECAP.findall(result.stdout)
        wanted = (str(self.tasks + 1), "0", "0", "0")  # + "Gathering Facts"
        if result.returncode == 0 and recap == [wanted]:
            return None
        failed, task = [], None
        for line in result.stdout.splitlines():
            task = line[6 : line.rindex("]")] if line.startswith("TASK [") and "]" in line else task
            failed += [task] if line.startswith("fatal: ") else []
        return (
            f"ansible-playbook exit {result.returncode}, recap ok/changed/unreachable/failed {recap}, "
            f"wanted {list(wanted)}{', failed task ' + repr(failed[-1]) if failed else ''}\n"
            f"{result.stdout[-3000:]}{result.stderr[-2000:]}"
        )

    def close_masters(self, control_dir: Path) -> None:
        """End the ControlPersist SSH masters ansible left in `control_dir`."""
        if not control_dir.is_dir():
            return
        for socket_path in control_dir.iterdir():
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "bench"], capture_output=True, timeout=10
            )

    def close_all(self) -> None:
        for control_dir in dict.fromkeys(self.masters):
            self.close_masters(control_dir)


def time_rounds(
    host: Host, ansible: Ansible, version: str, runs: int, tpu_grpo_pythons: dict[str, Path]
) -> list[Timing]:
    """N rounds, each timing one run of every tool in turn, so that a machine that speeds up or slows
    down during the benchmark (shared cores) moves every tool's times alike, not only one tool's.
    `tpu_grpo_pythons`: the venvs' interpreters to time tpu-grpo on, by label (the first: the baseline)."""
    tpu_grpo = {label: Timing(f"tpu-grpo (invoke provision, {label})") for label in tpu_grpo_pythons}
    cold = Timing(f"ansible-core {version} (defaults, new SSH master each run)")
    warm = Timing(f"ansible-core {version} (defaults, master kept by ControlPersist)")
    kept = ansible.folder / "cp-warm"
    run_once("ansible warm-up", lambda: ansible.run(kept), host, ansible.problem)  # leaves the master `warm` reuses
    for label, python in tpu_grpo_pythons.items():  # writes the new venv's bytecode cache, as ansible's warm-up does
        run_once(
            f"tpu-grpo warm-up ({label})",
            lambda: invoke_provision(host, timeout=300, python=python),
            host,
            noop_problem,
        )
    for number in range(1, runs + 1):
        for label, python in tpu_grpo_pythons.items():
            result, seconds, connections = run_once(
                f"tpu-grpo run {number} ({label})",
                lambda: invoke_provision(host, timeout=300, python=python),
                host,
                noop_problem,
            )
            tpu_grpo[label].add(seconds, connections)
        found = statuses(result)

        fresh = ansible.folder / f"cp-cold-{number}"
        _, seconds, connections = run_once(
            f"{cold.tool} run {number}", lambda: ansible.run(fresh), host, ansible.problem
        )
        cold.add(seconds, connections)
        ansible.close_masters(fresh)

        _, seconds, connections = run_once(
            f"{warm.tool} run {number}", lambda: ansible.run(kept), host, ansible.problem
        )
        warm.add(seconds, connections)
        times = ", ".join(f"{timing.seconds[-1]:.2f} s ({label})" for label, timing in tpu_grpo.items())
        say(
            f"round {number}/{runs}: tpu-grpo {times} ({sum(s == 'ok' for s in found.values())} ok, "
            f"{sum(s == 'skipped' for s in found.values())} skipped), ansible new master {cold.seconds[-1]:.2f} s, "
            f"kept master {warm.seconds[-1]:.2f} s"
        )
    ansible.close_masters(kept)
    return [*tpu_grpo.values(), cold, warm]


# ---------------------------------------------------------------- the run


def _on_signal(number, _frame):
    raise SystemExit(128 + number)  # unwinds through the cleanups


def measure(runs: int, ansible_spec: str, bytecode_cache: bool, rtt_ms: float = 0) -> dict:
    with contextlib.ExitStack() as stack:
        host = make_host(stack, rtt_ms)
        host.bytecode_cache = bytecode_cache
        say("converging the host once with `invoke provision` (installs uv, a venv, six)")
        started = time.perf_counter()
        first = run_once("converging run", lambda: invoke_provision(host, timeout=1800), host, converge_problem)[0]
        say(f"converged in {time.perf_counter() - started:.1f} s: {statuses(first)}")

        checks = engine_checks(host)
        ansible_folder = host.folder / "ansible"
        ansible_folder.mkdir()
        say(f"installing {ansible_spec} into a throwaway venv in {ansible_folder}")
        venv, version = install_ansible(ansible_folder, ansible_spec)
        shared_python = python_version(ansible_python())
        say(f"installing tpu-grpo's locked dependencies into a throwaway venv on Python {shared_python}")
        pythons = {f"Python {shared_python}, as ansible-core": tpu_grpo_venv(host.folder, ansible_python())}
        if (own_python := platform.python_version()) != shared_python:
            pythons[f"this checkout's venv, Python {own_python}"] = Path(sys.executable)
        inventory, playbook = write_ansible_project(host, ansible_folder, checks)
        ansible = Ansible(venv, ansible_folder, inventory, playbook, len(checks), host.bytecode_cache)
        stack.callback(_guarded, "close ansible's SSH masters", ansible.close_all)
        say(
            f"ansible-core {version}: {len(checks)} check tasks ({', '.join(name for name, _ in checks)}); "
            "verifying one run"
        )
        run_once("ansible check run", lambda: ansible.run(ansible_folder / "cp-verify"), host, ansible.problem)
        ansible.close_masters(ansible_folder / "cp-verify")

        *timings, cold, warm = time_rounds(host, ansible, version, runs, pythons)
        tpu_grpo = timings[0]  # on ansible's Python: the baseline
        rows = []
        for timing in (*timings, cold, warm):
            rows.append(
                {
                    "tool": timing.tool,
                    "median_s": round(timing.median, 3),
                    "runs_s": [round(seconds, 3) for seconds in timing.seconds],
                    "ratio": round(timing.median / tpu_grpo.median, 2),
                    "ssh_connections_per_run": timing.connections,
                }
            )
        ratio = cold.median / tpu_grpo.median
        return {
            "runs": runs,
            "rtt_ms": rtt_ms,
            "ansible_core": version,
            "check_tasks": [name for name, _ in checks],
            "python": shared_python,
            "python_bytecode_cache": bytecode_cache,
            "tools": rows,
            "baseline": tpu_grpo.tool,
            "compared": cold.tool,
            "ratio": round(ratio, 2),
        }


def print_table(result: dict) -> None:
    rows = result["tools"]
    width = max(len(row["tool"]) for row in rows)
    link = f" behind a relay adding {result['rtt_ms']:g} ms per round trip" if result["rtt_ms"] else ""
    print(
        f"no-op provisioning, {result['runs']} runs each, one throwaway host on 127.0.0.1{link}, "
        f"{len(result['check_tasks'])} checked steps, local Python bytecode cache "
        f"{'on' if result['python_bytecode_cache'] else 'off (as this environment has it)'}"
    )
    print(f"{'tool':<{width}}  {'median s':>8}  {'ratio':>6}  ssh connections/run")
    for row in rows:
        connections = sorted(set(row["ssh_connections_per_run"]))
        shown = str(connections[0]) if len(connections) == 1 else "/".join(map(str, row["ssh_connections_per_run"]))
        print(f"{row['tool']:<{width}}  {row['median_s']:>8.2f}  {row['ratio']:>5.1f}x  {shown}")
    print(
        f"{result['compared']} takes {result['ratio']:.1f}x as long as {result['baseline']} "
        f"(both on Python {result['python']}, a new SSH master each run)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.provision_noop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds, each timing every tool once (default 5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="keep the environment's PYTHONDONTWRITEBYTECODE: both tools recompile their "
        "Python each run (default: a bytecode cache, as on a user's machine)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0,
        help="add this round-trip time between the tools and the sshd, as over a real network "
        "(a relaying proxy; default 0: loopback)",
    )
    parser.add_argument("--ansible-spec", default="ansible-core", help="what to install (default: ansible-core)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 0 <= args.rtt_ms <= 1000:
        parser.error(f"--rtt-ms {args.rtt_ms:g} is out of range; fix: 0 (loopback) to 1000")
    if os.geteuid() != 0:
        print(
            "error: needs root (it adds a user, sudo rights, a loop device and a mount); fix: run it as root",
            file=sys.stderr,
        )
        return 2
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _on_signal)
    try:
        result = measure(args.runs, args.ansible_spec, not args.no_bytecode_cache, args.rtt_ms)
    except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        detail = getattr(error, "stderr", None)
        print(f"error: {error}" + (f"\n{detail}" if isinstance(detail, str) and detail else ""), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

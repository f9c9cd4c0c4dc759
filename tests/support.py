"""What the tests share that is no fixture: the repository's paths, the made-up token, and running a task
(in this process, or as its own process where the process itself is what a test checks)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"  # what the tests read: see its README
TUTORIAL = DATA / "tutorial.md"
FIXTURES = DATA / "maxtext-0.2.3"
MODELS_KNOWN = DATA / "maxtext-0.2.3-models.json"  # what MaxText 0.2.3 knows of models, read from its wheel
DOUBLES = ROOT / "tests" / "doubles"
BIN = Path(sys.executable).parent  # this venv's commands (invoke, uv's python)
#: The MaxText tier's venv (tests/maxtext/install makes it).
MAXTEXT_VENV = Path(os.environ.get("TPU_GRPO_MAXTEXT_VENV") or Path.home() / ".cache/tpu-grpo/maxtext-0.2.3")

TEST_TOKEN = "hf_" + "T0kenNeverShown" + "x7Qp2Lm9ZrAbCdEfGhI"  # made up, of a token's form; no output may say it

#: A stack's changes from the committed example (a reservation) to each other capacity.
SPOT = {"tpu-grpo:capacity": "spot", "tpu-grpo:reservation": None}
FLEX = {"tpu-grpo:capacity": "flex-start", "tpu-grpo:reservation": None, "tpu-grpo:maxRunHours": "24"}
ON_DEMAND = {"tpu-grpo:capacity": "on-demand", "tpu-grpo:reservation": None}
FAST = ("--need-gb", "0.001,0.001")  # the test host's disks are small; the preflight is tested on its own


@contextmanager
def file_lock(path: Path):
    """Held by one test process at a time (pytest-xdist's workers, two sessions): an exclusive flock on `path`."""
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def built_once(folder: Path, build) -> Path:
    """`folder` (in a cache), made by `build(folder)` on first use and reused: a lock beside it keeps test processes
    (pytest-xdist's workers, two sessions) from building it at once, and its `.complete` mark, written last, keeps a
    build cut short from being used. Built in place: a venv's scripts name their folder."""
    if (folder / ".complete").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(folder.parent / ".lock"):
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            (folder / ".complete").touch()
    return folder


def task_environment(env: dict | None) -> dict:
    """A task's environment: this one without the developer's cloud settings, this venv first on PATH."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "GOOGLE_", "CLOUDSDK_"))}
    return {**base, "PATH": f"{BIN}:/usr/bin:/bin", "COLUMNS": "200", **(env or {})}


def invoke(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`invoke ARGS` run by Invoke's own Program in this process, in `cwd` with `env` as its whole environment;
    its output and exit code as a process's would be (a traceback included). Saves starting Python, Invoke,
    Pulumi and rich for each call; what only a process shows (imports, signals, pipes) uses invoke_process."""
    from invoke import Program, __version__

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)  # what a task's own subprocesses print, as well as Python's
        os.dup2(err.fileno(), 2)
        stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8", write_through=True)
        stderr = io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), encoding="utf-8", write_through=True)
        code = 0
        try:
            os.environ.clear()
            os.environ.update(task_environment(env))
            os.chdir(cwd)
            with redirect_stdout(stdout), redirect_stderr(stderr):
                try:
                    Program(name="Invoke", binary="inv[oke]", binary_names=["invoke", "inv"], version=__version__).run(
                        ["invoke", "-r", str(ROOT), *args]
                    )
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
                    if isinstance(exit_.code, str):
                        print(exit_.code, file=sys.stderr)
                except Exception:  # noqa: BLE001 - as Python would: the traceback on stderr, exit code 1
                    traceback.print_exc()
                    code = 1
        finally:
            stdout.close()
            stderr.close()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            ["invoke", *args], code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )


def invoke_process(
    *args: str, cwd: Path, env: dict | None = None, python_flags: tuple[str, ...] = (), timeout: int = 120
) -> subprocess.CompletedProcess:
    """`python -m invoke ARGS` as its own process, as a user's shell runs it."""
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "invoke", "-r", str(ROOT), *args],
        cwd=cwd,
        env=task_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ctrl_c_as_in_a_terminal() -> None:
    """A task's process's `preexec_fn`: SIGINT as a terminal's foreground command has it (SIG_DFL), whatever the test
    runner inherited. A runner started in the background of a non-interactive shell (`nohup tests/run &`) ignores
    SIGINT, its children too, and Python then never raises KeyboardInterrupt: a Ctrl-C test would wait forever."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def statuses(result) -> dict[str, str]:
    """step -> ok / changed / failed / skipped, from a one-host `invoke provision --json`."""
    report = json.loads(result.stdout)
    return {step["step"]: step["status"] for step in report["hosts"][0]["steps"]}


def wait_for(condition, timeout_s: float = 60, what: str = "the condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def scan_for_token(*texts: str, folders: tuple[Path, ...] = ()) -> None:
    """The made-up token is in none of these outputs, nor in any file under these folders."""
    for text in texts:
        assert TEST_TOKEN not in text
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                assert TEST_TOKEN.encode() not in path.read_bytes(), path


def job_dirs(host) -> list[Path]:
    root = host.host.user.home / "tpu-grpo/jobs"
    return sorted(root.iterdir()) if root.exists() else []


def run_entry_point(values: dict, mocks) -> dict:
    """Run `infra/__main__.py` itself, as `pulumi up` does, and collect the stack's exports."""
    import runpy

    import pulumi

    from infra import offline

    pulumi.runtime.set_mocks(mocks, project="tpu-grpo", stack="dev", preview=False)
    pulumi.runtime.set_all_config(offline.config_for_pulumi(values))
    exported: dict = {}

    @pulumi.runtime.test
    def program():
        runpy.run_path(str(ROOT / "infra" / "__main__.py"), run_name="__main__")
        return pulumi.Output.all(**pulumi.runtime.get_root_resource().outputs).apply(exported.update)

    program()
    return exported


def this_python(folder: Path) -> Path:
    """A folder whose `python3` is this test's (its venv has google-cloud-storage, as the host's has), for PATH."""
    tools = folder / "bin"
    tools.mkdir()
    (tools / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (tools / "python3").chmod(0o755)
    return tools


def write_book(tmp_path: Path, text: str, dedent: bool = True) -> Path:
    """A playbook of this text in the test's folder."""
    path = tmp_path / "book.yml"
    path.write_text(textwrap.dedent(text) if dedent else text)
    return path


def is_report(record: dict) -> bool:
    """The stand-in's record of an export's report evaluation: train_rl of no batches (tpu_grpo/jobs/maxtext.py)."""
    return record["module"].endswith(".train_rl") and "num_batches=0" in record["argv"]


def modules(records: list[dict]) -> list[str]:
    """Each MaxText run the stand-in recorded, by its module's last name; an export's report evaluation `report`."""
    return ["report" if is_report(record) else record["module"].rsplit(".", 1)[-1] for record in records]


#: The words that begin a command in a fix, and what ends one: a backtick, or the prose between alternatives.
COMMAND_WORDS = r"(?:[A-Z_]+=\S+ )*(?:pulumi|uv run|ssh-keygen|mkdir|export) "
FIX_COMMAND = re.compile(rf"`({COMMAND_WORDS}[^`]*)`|(?:^|(?<=[\s(]))({COMMAND_WORDS}.*?)(?=\)| \(|, or |, then |; |$)")
#: Each placeholder a fix may hold, as a user fills it in.
FILLED = {
    "YOUR_PROJECT_ID": "grpo-lab-123",
    "YOUR_RESERVATION_NAME": "v6e-8-calendar",
    "YOUR_PUBLIC_IP": "203.0.113.7",
    "YOUR_BUCKET": "grpo-runs",
    "hf_...": "hf_madeUpTokenForTestsAbCdEfGhIjKlMn",
}


def fix_commands(fix: str) -> list[str]:
    """The commands a `fix:` gives, each with its placeholders filled, in the order given (alternatives included)."""
    found = [(quoted or bare).strip() for quoted, bare in FIX_COMMAND.findall(fix)]
    for placeholder, value in FILLED.items():
        found = [command.replace(placeholder, value) for command in found]
    return found


def unpasteable(command: str, cwd: Path) -> str | None:
    """Why a command a fix prints would not run as pasted, or None: bash must read it, and a task's command line
    Invoke must parse (with --help, which runs nothing)."""
    import shlex

    read = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    if read.returncode:
        return f"bash: {read.stderr.strip()}"
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        words.pop(0)
    if words[:3] != ["uv", "run", "invoke"]:
        return None
    parsed = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *words[3:], "--help"], cwd=cwd, capture_output=True, text=True
    )
    return f"invoke: {parsed.stderr.strip()}" if parsed.returncode else None

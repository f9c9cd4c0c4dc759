"""Detached jobs on the host: MaxText steps that outlive the SSH connection and the laptop.

Each job runs under `setsid` in its own folder `~/tpu-grpo/jobs/ID/` (command.sh: the
script that ran, log, pid, exit_code, job.json). A `flock` on `~/tpu-grpo/tpu.lock`, held by
the job's processes, keeps a second TPU job from starting. A follow streams the log by
byte offset, so after a dropped link it resumes exactly where it stopped.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tpu_grpo.config import settings
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.host_paths import ROOT, TPU_LOCK
from tpu_grpo.host import facts, hosts, remote
from tpu_grpo.jobs.job_records import JobRecord, utc

JOBS = f"{ROOT}/jobs"
DONE = f"{ROOT}/done"
BUSY_EXIT = 75
CLAIMED_EXIT = 76
CANCEL_GRACE_S = 10
RECONNECT_S = 120
LOST = -1  # the job's exit code when it vanished without one (the VM restarted)


class JobError(UserError):
    """A job that cannot start, be found or be followed; one line with the fix."""


class VmGone(hosts.ConnectError):
    """The link dropped and the cloud says the VM is stopped or gone (its state kept for the caller)."""

    def __init__(self, message: str, state: str):
        super().__init__(message)
        self.state = state


class JobBusy(JobError):
    """The TPU already runs a job; the message names it."""

    exit_code = 1


class ClaimTaken(JobError):
    """The job's claim file already holds other content: what it holds is `.found`."""

    def __init__(self, path: str, found: str):
        super().__init__(f"{path} holds other inputs: {found}")
        self.path, self.found = path, found


@dataclass
class Job:
    id: str
    step: str
    run: str
    state: str  # running | finished | cancelled | lost
    exit_code: int | None
    started: float
    finished: float | None
    log_bytes: int
    meta: dict = field(default_factory=dict)

    def record(self) -> JobRecord:
        failed = self.state == "finished" and self.exit_code != 0
        return JobRecord(
            self.id,
            self.step,
            self.run,
            "failed" if failed else self.state,
            self.exit_code,
            utc(self.started),
            utc(self.finished) if self.finished else None,
            self.meta.get("total_steps"),
            None,
        )

    def to_json(self) -> dict:
        return asdict(self)


def new_id(step: str, now: float | None = None) -> str:
    """UTC start time to the millisecond, then the step: the ids sort by start time (the job
    list's order, whose last is "the newest") even for jobs started within one second, and, as
    one TPU job starts at a time and each start is a round trip, no two jobs of a host share an id."""
    now = time.time() if now is None else now
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}-{step}"


def start(
    connection, job_id: str, command: str, meta: dict, record: str = "", claim: tuple[str, str] | None = None
) -> int:
    """Start `command` detached as job `job_id` (remote/start_job.sh); returns its process group. Refuses when a
    job runs, and when `claim` = (path, text) names a file that holds other text (written if it is missing),
    both under the TPU's lock."""
    claim_path, claim_text = claim or ("", "")
    script = remote.shell(
        "start_job",
        JOBS=JOBS,
        ROOT=ROOT,
        TPU_LOCK=TPU_LOCK,
        DONE=DONE,
        JOB_ID=job_id,
        COMMAND=command,
        META=json.dumps(meta, indent=1),
        WRAPPER=remote.text("job_wrapper", ".sh"),
        RECORD=record,
        CLAIM_PATH=claim_path,
        CLAIM=base64.b64encode(claim_text.encode()).decode(),
        BUSY_EXIT=BUSY_EXIT,
        CLAIMED_EXIT=CLAIMED_EXIT,
    )
    result = hosts.run_script(connection, script)
    if result.exited == BUSY_EXIT:
        running = result.stdout.split()[1] if len(result.stdout.split()) > 1 else "another job"
        raise JobBusy(
            f"the TPU is busy with job {running}; fix: wait for it (uv run invoke logs --follow) "
            "or stop it (uv run invoke cancel)"
        )
    if result.exited == CLAIMED_EXIT and claim:
        raise ClaimTaken(claim[0], base64.b64decode(result.stdout.split()[-1]).decode())
    if result.exited != 0:
        raise JobError(f"job {job_id} did not start (exit {result.exited}): {(result.stderr or result.stdout).strip()}")
    return int(result.stdout.split()[-1])


def parse_jobs(answer: facts.Answer) -> list[Job]:
    if answer.exited != 0:
        raise JobError(f"cannot list the jobs on the host: {answer.stderr.strip()}")
    jobs = []
    for line in answer.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 7:
            continue
        job_id, state, code, started, finished, size, meta = parts
        info = json.loads(base64.b64decode(meta))
        jobs.append(
            Job(
                job_id,
                info.get("step", "?"),
                info.get("run", ""),
                state,
                int(code) if code else (LOST if state == "lost" else None),
                float(started),
                float(finished) if finished else None,
                int(size),
                info,
            )
        )
    return jobs


class Jobs(facts.Fact):
    """Every job on the host (its folder below JOBS), oldest first, its state from the TPU lock."""

    script = staticmethod(lambda: remote.shell("jobs", JOBS=JOBS, TPU_LOCK=TPU_LOCK))
    parse = staticmethod(parse_jobs)


def list_jobs(connection) -> list[Job]:
    """Every job on the host, oldest first."""
    return Jobs.read(connection)


def find(jobs: list[Job], job_id: str | None) -> Job:
    """The named job, or the running one, or the newest."""
    if not jobs:
        raise JobError("no jobs on this host yet; fix: start one, e.g. uv run invoke pipeline --batches 50")
    if job_id:
        for job in jobs:
            if job.id == job_id:
                return job
        raise JobError(
            f"no job {job_id!r} on this host; fix: pick one of {', '.join(j.id for j in jobs[-5:])} "
            "(uv run invoke status)"
        )
    running = [job for job in jobs if job.state == "running"]
    return running[-1] if running else jobs[-1]


def read_log(connection, job_id: str, offset: int = 0) -> bytes:
    """The job's log from byte `offset` on."""
    result = hosts.run(
        connection,
        f"tail -c +{offset + 1} {JOBS}/{job_id}/log",
        hide=True,
        warn=True,
        in_stream=False,
        encoding="latin-1",
    )
    return result.stdout.encode("latin-1")


def cancel(connection, job: Job) -> None:
    """End the job's whole process group, then free the TPU as MaxText's own launcher does."""
    script = f"""dir={JOBS}/{job.id}; pgid=$(cat "$dir/pid")
if [ ! -f "$dir/exit_code" ]; then
  touch "$dir/cancelled"
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for _ in $(seq {CANCEL_GRACE_S * 10}); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pgid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 0.1; done
  [ -f "$dir/exit_code" ] || echo 143 > "$dir/exit_code"
fi
if ls /dev/vfio/* > /dev/null 2>&1; then
  pids=$(sudo lsof -t /dev/vfio/* 2>/dev/null || true)
  [ -z "$pids" ] || sudo kill -9 $pids
fi
sudo rm -f /tmp/libtpu_lockfile
"""
    result = hosts.run_script(connection, script)
    if result.exited != 0:
        raise JobError(f"cancel of job {job.id} failed (exit {result.exited}): {result.stderr.strip()}")


@dataclass
class Follow:
    """Where a follow stands: bytes received so far (its resume point) and reconnections made."""

    offset: int = 0
    reconnects: int = 0


def session(flags: hosts.HostFlags, chosen: settings.Settings | None = None) -> Session:
    """The one host MaxText jobs run on: a v6e-8 is one VM, and a multi-host slice's jobs would need
    all its workers at once, so several hosts are refused. `chosen`: the stack's settings, when already read."""
    [target] = hosts.only(flags.hosts(chosen))
    return Session(target, flags.wait_s)


class Session:
    """One host's connection, reopened on use after the link died (a flaky network, a VM back up)."""

    def __init__(self, host: hosts.Host, wait_s: float = 0):
        self.host, self.wait_s, self._connection = host, wait_s, None
        self.notices: list[str] = []
        #: Asked when the link drops: what the cloud says of a VM that is gone (None: it runs), so
        #: that a lost VM ends the follow at once instead of after RECONNECT_S of retries.
        self.vm_gone: Callable[[], str | None] | None = None

    @property
    def connection(self):
        if self._connection is not None and not self._connection.is_connected:
            self.close()
        if self._connection is None:
            self._connection = hosts.connect(self.host, self.notices, self.wait_s)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def follow(
    session: Session,
    job_id: str,
    on_bytes: Callable[[bytes], None],
    position: Follow | None = None,
    on_reconnect: Callable[[str], None] | None = None,
    reconnect_s: float = RECONNECT_S,
) -> int:
    """Stream the job's log until it ends and return its exit code; a lost link is reopened and
    the stream resumes at the byte it had, so no line is missed or repeated."""
    import paramiko

    position = position or Follow()
    while True:
        try:
            connection = session.connection
        except hosts.HostError as error:
            raise hosts.ConnectError(
                f"lost the host while following job {job_id} ({error}); the job goes on on the "
                f"host: uv run invoke logs --job {job_id} --follow"
            ) from None
        try:
            if _stream(connection, job_id, position, on_bytes):
                on_bytes(_rest(connection, job_id, position))
                return _exit_code(connection, job_id)
        except (OSError, EOFError, paramiko.SSHException, hosts.ConnectionLost):
            pass
        gone = session.vm_gone() if session.vm_gone else None
        if gone:
            raise VmGone(f"lost the VM while following job {job_id}: it is {gone}", gone)
        position.reconnects += 1
        if on_reconnect:
            on_reconnect(f"connection lost; reconnecting to resume at byte {position.offset}")
        session.close()
        session.wait_s = max(session.wait_s, reconnect_s)


def _stream(connection, job_id: str, position: Follow, on_bytes) -> bool:
    """Tail the log from the offset while the job lives; True when it ended, False when the link died."""
    directory = f"{JOBS}/{job_id}"
    command = f'cd {directory} && exec tail -c +{position.offset + 1} --pid="$(cat pid)" -f log'
    channel = connection.transport.open_session()
    channel.settimeout(1.0)
    channel.exec_command(command)
    while True:
        try:
            data = channel.recv(65536)
        except TimeoutError:
            if not connection.transport.is_active():
                return False
            continue
        if data:
            position.offset += len(data)
            on_bytes(data)
            continue
        deadline = time.monotonic() + 5
        while not channel.exit_status_ready() and connection.transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        return channel.exit_status_ready() and connection.transport.is_active()


def _rest(connection, job_id: str, position: Follow) -> bytes:
    data = read_log(connection, job_id, position.offset)
    position.offset += len(data)
    return data


def _exit_code(connection, job_id: str) -> int:
    for _ in range(100):  # the wrapper writes the code just after the log's last byte
        result = hosts.run_script(connection, f"cat {JOBS}/{job_id}/exit_code")
        if result.exited == 0 and result.stdout.strip():
            return int(result.stdout.strip())
        time.sleep(0.1)
    return LOST

"""The playbook engine: check every step on every host in one round trip, run only what is not
in place, in order, and report ok/changed/failed/skipped. One worker per host does all of it:
connect, gather the checks, make right what is not.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_grpo.config import secrets
from tpu_grpo.config.host_paths import PROVISIONING
from tpu_grpo.host import hosts
from tpu_grpo.provision.playbook import Playbook, Step, applies, render, selected

RETRY_DELAYS_S = (5, 20)  # network steps: attempts after the first, with these waits before them
# What apt, curl, uv, pip and git print when the network, not the request, failed: only such a failure
# of a network step is retried. Anything else (no solution for a requirement, a failed build) would
# fail the same way again, and the extra deps' build alone takes many minutes of reserved time.
_TRANSIENT = re.compile(
    r"temporary failure|could(n't| not) resolve (host|proxy)|name resolution|dns error|network is unreachable"
    r"|no route to host|could not connect|unable to (connect|access)|failed to (fetch|connect|download(?! and build))"
    r"|connection (refused|reset|timed out|closed|aborted)|timed out|read ?timeout|error sending request"
    r"|ssl (connect )?error|tls handshake|hash sum mismatch|early eof|rpc failed|hung up unexpectedly"
    r"|max retries exceeded|returned error: (429|5\d\d)|too many requests|internal server error|bad gateway"
    r"|service unavailable|gateway time-?out",
    re.IGNORECASE,
)
OUTPUT_TAIL_LINES = 15
_MARK = "@@tpu-grpo-check"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


def local_secret(source: str) -> str | None:
    """The Hugging Face token as huggingface_hub finds it: env HF_TOKEN, else the token file."""
    assert source == "hf_token"
    return secrets.hub_token()


@dataclass
class StepResult:
    step: str
    status: str  # ok | changed | failed | skipped
    seconds: float = 0.0
    started: float | None = None  # when a step that ran began (epoch seconds), for `invoke timeline`
    note: str = ""
    exit_code: int | None = None
    output: str = ""


@dataclass
class HostReport:
    host: str
    steps: list[StepResult] = field(default_factory=list)
    error: str | None = None
    notices: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None or any(result.status == "failed" for result in self.steps)

    def counts(self) -> dict[str, int]:
        return {
            status: sum(result.status == status for result in self.steps)
            for status in ("ok", "changed", "failed", "skipped")
        }


@dataclass
class Report:
    playbook: str
    check_mode: bool
    hosts: list[HostReport]

    @property
    def failed(self) -> bool:
        return any(host.failed for host in self.hosts)

    def to_json(self) -> dict:
        return {
            "playbook": self.playbook,
            "check_mode": self.check_mode,
            "failed": self.failed,
            "hosts": [
                {
                    "host": host.host,
                    "error": host.error,
                    "notices": host.notices,
                    **host.counts(),
                    "steps": [asdict(result) for result in host.steps],
                }
                for host in self.hosts
            ],
        }


Event = Callable[[str, str, str, Any], None]  # (kind, host, step, payload): start | output | done


class Planned:
    """One step as it will run on the hosts: its rendered scripts, or why it is skipped."""

    def __init__(self, book: Playbook, step: Step, values: dict, secrets: dict):
        self.step, self.values = step, values
        self.skip = ""
        self.secret_value: str | None = None
        if not applies(step, values):
            self.skip = f"when: {', '.join(step.when)}"
        if step.secret:
            self.secret_value = secrets.get(step.secret["source"])
            if self.secret_value is None and not self.skip:
                self.skip = (
                    f"no local {step.secret['source']} (a public model needs none; a gated one: export HF_TOKEN=hf_... "
                    "or `uv run hf auth login`)"
                )
            digest = hashlib.sha256((self.secret_value or "").encode()).hexdigest()
            dest = shlex.quote(step.secret["dest"])
            self.check = self.check_script = (
                f'cd && [ "$(sha256sum < {dest} 2>/dev/null)" = "{digest}  -" ] && [ "$(stat -c %a {dest})" = 600 ]'
            )
            self.run = ""
        else:
            self.check_script = self._script(book, step.check)
            self.check = hosts.bash_command(self.check_script, step.become)
            self.run = (
                hosts.bash_command(self._script(book, step.run), step.become) + " 2>&1"
            )  # one stream, in the order written

    def _script(self, book: Playbook, text: str) -> str:
        return f"{render(book.prelude, self.values).rstrip()}\ncd\n{render(text, self.values)}"


def local_secrets(book: Playbook) -> dict[str, str | None]:
    """The secrets the playbook's steps send, read here (checked once before anything connects, read again to send)."""
    return {source: local_secret(source) for source in {step.secret["source"] for step in book.steps if step.secret}}


def plan(book: Playbook, values: dict, tags: list[str] | None = None) -> list[Planned]:
    """Each selected step as it would run now: its exact check and run command lines, or why it is skipped."""
    secrets = local_secrets(book)
    return [Planned(book, step, values, secrets) for step in selected(book, tags)]


_CHECK_FUNCTION = (
    '_check() { out=$(script=$2; set --; eval "$script" 2>&1 </dev/null); code=$?; '
    'if [ $code != 0 ] && [ -n "$out" ]; then out=$(printf %s "$out" | tail -c 2000 | base64 -w0); else out=; fi; '
    f'printf "\\n{_MARK} %s %s %s\\n" "$1" "$code" "$out"; }}'
)


def gather_script(planned: list[Planned]) -> str:
    """One remote script running every check at once (they only read), printing each exit code and,
    for a failing check, the end of its output (what `--check` shows) on one line (a single write,
    shorter than PIPE_BUF, so lines never mix).

    Each check's script runs in a subshell of this one (as its `bash -c` would, without starting
    bash again); the `become` ones all under one sudo, which costs as much as a check."""

    def background(items: list[Planned]) -> list[str]:
        return [f"_check {item.step.index} {shlex.quote(item.check_script)} &" for item in items]

    checked = [item for item in planned if not item.skip]
    as_root = background([item for item in checked if item.step.become])
    lines = [_CHECK_FUNCTION]
    if as_root:  # first: sudo takes longer to start than the user's checks take to run
        lines.append(hosts.bash_command("\n".join([_CHECK_FUNCTION, *as_root, "wait"]), become=True) + " &")
    return "\n".join(lines + background([item for item in checked if not item.step.become]) + ["wait"])


def parse_gathered(stdout: str) -> dict[int, tuple[int, str]]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith(_MARK + " "):
            _, index, code, output = (line.split(" ", 3) + [""])[:4]
            found[int(index)] = (int(code), base64.b64decode(output).decode(errors="replace"))
    return found


def _as_shown(text: str) -> str:
    """A line of a command's output as a report shows it: no colours or cursor moves, spaces collapsed."""
    return " ".join(_ANSI.sub("", text).split())


class _Stream:
    """A file-like sink for a running command (under a terminal, for its progress bars): reports each
    line as it is drawn, a bar's redraws after `\r` included, and keeps the last lines as the terminal
    shows them at the end, so that a failed step's tail holds its messages, not spinner frames."""

    def __init__(self, report: Callable[[str], None] | None):
        self.report, self.partial, self.drawn = report, "", ""
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        *pieces, self.partial = re.split(r"(\r|\n)", self.partial + text)
        for segment, end in zip(pieces[::2], pieces[1::2]):
            shown = _as_shown(segment)
            if shown and self.report:
                self.report(shown)
            if end == "\r":  # back to the start of the line: the next segment draws over this one
                self.drawn = shown or self.drawn
            else:
                self._keep(shown or self.drawn)
                self.drawn = ""

    def _keep(self, line: str) -> None:
        if line:
            self.lines = (self.lines + [line])[-OUTPUT_TAIL_LINES:]

    def tail(self) -> str:
        """The last lines, with the one still being drawn."""
        unfinished = _as_shown(self.partial) or self.drawn
        return "\n".join((self.lines + [unfinished] if unfinished else self.lines)[-OUTPUT_TAIL_LINES:])

    def flush(self) -> None:
        pass


def apply(
    book: Playbook,
    values: dict,
    targets: list[hosts.Host],
    *,
    check_mode: bool = False,
    tags: list[str] | None = None,
    on_event: Event | None = None,
    retry_delays: tuple = RETRY_DELAYS_S,
    wait_s: float = 0,
) -> Report:
    """Apply the playbook to every host in parallel, one worker per host: its one connection, one round
    trip of every check, then only the steps that are not in place, in order."""
    notify = on_event or (lambda *args: None)
    planned = plan(book, values, tags)
    gather = gather_script(planned)
    reports = [HostReport(host.name) for host in targets]

    def provision_host(host: hosts.Host, report: HostReport) -> None:
        try:
            connection = hosts.connect(host, report.notices, wait_s)
        except hosts.HostError as error:
            report.error = str(error)
            return
        try:
            try:
                gathered = hosts.run(connection, gather, hide=True, warn=True)
            except Exception as error:  # noqa: BLE001 - a lost connection ends this host, whatever paramiko raises
                report.error = f"{host.name}: connection lost while checking ({error or type(error).__name__})"
                return
            checks = parse_gathered(gathered.stdout)
            works = not check_mode and any(
                not item.skip and checks.get(item.step.index, (1,))[0] != 0 for item in planned
            )  # a run that changes nothing takes no lease
            with hosts.busy(connection, "provision") if works else contextlib.nullcontext():
                _apply_host(connection, report, planned, checks, check_mode, notify, retry_delays)
            if any(result.started for result in report.steps) and connection.is_connected:
                _record(connection, report)
        finally:
            connection.close()

    with ThreadPoolExecutor(max(1, len(targets))) as pool:
        list(pool.map(provision_host, targets, reports))
    return Report(str(book.path), check_mode, reports)


def _apply_host(
    connection,
    report: HostReport,
    planned: list[Planned],
    checks: dict,
    check_mode: bool,
    notify: Event,
    retry_delays: tuple,
) -> None:
    changed_something = False
    for item in planned:
        name = item.step.name
        if item.skip:
            report.steps.append(StepResult(name, "skipped", note=item.skip))
            notify("done", report.host, name, report.steps[-1])
            continue
        code, output = checks.get(item.step.index, (1, "the check did not run"))
        if code != 0 and changed_something:  # an earlier step may have put this one in place (or let its check work)
            try:
                code = hosts.run(connection, item.check, warn=True, hide=True).exited
            except Exception as error:  # noqa: BLE001 - as below
                report.error = f"{report.host}: connection lost before '{name}' ({error or type(error).__name__})"
                return
        if code == 0:
            report.steps.append(StepResult(name, "ok"))
            notify("done", report.host, name, report.steps[-1])
            continue
        if check_mode:
            report.steps.append(StepResult(name, "changed", note="would change", output=output.strip()))
            notify("done", report.host, name, report.steps[-1])
            continue
        notify("start", report.host, name, None)
        started, began = time.monotonic(), time.time()
        try:
            result = _make_right(connection, item, functools.partial(notify, "output", report.host, name), retry_delays)
        except Exception as error:  # noqa: BLE001 - a lost connection ends this host, whatever paramiko raises
            result = StepResult(
                name,
                "failed",
                note=f"connection lost ({error or type(error).__name__}); re-run to continue from this step",
            )
            report.error = f"{report.host}: connection lost during '{name}'"
        result.seconds, result.started = round(time.monotonic() - started, 2), round(began, 3)
        report.steps.append(result)
        changed_something = True
        notify("done", report.host, name, result)
        if result.status == "failed":
            for rest in planned[planned.index(item) + 1 :]:
                report.steps.append(StepResult(rest.step.name, "skipped", note=f"not run: '{name}' failed"))
                notify("done", report.host, rest.step.name, report.steps[-1])
            return


def _record(connection, report: HostReport) -> None:
    """Keep on the host when each step that ran began and how long it took (`invoke timeline` reads it)."""
    ran = [
        {"step": result.step, "status": result.status, "started": result.started, "seconds": result.seconds}
        for result in report.steps
        if result.started
    ]
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(next(r.started for r in report.steps if r.started)))
    hosts.write_text(connection, f"{PROVISIONING}/{name}.json", json.dumps({"host": report.host, "steps": ran}))


def _make_right(connection, item: Planned, on_line: Callable[[str], None], retry_delays: tuple) -> StepResult:
    name = item.step.name
    if item.step.secret and item.secret_value is not None:  # none: the step is skipped
        try:
            _copy_secret(connection, item.step.secret["dest"], item.secret_value)
        except OSError as error:  # SFTP's own refusal (permission denied) on a live link is the step's failure
            if not connection.is_connected:
                raise
            return StepResult(name, "failed", note=f"cannot write {item.step.secret['dest']}: {error}")
    else:
        attempts = 1 + len(retry_delays) if item.step.network else 1
        for attempt in range(1, attempts + 1):
            stream = _Stream(on_line if item.step.progress else None)
            # A terminal makes uv and apt print their progress bars; the lines stream to the laptop.
            result = hosts.run(
                connection,
                item.run,
                warn=True,
                hide=False,
                pty=item.step.progress,
                out_stream=stream,
                err_stream=stream,
            )
            if result.exited == 0 or attempt == attempts:
                break
            transient = _TRANSIENT.search(stream.tail())
            if not transient:
                break
            delay = retry_delays[attempt - 1]
            on_line(f"attempt {attempt + 1} of {attempts} in {delay} s, after: {transient.group(0)}")
            time.sleep(delay)
        if result.exited != 0:
            return StepResult(
                name, "failed", note=f"exit code {result.exited}", exit_code=result.exited, output=stream.tail()
            )
    verify = hosts.run(connection, item.check, warn=True, hide=True)
    if verify.exited != 0:
        tail = (verify.stdout + verify.stderr).strip().splitlines()[-OUTPUT_TAIL_LINES:]
        return StepResult(
            name, "failed", note="it ran, but its check still fails", exit_code=verify.exited, output="\n".join(tail)
        )
    return StepResult(name, "changed")


def _copy_secret(connection, dest: str, value: str) -> None:
    """Write the secret through SFTP into a 0600 file, then rename: never on a command line or in a log."""
    parent = os.path.dirname(dest)
    if parent:
        hosts.run(connection, f"cd && mkdir -p {shlex.quote(parent)}", hide=True)
    sftp = connection.sftp()
    partial = f"{dest}.partial"
    with sftp.open(partial, "w") as handle:
        handle.chmod(0o600)
        handle.write(value.encode())
    sftp.posix_rename(partial, dest)

"""The playbook engine: load and validate a YAML playbook, check every step on every host in
one round trip, run only what is not in place, in order, and report ok/changed/failed/skipped.

The playbook (playbooks/host.yml) holds what a host needs; this module only knows how to
apply such steps: template variables, `when` conditions, sudo, retries, streamed output,
the secret copy (never on a command line), and the lock file for reproducible rebuilds.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from tpu_grpo import host_paths, hosts as hosts_module
from tpu_grpo.errors import UserError

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"  # they ship with the code, not the stack
PLAYBOOK = PLAYBOOKS / "host.yml"
LOCK = PLAYBOOKS / "host.lock.txt"
STEP_KEYS = {"name", "tags", "when", "become", "network", "progress", "check", "run", "secret"}
VAR_KEYS = {"default", "help", "pattern", "choices"}
PLAYBOOK_KEYS = {"prelude", "vars", "steps"}
#: Set by the engine, not by `--var`: `--locked` and its lock, and the host paths the jobs use.
BUILTINS = {"locked": False, "lock_requirements": "", **host_paths.playbook_values()}
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
    r"|service unavailable|gateway time-?out", re.IGNORECASE)
OUTPUT_TAIL_LINES = 15
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
_CONDITION = re.compile(r"^(?:(?P<negate>not\s+)?(?P<flag>[A-Za-z_]\w*)|(?P<name>[A-Za-z_]\w*)\s*==\s*(?P<value>\S+))$")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+| @ [A-Za-z0-9+:/._@#=&%~-]+)$")
_MARK = "@@tpu-grpo-check"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


class PlaybookError(UserError):
    """A playbook, variable override or lock that cannot be used; one line naming where and the fix."""


# ---------------------------------------------------------------- loading and validation


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser: 10x faster
    """Keeps each mapping's line number, so errors can name it."""


def _mapping_with_line(loader, node):
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


@dataclass(frozen=True)
class Var:
    name: str
    default: Any
    help: str = ""
    pattern: str | None = None
    choices: tuple = ()

    def coerce(self, text: str, where: str) -> Any:
        """A `--var` string -> a value of the default's type, checked like the default."""
        if isinstance(self.default, bool):
            if text.lower() not in {"true", "false"}:
                raise PlaybookError(f"{where}: {self.name}={text!r} is not a boolean; fix: {self.name}=true or {self.name}=false")
            return text.lower() == "true"
        if isinstance(self.default, int):
            if not re.fullmatch(r"\d+", text):
                raise PlaybookError(f"{where}: {self.name}={text!r} is not a whole number; fix: e.g. {self.name}={self.default}")
            return int(text)
        self.validate(text, where)
        return text

    def validate(self, value: str, where: str) -> None:
        if self.choices and value not in self.choices:
            raise PlaybookError(f"{where}: {self.name}={value!r} is not one of {', '.join(self.choices)}; "
                                f"fix: {self.name}={self.choices[0]}")
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise PlaybookError(f"{where}: {self.name}={value!r} does not match {self.pattern}; "
                                f"fix: e.g. {self.name}={self.default}")


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    line: int
    check: str = ""
    run: str = ""
    tags: tuple = ()
    when: tuple = ()
    become: bool = False
    network: bool = False
    progress: bool = False
    secret: dict | None = None


@dataclass(frozen=True)
class Playbook:
    path: Path
    prelude: str
    vars: dict[str, Var]
    steps: tuple[Step, ...]

    def where(self, line: int | None = None, step: Step | None = None) -> str:
        return f"{self.path}" + (f":{line}" if line else "") + (f": step '{step.name}'" if step else "")


SECRET_SOURCES = {"hf_token": "the Hugging Face token (env HF_TOKEN, or the local HF token file)"}


def load(path: Path | None = None) -> Playbook:
    """Read and validate a playbook; any problem is a PlaybookError naming the file, line and step."""
    path = Path(path or PLAYBOOK)
    try:
        document = yaml.load(path.read_text(), Loader=_LineLoader)
    except OSError as error:
        raise PlaybookError(f"{path}: cannot read ({error.strerror}); fix: give an existing playbook") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise PlaybookError(f"{path}{line}: not valid YAML ({getattr(error, 'problem', error)}); fix: correct the YAML there") from None
    if not isinstance(document, dict):
        raise PlaybookError(f"{path}: a playbook is a mapping with {', '.join(sorted(PLAYBOOK_KEYS))}; fix: see playbooks/host.yml")
    book = Playbook(path, "", {}, ())
    _unknown_keys(document, PLAYBOOK_KEYS, book.where(document["__line__"]))
    variables = {}
    for name, spec in (document.get("vars") or {}).items():
        if name == "__line__":
            continue
        if not isinstance(spec, dict) or "default" not in spec:
            raise PlaybookError(f"{book.where(document['vars']['__line__'])}: variable '{name}' needs a mapping with "
                                f"'default'; fix: {name}: {{default: ..., help: ...}}")
        _unknown_keys(spec, VAR_KEYS, f"{book.where(spec['__line__'])}: variable '{name}'")
        if name in BUILTINS:
            raise PlaybookError(f"{book.where(spec['__line__'])}: variable '{name}' is set by the engine; fix: rename it")
        var = Var(name, spec["default"], spec.get("help", ""), spec.get("pattern"), tuple(spec.get("choices") or ()))
        if isinstance(var.default, str):
            var.validate(var.default, f"{book.where(spec['__line__'])}: default")
        variables[name] = var
    known = set(variables) | set(BUILTINS)
    steps = []
    for index, raw in enumerate(document.get("steps") or []):
        steps.append(_step(book, index, raw, known, variables))
    if not steps:
        raise PlaybookError(f"{path}: no steps; fix: add a list under 'steps:'")
    prelude = document.get("prelude") or ""
    _templates_known(prelude, known, book.where(document["__line__"]) + ": prelude")
    return Playbook(path, prelude, variables, tuple(steps))


def _unknown_keys(mapping: dict, allowed: set, where: str) -> None:
    unknown = sorted(set(mapping) - allowed - {"__line__"})
    if unknown:
        raise PlaybookError(f"{where}: unknown key {unknown[0]!r}; fix: use only {', '.join(sorted(allowed))}")


def _templates_known(text: str, known: set, where: str) -> None:
    for name in _TEMPLATE.findall(text):
        if name not in known:
            raise PlaybookError(f"{where}: unknown variable '{{{{ {name} }}}}'; fix: declare it under 'vars:'")


def _step(book: Playbook, index: int, raw: Any, known: set, variables: dict) -> Step:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{book.path}: step {index + 1} is not a mapping; fix: '- name: ...' with check and run")
    line = raw["__line__"]
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise PlaybookError(f"{book.where(line)}: step {index + 1} has no name; fix: add 'name: ...'")
    step = Step(index, name, line)
    where = book.where(line, step)
    _unknown_keys(raw, STEP_KEYS, where)
    secret = raw.get("secret")
    if secret is not None:
        if raw.get("check") or raw.get("run"):
            raise PlaybookError(f"{where}: a secret step has no check or run (the engine compares hashes); fix: remove them")
        if raw.get("become"):
            raise PlaybookError(f"{where}: a secret is copied as the SSH user, into its home; fix: remove become")
        if not isinstance(secret, dict) or secret.get("source") not in SECRET_SOURCES or not secret.get("dest"):
            raise PlaybookError(f"{where}: secret needs source ({', '.join(SECRET_SOURCES)}) and dest; "
                                "fix: secret: {source: hf_token, dest: .cache/huggingface/token}")
        _templates_known(str(secret["dest"]), set(BUILTINS), where)
        dest = render(str(secret["dest"]), BUILTINS)  # only the engine's values: known when the playbook loads
        if dest.startswith("/") or ".." in dest.split("/") or not re.fullmatch(r"[A-Za-z0-9_./-]+", dest):
            raise PlaybookError(f"{where}: secret dest {dest!r} must be a plain path under the home directory; "
                                "fix: e.g. .cache/huggingface/token")
        secret = {"source": secret["source"], "dest": dest}
    else:
        for key in ("check", "run"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise PlaybookError(f"{where}: '{key}' is missing; fix: give a bash {'test' if key == 'check' else 'script'}")
            _templates_known(raw[key], known, where)
    flags = {}
    for key in ("become", "network", "progress"):
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            raise PlaybookError(f"{where}: {key}={flags[key]!r} is not true or false; fix: {key}: true")
    tags, when = raw.get("tags") or [], raw.get("when") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise PlaybookError(f"{where}: tags must be a list of words; fix: tags: [apt]")
    if not isinstance(when, list):
        raise PlaybookError(f"{where}: when must be a list of conditions; fix: when: [{when}]")
    for condition in when:
        match = _CONDITION.match(str(condition).strip())
        name_used = match and (match["flag"] or match["name"])
        if not match or name_used not in known:
            raise PlaybookError(f"{where}: condition {condition!r} is not 'VAR', 'not VAR' or 'VAR == VALUE' "
                                f"over declared variables; fix: e.g. when: [apt_upgrade]")
    return Step(index, name, line, raw.get("check", ""), raw.get("run", ""), tuple(tags),
                tuple(str(condition).strip() for condition in when), secret=secret, **flags)


def stack_values(chosen) -> dict[str, Any]:
    """The playbook variables that follow from the stack's settings (before any `--var`)."""
    return {"idle_stop_minutes": chosen.idle_stop_minutes}


def resolve(book: Playbook, overrides: list[str] | None = None, lock_path: Path | None = None,
            stack: dict[str, Any] | None = None) -> dict[str, Any]:
    """The variables for a run: defaults, then the stack's (`stack_values`), then the lock's Python and
    uv, then `--var KEY=VALUE`."""
    values = {name: var.default for name, var in book.vars.items()} | BUILTINS
    values.update({name: value for name, value in (stack or {}).items() if name in book.vars})
    if lock_path is not None:
        lock = read_lock(lock_path)
        values.update(locked=True, lock_requirements=lock.requirements)
        for name, pinned in (("python_version", lock.python), ("uv_version", lock.uv)):
            if name in book.vars and pinned:
                values[name] = book.vars[name].coerce(pinned, str(lock_path))
    for item in overrides or []:
        name, equals, text = item.partition("=")
        if name in BUILTINS:
            raise PlaybookError(f"--var {item!r}: {name} is set by tpu-grpo itself (where the jobs look for it: "
                                "tpu_grpo/host_paths.py, or --locked); fix: remove this --var")
        if not equals or name not in book.vars:
            known = ", ".join(book.vars)
            raise PlaybookError(f"--var {item!r}: {'unknown variable' if equals else 'not KEY=VALUE'}"
                                f"{' ' + repr(name) if equals else ''}; fix: one of {known}")
        values[name] = book.vars[name].coerce(text, f"--var {name}")
    return values


def applies(step: Step, values: dict) -> bool:
    """Whether every `when` condition of the step holds for these variables."""
    for condition in step.when:
        match = _CONDITION.match(condition)
        if match["name"]:
            holds = str(values[match["name"]]) == match["value"]
        else:
            holds = bool(values[match["flag"]]) != bool(match["negate"])
        if not holds:
            return False
    return True


def render(text: str, values: dict) -> str:
    """Fill `{{ name }}`: every value was validated by its pattern, type or the lock's grammar."""
    return _TEMPLATE.sub(lambda match: str(values[match[1]]), text)


def parse_tags(items: list[str] | None) -> list[str]:
    """`--tags apt,uv --tags disk` -> ["apt", "uv", "disk"]; a given but empty `--tags` is refused, not
    taken as "every step"."""
    tags = [tag.strip() for item in items or [] for tag in item.split(",")]
    if items and (not tags or "" in tags):
        raise PlaybookError(f"--tags {','.join(items)!r} holds an empty tag; fix: e.g. --tags apt,uv")
    return tags


def selected(book: Playbook, tags: list[str] | None) -> list[Step]:
    if not tags:
        return list(book.steps)
    known = {tag for step in book.steps for tag in step.tags}
    unknown = sorted(set(tags) - known)
    if unknown:
        raise PlaybookError(f"--tags {unknown[0]!r} matches no step; fix: one of {', '.join(sorted(known))}")
    return [step for step in book.steps if set(step.tags) & set(tags)]


# ---------------------------------------------------------------- secrets and the lock


def local_secret(source: str) -> str | None:
    """The Hugging Face token as huggingface_hub finds it: env HF_TOKEN, else the token file."""
    assert source == "hf_token"
    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    path = Path(os.environ.get("HF_TOKEN_PATH") or home / "token").expanduser()
    return path.read_text().strip() or None if path.is_file() else None


@dataclass(frozen=True)
class Lock:
    python: str
    uv: str
    requirements: str


def read_lock(path: Path) -> Lock:
    """Parse the lock `invoke freeze` wrote; every requirement line is checked, so it is safe to template."""
    try:
        text = Path(path).read_text()
    except OSError:
        raise PlaybookError(f"{path}: no lock file; fix: run `uv run invoke freeze` on a provisioned host first") from None
    header = dict(re.findall(r"^# (python|uv): (\S+)$", text, re.M))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#") and not _REQUIREMENT.match(line.strip()):
            raise PlaybookError(f"{path}:{number}: {line.strip()!r} is not 'name==version' or 'name @ url'; "
                                "fix: regenerate it with `uv run invoke freeze`")
    if not lines:
        raise PlaybookError(f"{path}: the lock lists no packages; fix: run `uv run invoke freeze`")
    return Lock(header.get("python", ""), header.get("uv", ""), "\n".join(lines))


def write_lock(path: Path, text: str) -> tuple[Path, int]:
    """Write the lock `freeze` made (via a temporary file, so a failed write leaves the old one); returns
    its path and how many packages it pins."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)
    return path, sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def freeze(connection, book: Playbook, values: dict, source: str) -> str:
    """The host's exact environment as a lock: Python, uv and every package of the venv."""
    venv = values["venv"]
    script = (f'{render(book.prelude, values).rstrip()}\n'
              f'{venv}/bin/python -c "import sys; print(sys.version.split()[0])"\n'
              f'uv --version | cut -d" " -f2\n'
              f'uv pip freeze --python {venv}')
    result = hosts_module.run_script(connection, script)
    if result.exited != 0:
        raise PlaybookError(f"{source}: cannot read the venv {venv} (exit {result.exited}: "
                            f"{result.stderr.strip().splitlines()[-1:] or ''}); fix: run `uv run invoke provision` first")
    python, uv, *packages = result.stdout.strip().splitlines()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ("# tpu-grpo host lock: `invoke provision --locked` installs exactly this with `uv pip sync`.\n"
            f"# written by `invoke freeze` from {source} at {stamp}\n"
            f"# python: {python}\n# uv: {uv}\n" + "\n".join(sorted(packages, key=str.lower)) + "\n")


# ---------------------------------------------------------------- applying


@dataclass
class StepResult:
    step: str
    status: str  # ok | changed | failed | skipped
    seconds: float = 0.0
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
        return {status: sum(result.status == status for result in self.steps)
                for status in ("ok", "changed", "failed", "skipped")}


@dataclass
class Report:
    playbook: str
    check_mode: bool
    hosts: list[HostReport]

    @property
    def failed(self) -> bool:
        return any(host.failed for host in self.hosts)

    def to_json(self) -> dict:
        return {"playbook": self.playbook, "check_mode": self.check_mode, "failed": self.failed,
                "hosts": [{"host": host.host, "error": host.error, "notices": host.notices, **host.counts(),
                           "steps": [asdict(result) for result in host.steps]} for host in self.hosts]}


Event = Callable[[str, str, str, Any], None]  # (kind, host, step, payload): start | output | done


class Planned:
    """One step as it will run on the hosts: its rendered scripts, or why it is skipped."""

    def __init__(self, book: Playbook, step: Step, values: dict, secrets: dict):
        self.step, self.values = step, values
        self.skip = ""
        self.secret_value = None
        if not applies(step, values):
            self.skip = f"when: {', '.join(step.when)}"
        if step.secret:
            self.secret_value = secrets.get(step.secret["source"])
            if self.secret_value is None and not self.skip:
                self.skip = f"no local {step.secret['source']}: set HF_TOKEN or log in with `hf auth login`"
            digest = hashlib.sha256((self.secret_value or "").encode()).hexdigest()
            dest = shlex.quote(step.secret["dest"])
            self.check = self.check_script = (f'cd && [ "$(sha256sum < {dest} 2>/dev/null)" = "{digest}  -" ] '
                                              f'&& [ "$(stat -c %a {dest})" = 600 ]')
            self.run = ""
        else:
            self.check_script = self._script(book, step.check)
            self.check = hosts_module.bash_command(self.check_script, step.become)
            self.run = hosts_module.bash_command(self._script(book, step.run), step.become) + " 2>&1"  # one stream, in the order written

    def _script(self, book: Playbook, text: str) -> str:
        return f"{render(book.prelude, self.values).rstrip()}\ncd\n{render(text, self.values)}"


def plan(book: Playbook, values: dict, tags: list[str] | None = None) -> list[Planned]:
    """Each selected step as it would run now: its exact check and run command lines, or why it is skipped."""
    sources = {step.secret["source"] for step in book.steps if step.secret}
    secrets = {source: local_secret(source) for source in sources}
    return [Planned(book, step, values, secrets) for step in selected(book, tags)]


_CHECK_FUNCTION = ('_check() { out=$(script=$2; set --; eval "$script" 2>&1 </dev/null); code=$?; '
                   'if [ $code != 0 ] && [ -n "$out" ]; then out=$(printf %s "$out" | tail -c 2000 | base64 -w0); else out=; fi; '
                   f'printf "\\n{_MARK} %s %s %s\\n" "$1" "$code" "$out"; }}')


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
        lines.append(hosts_module.bash_command("\n".join([_CHECK_FUNCTION, *as_root, "wait"]), become=True) + " &")
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
        self.report, self.partial, self.drawn, self.lines = report, "", "", []

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


def apply(book: Playbook, values: dict, targets: list[hosts_module.Host], *, check_mode: bool = False,
          tags: list[str] | None = None, on_event: Event | None = None,
          retry_delays: tuple = RETRY_DELAYS_S, wait_s: float = 0) -> Report:
    """Apply the playbook to every host in parallel: one connection and one round trip of checks per host."""
    notify = on_event or (lambda *args: None)
    planned = plan(book, values, tags)
    reports = {host.name: HostReport(host.name) for host in targets}

    def open_one(host):
        try:
            return host, hosts_module.connect(host, reports[host.name].notices, wait_s)
        except hosts_module.HostError as error:
            reports[host.name].error = str(error)
            return host, None

    with ThreadPoolExecutor(max(1, len(targets))) as pool:
        opened = [(host, connection) for host, connection in pool.map(open_one, targets) if connection]
    from fabric import ThreadingGroup
    from fabric.exceptions import GroupException

    try:
        group = ThreadingGroup.from_connections([connection for _, connection in opened])
        try:
            gathered = group.run(gather_script(planned), hide=True, warn=True)
        except GroupException as error:
            gathered = error.result
        threads = []
        for host, connection in opened:
            result = gathered[connection]
            if not isinstance(result, BaseException) and result.exited == -1:
                connection.transport.join(1)
                result = hosts_module.ConnectionLost("no exit status") if not connection.is_connected else result
            if isinstance(result, BaseException):
                reports[host.name].error = f"{host.name}: connection lost while checking ({result or type(result).__name__})"
                continue
            checks = parse_gathered(result.stdout)
            thread = threading.Thread(target=_apply_host, args=(connection, reports[host.name], planned, checks,
                                                                 check_mode, notify, retry_delays))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
    finally:
        for _, connection in opened:
            connection.close()
    return Report(str(book.path), check_mode, [reports[host.name] for host in targets])


def _apply_host(connection, report: HostReport, planned: list[Planned], checks: dict, check_mode: bool,
                notify: Event, retry_delays: tuple) -> None:
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
                code = hosts_module.run(connection, item.check, warn=True, hide=True).exited
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
        started = time.monotonic()
        try:
            result = _make_right(connection, item, lambda line, step=name: notify("output", report.host, step, line),
                                 retry_delays)
        except Exception as error:  # noqa: BLE001 - a lost connection ends this host, whatever paramiko raises
            result = StepResult(name, "failed", note=f"connection lost ({error or type(error).__name__}); "
                                                     "re-run to continue from this step")
            report.error = f"{report.host}: connection lost during '{name}'"
        result.seconds = round(time.monotonic() - started, 2)
        report.steps.append(result)
        changed_something = True
        notify("done", report.host, name, result)
        if result.status == "failed":
            for rest in planned[planned.index(item) + 1:]:
                report.steps.append(StepResult(rest.step.name, "skipped", note=f"not run: '{name}' failed"))
                notify("done", report.host, rest.step.name, report.steps[-1])
            return


def _make_right(connection, item: Planned, on_line: Callable[[str], None], retry_delays: tuple) -> StepResult:
    name = item.step.name
    if item.step.secret:
        _copy_secret(connection, item.step.secret["dest"], item.secret_value)
    else:
        attempts = 1 + len(retry_delays) if item.step.network else 1
        for attempt in range(1, attempts + 1):
            stream = _Stream(on_line if item.step.progress else None)
            # A terminal makes uv and apt print their progress bars; the lines stream to the laptop.
            result = hosts_module.run(connection, item.run, warn=True, hide=False, pty=item.step.progress,
                          out_stream=stream, err_stream=stream)
            if result.exited == 0 or attempt == attempts:
                break
            transient = _TRANSIENT.search(stream.tail())
            if not transient:
                break
            delay = retry_delays[attempt - 1]
            on_line(f"attempt {attempt + 1} of {attempts} in {delay} s, after: {transient.group(0)}")
            time.sleep(delay)
        if result.exited != 0:
            return StepResult(name, "failed", note=f"exit code {result.exited}", exit_code=result.exited,
                              output=stream.tail())
    verify = hosts_module.run(connection, item.check, warn=True, hide=True)
    if verify.exited != 0:
        tail = (verify.stdout + verify.stderr).strip().splitlines()[-OUTPUT_TAIL_LINES:]
        return StepResult(name, "failed", note="it ran, but its check still fails", exit_code=verify.exited,
                          output="\n".join(tail))
    return StepResult(name, "changed")


def _copy_secret(connection, dest: str, value: str) -> None:
    """Write the secret through SFTP into a 0600 file, then rename: never on a command line or in a log."""
    parent = os.path.dirname(dest)
    if parent:
        hosts_module.run(connection, f"cd && mkdir -p {shlex.quote(parent)}", hide=True)
    sftp = connection.sftp()
    partial = f"{dest}.partial"
    with sftp.open(partial, "w") as handle:
        handle.chmod(0o600)
        handle.write(value.encode())
    sftp.posix_rename(partial, dest)


# ---------------------------------------------------------------- showing it

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "dim"}


class LiveView:
    """Prints a line per finished step as it happens, and what each host is doing right now."""

    def __init__(self, console, check_mode: bool):
        from rich.live import Live

        self.console, self.check_mode = console, check_mode
        self.running: dict[str, tuple[str, float, str]] = {}
        self.lock = threading.Lock()
        self.live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._now)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def _now(self):
        from rich.text import Text

        lines = [f"{host}  {step}  {time.monotonic() - since:.0f}s  {last[-100:]}"
                 for host, (step, since, last) in sorted(self.running.items())]
        return Text("\n".join(lines), style="cyan")

    def __call__(self, kind: str, host: str, step: str, payload) -> None:
        with self.lock:
            if kind == "start":
                self.running[host] = (step, time.monotonic(), "")
            elif kind == "output" and host in self.running:
                self.running[host] = (*self.running[host][:2], payload)
            elif kind == "done":
                self.running.pop(host, None)
                self.console.print(_step_line(host, payload, self.check_mode), soft_wrap=True)


def _step_line(host: str, result: StepResult, check_mode: bool) -> str:
    label = "would change" if check_mode and result.status == "changed" else result.status
    seconds = f"{result.seconds:6.1f}s" if result.seconds else " " * 7
    note = f"  ({result.note})" if result.note and result.note != "would change" else ""
    return f"{host}  [{STATUS_STYLE[result.status]}]{label:<12}[/] {seconds}  {result.step}{note}"


def print_summary(report: Report, console) -> None:
    """After the step lines: what failed and why, and one summary line per host."""
    from rich.markup import escape

    for host in report.hosts:
        for notice in host.notices:
            console.print(f"note: {escape(notice)}", soft_wrap=True)
        for result in host.steps:
            if result.status == "failed" or (report.check_mode and result.output):
                verb = "would change" if report.check_mode else "failed"
                heading = f"{host.host}: '{result.step}' {verb}" + (f" with exit code {result.exit_code}" if result.exit_code else "")
                note = "" if result.note in {f"exit code {result.exit_code}", "would change"} else f": {result.note}"
                console.print(f"[bold]{escape(heading)}[/]{escape(note)}", soft_wrap=True)
                for line in result.output.splitlines()[-OUTPUT_TAIL_LINES:]:
                    console.print(f"    {escape(line)}", soft_wrap=True)
    for host in report.hosts:
        counts = host.counts()
        summary = ", ".join(f"{count} {'would change' if report.check_mode and status == 'changed' else status}"
                            for status, count in counts.items())
        state = "[bold red]FAILED[/]" if host.failed else "[green]done[/]"
        console.print(f"{escape(host.host)}: {state}  {summary}" + (f"  [red]{escape(host.error)}[/]" if host.error else ""))

"""Shared code of the MaxText 0.2.3 stand-in (standard library only, Python >= 3.11).

Real MaxText cannot run on the test machines. The modules under ``maxtext/`` run this code
instead: they record how they were invoked, replay the log MaxText 0.2.3 itself wrote in a
CPU rehearsal (``tests/data/maxtext-0.2.3``) and write the output tree that run wrote.
Control comes from ``~/.standin.json`` only, never from the environment. See README.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

CONTROL_FILE = ".standin.json"
RECORDS_FILE = Path(".standin") / "records.jsonl"
SIGNALS_FILE = Path(".standin") / "signals.jsonl"
SHORT_NAMES = ("to_maxtext", "train_rl", "to_huggingface")
DEFAULT_FIXTURES = Path(__file__).resolve().parents[2] / "data" / "maxtext-0.2.3"
DEFAULTS = {
    "line_delay_s": 0.0,
    "exit_code": {},
    "device_count": 8,
    "hold_s": 0.0,
    "fixtures": None,
    "hbm_used_bytes": 26_843_545_600,
    "duty_cycle_pct": 87.5,
    "eval_accuracy": {},
}
REHEARSAL_STEPS = 4  # the rehearsal ran num_batches=4, checkpoint_period=2: train steps 1..4, checkpoints 1, 2, 4
#: MaxText 0.2.3's rl.yml defaults, used when the command line does not set them (as MaxText does).
MAXTEXT_CHECKPOINT_PERIOD, MAXTEXT_CHECKPOINTS_TO_KEEP = 50, 10
TRAIN_STEP = re.compile(rb"\] Train step (\d+) ")
EVAL_STEP = re.compile(rb"Intermediate Eval \(step=(\d+)\)")
EVAL_SCORE = re.compile(rb"corr=(\d+), total=(\d+), accuracy=[0-9.]+%")
TIME_TRAILER = re.compile(rb"(real|user|sys)\t\d+m[0-9.]+s")
# argparse flags of to_maxtext (everything else is a key=value override)
FLAGS = ("lazy_load_tensors", "eager_load_method", "hf_model_path", "revision", "save_dtype")


class StandinError(Exception):
    """A failure the stand-in reports on stderr before exiting with ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def home() -> Path:
    return Path(os.path.expanduser("~"))


# ---------------------------------------------------------------- record and control


def append_line(path: Path, entry: dict) -> None:
    """One JSON line appended in one write (concurrent runs do not interleave), then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def note_sigterm(module: str) -> None:
    """On SIGTERM, append {"module", "pid", "signal"} to ~/.standin/signals.jsonl, then die of the
    signal as MaxText does (the default action), so a test can tell who got it."""

    def handler(number, frame):
        append_line(home() / SIGNALS_FILE, {"module": module, "pid": os.getpid(), "signal": "SIGTERM"})
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


def record(module: str) -> None:
    """Append one JSON line describing this invocation to ~/.standin/records.jsonl."""
    entry = {
        "module": module,
        "argv": sys.argv[1:],
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "time": time.time(),
    }
    append_line(home() / RECORDS_FILE, entry)


def load_control() -> dict:
    """~/.standin.json merged over the defaults; a malformed file is an error, not ignored."""
    control = dict(DEFAULTS)
    path = home() / CONTROL_FILE
    if not path.exists():
        return control
    try:
        given = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StandinError(f"stand-in: cannot read control file {path}: {exc}", 2) from exc
    if not isinstance(given, dict):
        raise StandinError(f"stand-in: control file {path} must hold a JSON object", 2)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise StandinError(f"stand-in: unknown keys in {path}: {', '.join(unknown)}", 2)
    control.update(given)
    codes = control["exit_code"]
    if isinstance(codes, int):
        codes = {name: codes for name in SHORT_NAMES}
    if not isinstance(codes, dict) or not all(isinstance(v, int) for v in codes.values()):
        raise StandinError(f"stand-in: exit_code in {path} must map module names to integers", 2)
    control["exit_code"] = codes
    for key in ("line_delay_s", "hold_s"):
        control[key] = float(control[key])
    control["device_count"] = int(control["device_count"])
    control["hbm_used_bytes"] = int(control["hbm_used_bytes"])
    control["duty_cycle_pct"] = float(control["duty_cycle_pct"])
    scores = control["eval_accuracy"]
    if not isinstance(scores, dict) or not all(
        str(k).isdigit() and isinstance(v, (int, float)) and 0 <= v <= 100 for k, v in scores.items()
    ):
        raise StandinError(f"stand-in: eval_accuracy in {path} must map steps to percentages", 2)
    return control


def fixtures_dir(control: dict) -> Path:
    folder = Path(os.path.expanduser(control["fixtures"])) if control["fixtures"] else DEFAULT_FIXTURES
    if not (folder / "output-tree.txt").is_file():
        raise StandinError(
            f"stand-in: MaxText fixtures not found at {folder} "
            f'(set "fixtures" in ~/{CONTROL_FILE} to a readable copy of tests/data/maxtext-0.2.3)',
            2,
        )
    return folder


def device_count() -> int:
    try:
        return load_control()["device_count"]
    except StandinError as exc:
        print(exc, file=sys.stderr)
        return DEFAULTS["device_count"]


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str]) -> dict[str, str]:
    """MaxText's ``key=value`` overrides plus ``--flag=value`` / ``--flag value`` (last one wins)."""
    args: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            name, sep, value = token[2:].partition("=")
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                value = argv[i]
            args[name] = value
        elif "=" in token:
            key, _, value = token.partition("=")
            args[key] = value
        i += 1
    return args


def required(args: dict[str, str], key: str) -> str:
    if not args.get(key):
        raise StandinError(f"stand-in: {key}=... is required")
    return args[key]


def check_load_path(args: dict[str, str], key: str = "load_parameters_path") -> None:
    path = args.get(key, "")
    if path and not store_path(path).exists():
        raise StandinError(
            f"FileNotFoundError: Checkpoint at {path} not found ({key} does not exist; MaxText 0.2.3 stand-in)"
        )


# ---------------------------------------------------------------- gs:// paths (a Cloud Storage emulator)


class GcsPath:
    """The few path operations the jobs use, on gs://BUCKET/NAME, through the JSON API of the
    server STORAGE_EMULATOR_HOST names (tests run MaxText's output into a local emulator)."""

    def __init__(self, url: str):
        bucket, _, name = url.removeprefix("gs://").partition("/")
        self.bucket, self.key = bucket, "/".join(part for part in name.split("/") if part)

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.key}"

    def __truediv__(self, part: str) -> GcsPath:
        return GcsPath(f"{self}/{part}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> GcsPath:
        return GcsPath(f"gs://{self.bucket}/{self.key.rsplit('/', 1)[0] if '/' in self.key else ''}")

    def _api(self, path: str, data: bytes | None = None, method: str = "GET") -> dict:
        import urllib.request

        host = os.environ.get("STORAGE_EMULATOR_HOST")
        if not host:
            raise StandinError("stand-in: a gs:// path needs STORAGE_EMULATOR_HOST (no real bucket in tests)")
        request = urllib.request.Request(
            host.rstrip("/") + path, data=data, method=method, headers={"Content-Type": "application/octet-stream"}
        )
        with urllib.request.urlopen(request) as answer:
            body = answer.read()
        return json.loads(body) if body else {}

    def _list(self, delimiter: bool) -> dict:
        import urllib.parse

        query = urllib.parse.urlencode(
            {"prefix": f"{self.key}/" if self.key else "", **({"delimiter": "/"} if delimiter else {})}
        )
        return self._api(f"/storage/v1/b/{self.bucket}/o?{query}")

    def mkdir(self, **_) -> None:
        """Buckets have no folders: a name's prefix is its folder."""

    def write_bytes(self, data: bytes) -> None:
        import urllib.parse

        self._api(
            f"/upload/storage/v1/b/{self.bucket}/o?uploadType=media&name={urllib.parse.quote(self.key)}",
            data=data,
            method="POST",
        )

    def exists(self) -> bool:
        return bool(self._list(delimiter=False).get("items"))

    is_dir = exists

    def is_file(self) -> bool:
        import urllib.parse

        listed = self._api(f"/storage/v1/b/{self.bucket}/o?{urllib.parse.urlencode({'prefix': self.key})}")
        return any(item["name"] == self.key for item in listed.get("items", []))

    def iterdir(self):
        listed = self._list(delimiter=True)
        names = [prefix.rstrip("/") for prefix in listed.get("prefixes", [])]
        names += [item["name"] for item in listed.get("items", [])]
        return [GcsPath(f"gs://{self.bucket}/{name}") for name in names]

    def remove(self) -> None:
        import urllib.parse

        for item in self._list(delimiter=False).get("items", []):
            self._api(f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(item['name'], safe='')}", method="DELETE")


def store_path(text: str):
    """A local path, or a gs:// one."""
    return GcsPath(text) if text.startswith("gs://") else Path(text)


def remove_tree(path) -> None:
    if isinstance(path, GcsPath):
        path.remove()
    else:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- replay


def count_arg(args: dict[str, str], key: str, default: int) -> int:
    try:
        value = int(args.get(key, str(default)))
    except ValueError:
        raise StandinError(f"stand-in: {key} must be an integer, got {args[key]!r}") from None
    if value < 1:
        raise StandinError(f"stand-in: {key} must be at least 1, got {value}")
    return value


def read_log(path: Path) -> list[bytes]:
    """The fixture log as lines (split on \\n only: tqdm's \\r stays inside its line), without
    the trailing blank line and real/user/sys lines that the shell's ``time`` added."""
    lines = path.read_bytes().split(b"\n")
    while lines and (lines[-1] == b"" or TIME_TRAILER.fullmatch(lines[-1])):
        lines.pop()
    return lines


def map_step(step: int, num_batches: int) -> int:
    """Rehearsal step (1..4) -> step of a run with num_batches: round half up, at least 1."""
    return max(1, (2 * step * num_batches + REHEARSAL_STEPS) // (2 * REHEARSAL_STEPS))


def remap_steps(lines: list[bytes], num_batches: int) -> list[tuple[bytes | None, int | None]]:
    """(line or None when dropped, rehearsal train step K when the line is `Train step K`).

    Only the number in `Train step K` and `Intermediate Eval (step=K)` lines changes; a line
    whose mapped step was already shown (num_batches < 4) is dropped."""
    seen: dict[re.Pattern, set[int]] = {TRAIN_STEP: set(), EVAL_STEP: set()}
    out: list[tuple[bytes | None, int | None]] = []
    for line in lines:
        step = None
        for pattern in (TRAIN_STEP, EVAL_STEP):
            match = pattern.search(line)
            if match:
                old = int(match.group(1))
                new = map_step(old, num_batches)
                if pattern is TRAIN_STEP:
                    step = old
                if new in seen[pattern]:
                    line = None
                else:
                    seen[pattern].add(new)
                    line = line[: match.start(1)] + str(new).encode() + line[match.end(1) :]
                break
        out.append((line, step))
    return out


def scored(line: bytes, accuracy: dict) -> bytes:
    """An `Intermediate Eval (step=K)` line with the accuracy the control gives step K (its `corr` to match), so that
    a test can make a run peak where it wants; other lines, and steps it does not name, as recorded."""
    step = EVAL_STEP.search(line)
    if not step or step.group(1).decode() not in accuracy:
        return line
    percent = float(accuracy[step.group(1).decode()])

    def rewrite(found: re.Match) -> bytes:
        total = int(found.group(2))
        return b"corr=%d, total=%d, accuracy=%.1f%%" % (round(percent * total / 100), total, percent)

    return EVAL_SCORE.sub(rewrite, line, count=1)


class Replayer:
    def __init__(self, control: dict):
        self.delay = control["line_delay_s"]
        self.stream = sys.stderr.buffer
        self.first = True

    def emit(self, line: bytes) -> None:
        if not self.first and self.delay > 0:
            time.sleep(self.delay)
        self.first = False
        self.stream.write(line + b"\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        self.emit(text.encode())


def finish(module: str, control: dict) -> int:
    if control["hold_s"] > 0:
        time.sleep(control["hold_s"])
    return control["exit_code"].get(module, 0)


# ---------------------------------------------------------------- output files


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def placeholder(rel: str) -> bytes:
    name = rel.rsplit("/", 1)[-1]
    if name == "_CHECKPOINT_METADATA":
        now = time.time_ns()
        return json.dumps(
            {
                "item_handlers": None,
                "metrics": {},
                "performance_metrics": {},
                "init_timestamp_nsecs": now,
                "commit_timestamp_nsecs": now,
                "custom_metadata": {},
            }
        ).encode()
    if name == "_METADATA":
        return json.dumps(
            {"tree_metadata": {}, "use_zarr3": False, "standin": "MaxText 0.2.3 stand-in placeholder"}
        ).encode()
    return f"MaxText 0.2.3 stand-in placeholder: {rel}\n".encode()


def write_tree(root: Path, rels: list[str], entries: dict[str, bool]) -> None:
    """Write the given paths (relative to root): folders as folders, files as placeholders."""
    for rel in rels:
        target = root / rel
        if entries[rel]:
            target.mkdir(parents=True, exist_ok=True)
        else:
            write_file(target, placeholder(rel))


def output_tree(fixtures: Path) -> dict[str, bool]:
    """output-tree.txt as {relative path: is a folder} (a path is a folder when others lie under it)."""
    rels = [
        line.strip()[2:]
        for line in (fixtures / "output-tree.txt").read_text().splitlines()
        if line.strip().startswith("./")
    ]
    folders = {rel.rsplit("/", 1)[0] for rel in rels if "/" in rel}
    return {rel: rel in folders for rel in rels}


# ---------------------------------------------------------------- the three jobs


def to_maxtext(args: dict[str, str], control: dict, out: Replayer) -> None:
    base = required(args, "base_output_directory")
    model = args.get("model_name", "")
    out.say(f"stand-in to_maxtext (MaxText 0.2.3 stand-in; no fixture log exists): model_name={model}")
    out.say("stand-in to_maxtext: --lazy_load_tensors=" + args.get("lazy_load_tensors", "True"))
    if args.get("hf_access_token"):
        out.say(
            "stand-in to_maxtext: hf_access_token given on the command line "
            "(MaxText 0.2.3 logs a deprecation warning for it)"
        )
    out.say("stand-in to_maxtext: HF_TOKEN in the environment: " + ("yes" if os.environ.get("HF_TOKEN") else "no"))
    step = store_path(os.path.join(base, "0"))
    items = step / "items"
    out.say(f"stand-in to_maxtext: writing {os.path.join(base, '0', 'items')}")
    for rel in (
        "_sharding",
        "array_metadatas/process_0",
        "d/0123456789abcdef0123456789abcdef",
        "ocdbt.process_0/d/fedcba9876543210fedcba9876543210",
        "ocdbt.process_0/manifest.ocdbt",
        "manifest.ocdbt",
        "_METADATA",
        "_CHECKPOINT_METADATA",
    ):
        write_file(items / rel, placeholder(rel))
    write_file(step / "_CHECKPOINT_METADATA", placeholder("_CHECKPOINT_METADATA"))
    out.say(f"stand-in to_maxtext: wrote {os.path.join(base, '0', 'items')}")


def train_rl(args: dict[str, str], control: dict, out: Replayer) -> None:
    fixtures = fixtures_dir(control)
    base = required(args, "base_output_directory")
    run_name = args.get("run_name") or f"{args.get('model_name', 'model')}_{time.strftime('%Y-%m-%d-%H-%M')}"
    try:
        num_batches = int(args.get("num_batches", str(REHEARSAL_STEPS)))
    except ValueError:
        raise StandinError(f"stand-in: num_batches must be an integer, got {args['num_batches']!r}") from None
    if num_batches < 0:
        raise StandinError(f"stand-in: num_batches must be at least 0, got {num_batches}")
    check_load_path(args)
    if num_batches == 0:
        return evaluate_only(fixtures, out)
    run = store_path(os.path.join(base, run_name))
    if args.get("jax_cache_dir"):  # JAX's persistent cache (jax/_src/lru_cache.py): a KEY-cache file per program
        cache = Path(os.path.expanduser(args["jax_cache_dir"]))
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "jit_train_step-standin-cache").write_bytes(b"\0" * 4096)

    period = count_arg(args, "checkpoint_period", MAXTEXT_CHECKPOINT_PERIOD)
    keep = count_arg(args, "max_num_checkpoints_to_keep", MAXTEXT_CHECKPOINTS_TO_KEEP)
    tree = output_tree(fixtures)
    by_step: dict[int, list[str]] = {}
    debug: list[str] = []
    for rel, is_dir in tree.items():
        parts = rel.split("/")
        if parts[:2] == ["checkpoints", "actor"] and len(parts) > 2:
            by_step.setdefault(int(parts[2]), []).append("/".join(parts[3:]))
        elif parts[0] == "debug_rl_logs" and not is_dir:
            debug.append(rel)

    actor = run / "checkpoints" / "actor"
    # Orbax restores a finalized step: in a bucket, one that holds its commit file
    whole = [p for p in actor.iterdir() if p.name.isdigit()] if actor.is_dir() else []
    whole = [p for p in whole if not isinstance(p, GcsPath) or (p / "commit_success.txt").is_file()]
    saved = sorted(int(p.name) for p in whole)
    restored = saved[-1] if saved else 0
    if restored:  # train_rl restores the newest checkpoint and goes on after its step
        out.say(
            f"stand-in train_rl: restored checkpoint {restored} from {actor}; training resumes at step "
            f"{restored + 1} of {num_batches}"
        )
    # TensorBoard's writer opens its file at start: copy the real events file now.
    for events in sorted((fixtures / "tensorboard").iterdir()):
        write_file(run / "tensorboard" / events.name, events.read_bytes())
    (run / "debug_rl_logs").mkdir(parents=True, exist_ok=True)
    actor.mkdir(parents=True, exist_ok=True)

    def save_checkpoint(step: int) -> None:
        """Orbax-like: write <step>.orbax-checkpoint-tmp, rename it to <step>, then drop the oldest
        beyond `keep`. Its files are those of the recording's checkpoint nearest below it."""
        final = actor / str(step)
        recorded = max((k for k in by_step if map_step(k, num_batches) <= step), default=min(by_step))
        subtree = {rel: tree[f"checkpoints/actor/{recorded}/{rel}"] for rel in by_step[recorded] if rel}
        if isinstance(final, GcsPath):  # Orbax writes a bucket's step in place and its commit file last
            write_tree(
                final, list(subtree), subtree
            )  # (orbax/checkpoint/_src/path/atomicity.py, CommitFileTemporaryPath)
            (final / "commit_success.txt").write_bytes(f"Checkpoint commit was successful to {final}".encode())
        else:
            tmp = actor / f"{final.name}.orbax-checkpoint-tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            write_tree(tmp, list(subtree), subtree)
            os.rename(tmp, final)
        saved.append(step)
        while len(saved) > keep:
            remove_tree(actor / str(saved.pop(0)))

    trained = restored

    def train_through(step: int) -> None:
        """Steps up to `step` are done: Orbax saves the first step of a manager with no checkpoint,
        every `checkpoint_period`-th, and the last."""
        nonlocal trained
        for done in range(trained + 1, step + 1):
            if not saved or done % period == 0 or done == num_batches:
                save_checkpoint(done)
        trained = max(trained, step)

    per_step = -(-len(debug) // REHEARSAL_STEPS)
    for line, step in remap_steps(read_log(fixtures / "train_rl.cpu-rehearsal.log"), num_batches):
        if step is not None:
            if map_step(step, num_batches) <= restored:
                continue  # done before the restart
            chunk = debug[(step - 1) * per_step : step * per_step]
            write_tree(run, chunk, {rel: False for rel in chunk})
            train_through(map_step(step, num_batches))
        elif line is not None and (match := EVAL_STEP.search(line)) and int(match.group(1)) <= restored:
            continue
        if line is not None:
            out.emit(scored(line, control["eval_accuracy"]))
    train_through(num_batches)  # a log without the step lines still trains every step
    write_tree(run, debug, {rel: False for rel in debug})


#: How MaxText 0.2.3's train_rl ends with num_batches=0, after its evaluation before training (seen in the real-MaxText
#: tier): tunix's RLLearner.train takes the first batch of an empty dataset.
EMPTY_TRAINING = """Traceback (most recent call last):
  File "/maxtext/trainers/post_train/rl/train_rl.py", line 731, in _rl_train_impl
    rl_trainer.train(train_dataset)
  File "/tunix/rl/rl_learner.py", line 529, in train
    first_item = next(full_batch_iterator)
StopIteration"""


def evaluate_only(fixtures: Path, out: Replayer) -> None:
    """train_rl of no batches: the recording up to the training's start (the evaluation before training among it),
    then the real one's StopIteration; it writes no checkpoint."""
    for line in read_log(fixtures / "train_rl.cpu-rehearsal.log"):
        out.emit(line)
        if b"Starting RL training..." in line:
            break
    raise StandinError(EMPTY_TRAINING)


def to_huggingface(args: dict[str, str], control: dict, out: Replayer) -> None:
    fixtures = fixtures_dir(control)
    required(args, "load_parameters_path")
    base = required(args, "base_output_directory")
    check_load_path(args)
    export = fixtures / "hf-export"
    names = sorted(p.name for p in export.iterdir() if p.is_file())
    tokenizer = [n for n in names if n not in ("config.json",) and not n.endswith(".safetensors")]
    triggers = {
        b"Tokenizer files saved locally": tokenizer,
        b"Saved config.json": ["config.json"],
        b"Saved model.safetensors": [n for n in names if n.endswith(".safetensors")],
    }
    done: set[str] = set()

    def copy(batch: list[str]) -> None:
        for name in batch:
            if name not in done:
                write_file(Path(os.path.join(base, name)), (export / name).read_bytes())
                done.add(name)

    for line in read_log(fixtures / "to_huggingface.cpu-rehearsal.log"):
        for marker, batch in triggers.items():
            if marker in line:
                copy(batch)
        out.emit(line)
    copy(names)


JOBS = {"to_maxtext": to_maxtext, "train_rl": train_rl, "to_huggingface": to_huggingface}
#: The tables of MaxText 0.2.3 a model_name must be in, per module (tests/data/maxtext-0.2.3-models.json, read from
#: the wheel): its config type (ModelName), what every RL run reads (HF_MODEL_CONFIGS), the conversions' tables.
MODEL_TABLES = {
    "to_maxtext": ("ModelName", "HF_IDS"),
    "train_rl": ("ModelName", "HF_MODEL_CONFIGS"),
    "to_huggingface": ("ModelName", "HF_IDS", "PARAM_MAPPING", "HF_SHAPE", "HOOK_FNS"),
}


def models_file(fixtures: Path) -> Path:
    """What MaxText 0.2.3 knows of models: beside the fixtures, as in tests/data (the test hosts copy it there)."""
    return fixtures.parent / "maxtext-0.2.3-models.json"


def check_model(short: str, args: dict[str, str], control: dict) -> None:
    """A model_name MaxText 0.2.3 would refuse is refused, as its config's validation or the conversion's lookup."""
    name = args.get("model_name", "default")
    known = json.loads(models_file(fixtures_dir(control)).read_text())
    for table in MODEL_TABLES[short]:
        entry = known[table]
        names = entry.get("names") or list(entry.get("ids", {}))
        if name not in names:
            raise StandinError(f"stand-in: model_name={name} is not in MaxText 0.2.3's {table} ({entry['path']})")


def main(module: str) -> int:
    """Run the stand-in of ``module`` (its dotted name); returns the exit code."""
    record(module)
    note_sigterm(module)
    short = module.rsplit(".", 1)[-1]
    try:
        control = load_control()
        out = Replayer(control)
        args = parse_args(sys.argv[1:])
        check_model(short, args, control)
        JOBS[short](args, control, out)
    except StandinError as exc:
        print(exc, file=sys.stderr, flush=True)
        return exc.code
    return finish(short, control)

"""The command line is safe to try: `-h` is help on every task, a short flag means one thing
everywhere, outputs never overwrite or escape, and every bad input is one line, exit code 2,
with nothing created or changed in the project, on the laptop or on a host.

Every test runs real `invoke` processes, as a user would."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import FIXTURES, ROOT, TEST_TOKEN, fix_commands, invoke, unpasteable

TASKS = (
    "plan",
    "settings",
    "up",
    "provision",
    "freeze",
    "convert",
    "train",
    "export",
    "pipeline",
    "logs",
    "status",
    "runs",
    "cancel",
    "fetch",
    "publish",
    "metrics",
    "tensorboard",
    "timeline",
    "image",
    "down",
)
#: Invoke's core short flags: no task may take one of them.
CORE_SHORT = set("cdDefFhlprRTVw")


class Listener:
    """A TCP port that counts the connections made to it: a host flag pointing here proves that a
    command never connected to its host."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        self.socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self):
        self._stop.set()
        self._thread.join()
        self.socket.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def help_of(task: str) -> str:
    result = invoke("--help", task, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_dash_h_is_help_on_every_task_and_connects_nowhere(stack_dir, listener):
    host = f"nobody@127.0.0.1:{listener.port}"
    for task in TASKS:
        result = (
            invoke(task, "--host", host, "-h", cwd=stack_dir)
            if "--host" in help_of(task)
            else invoke(task, "-h", cwd=stack_dir)
        )
        assert result.returncode == 0, (task, result.stderr)
        assert result.stdout.startswith(f"Usage: inv[oke] [--core-opts] {task} [--options]"), task
    assert listener.accepted == 0


def short_flags() -> dict[str, dict[str, str]]:
    """task -> short flag -> its long flag, from each task's --help."""
    found = {}
    for task in TASKS:
        pairs = re.findall(r"^\s+-(\w)(?: \S+)?, --([\w-]+)", help_of(task), re.MULTILINE)
        found[task] = dict(pairs)
    return found


def test_a_short_flag_means_one_thing_in_every_task():
    meanings: dict[str, set[str]] = {}
    for task, flags in short_flags().items():
        assert not CORE_SHORT & set(flags), (task, flags)
        for short, long in flags.items():
            meanings.setdefault(short, set()).add(long)
    assert meanings, "no short flags found at all"
    assert all(len(longs) == 1 for longs in meanings.values()), meanings
    assert meanings["s"] == {"stack"} and meanings["j"] == {"json"}


@pytest.mark.parametrize(
    "task, flag, placeholder",
    [
        ("provision", "--host", "USER@ADDRESS[:PORT]"),
        ("provision", "--var", "KEY=VALUE"),
        ("provision", "--tags", "TAG[,TAG]"),
        ("pipeline", "--set", "KEY=VALUE"),
        ("train", "--set", "KEY=VALUE"),
        ("fetch", "--host", "USER@ADDRESS[:PORT]"),
    ],
)
def test_repeatable_flags_show_their_value_in_help(task, flag, placeholder):
    line = next(line for line in help_of(task).splitlines() if line.strip().startswith(flag + " "))
    assert f"{placeholder}, repeatable" in line


# ---------------------------------------------------------------- outputs never overwrite or escape


def write_events(folder: Path, damage: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (source,) = (FIXTURES / "tensorboard").glob("events.out.tfevents.*")
    data = bytearray(source.read_bytes())
    if damage == "truncated":
        data = data[:-7]
    elif damage == "corrupt":
        data[len(data) // 2] ^= 0xFF
    target = folder / source.name
    target.write_bytes(bytes(data))
    return target


def test_metrics_writes_its_plot_only_where_it_may(stack_dir):
    events = stack_dir / "events"
    write_events(events)
    ours = stack_dir / "plot.png"
    first = invoke("metrics", "--events", str(events), "--out", str(ours), cwd=stack_dir)
    assert first.returncode == 0, first.stderr
    again = invoke("metrics", "--events", str(events), "--out", str(ours), cwd=stack_dir)
    assert again.returncode == 0, again.stderr  # a plot of ours is replaced
    foreign = stack_dir / "photo.png"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\n someone else's picture")
    refused = invoke("metrics", "--events", str(events), "--out", str(foreign), cwd=stack_dir)
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: --out '{foreign}' exists and is not a plot that tpu-grpo wrote; "
        "fix: another --out, or --force to overwrite it\n"
    )
    assert foreign.read_bytes() == b"\x89PNG\r\n\x1a\n someone else's picture"
    forced = invoke("metrics", "--events", str(events), "--out", str(foreign), "--force", cwd=stack_dir)
    assert forced.returncode == 0, forced.stderr
    assert foreign.read_bytes().startswith(b"\x89PNG") and len(foreign.read_bytes()) > 10_000


def test_metrics_run_name_cannot_lead_the_plot_out_of_the_project(stack_dir, tmp_path):
    events = stack_dir / "events"
    write_events(events)
    state = tmp_path / "deep" / "a" / "b"
    result = invoke(
        "metrics", "--events", str(events), "--run", "../../../x", cwd=stack_dir, env={"TPU_GRPO_STATE": str(state)}
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: --run '../../../x' is not a name")
    assert not state.exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("damage, problem", [("truncated", "is cut short at byte"), ("corrupt", "is damaged at byte")])
def test_metrics_refuses_damaged_events_naming_the_file(stack_dir, damage, problem):
    path = write_events(stack_dir / "events", damage)
    out = stack_dir / "m.png"
    result = invoke("metrics", "--events", str(path.parent), "--out", str(out), cwd=stack_dir)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {path} {problem}")
    assert len(result.stderr.splitlines()) == 1
    assert not out.exists()


# ---------------------------------------------------------------- flags that parse as the user meant


def test_a_set_value_may_hold_colons(stack_dir):
    result = invoke(
        "pipeline",
        "--dry-run",
        "--run-name",
        "r1",
        "--set",
        "train:hf_train_files=gs://bucket/x",
        "--set",
        "export:weight_dtype=float32",
        cwd=stack_dir,
    )
    assert result.returncode == 0, result.stderr
    train = result.stdout.split("# tpu-grpo train")[1].split("# tpu-grpo export")[0]
    assert "    hf_train_files=gs://bucket/x" in train
    assert "weight_dtype=float32" in result.stdout.split("# tpu-grpo export")[1]


def test_pipeline_dry_run_json_is_json(stack_dir):
    result = invoke("pipeline", "--dry-run", "--json", "--run-name", "r1", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["run"] == "r1"
    assert [step["step"] for step in plan["steps"]] == ["convert", "train", "export", "save"]
    assert "python3 - maxtext.trainers.post_train.rl.train_rl" in plan["steps"][1]["script"]


def test_plan_lists_resources_in_the_same_order_every_time(stack_dir):
    orders = []
    for _ in range(3):
        result = invoke("plan", "--json", cwd=stack_dir)
        assert result.returncode == 0, result.stderr
        orders.append([(r["type"], r["name"]) for r in json.loads(result.stdout)["resources"]])
    assert orders[0] == orders[1] == orders[2] == sorted(orders[0])


def test_settings_validates_and_shows_whole_key_names(stack_dir):
    result = invoke("settings", cwd=stack_dir, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    for name in ("tpu-grpo:allowSshFromAnywhere", "tpu-grpo:sshPublicKeyPath", "tpu-grpo:lazyLoadTensors"):
        assert name in result.stdout
    path = stack_dir / "Pulumi.dev.yaml"
    path.write_text(path.read_text() + "  tpu-grpo:machinetype: ct6e-standard-4t\n")
    typo = invoke("settings", cwd=stack_dir)
    assert typo.returncode == 2
    assert (
        "tpu-grpo:machinetype='ct6e-standard-4t' is not a setting of this project; fix: did you mean "
        "machineType?" in typo.stderr
    )


def test_identity_without_host_serves_the_stacks_vm(stack_dir, key_pair, tmp_path, monkeypatch):
    """`--identity` was silently ignored without `--host`; now it is the key for the stack's VM."""
    from tpu_grpo.host import hosts

    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "203.0.113.9", "ssh_user": "ubuntu"})
    for name, value in cli.on_path().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(stack_dir)
    other_key = tmp_path / "other_key"
    other_key.write_text("not read here")
    [host] = hosts.check_flags([], str(other_key), None).hosts()
    assert (host.address, host.identity) == ("203.0.113.9", other_key)
    [default] = hosts.check_flags([], None, None).hosts()
    assert default.identity == key_pair[0]  # the private half of sshPublicKeyPath
    with pytest.raises(hosts.HostError, match="--identity '/nope' is not a file"):
        hosts.check_flags([], "/nope", None)


def test_fetch_that_cannot_connect_leaves_no_folder(stack_dir, listener):
    listener.close()  # nothing listens there now
    result = invoke(
        "fetch",
        "--host",
        f"nobody@127.0.0.1:{listener.port}",
        cwd=stack_dir,
        env={"TPU_GRPO_STATE": str(stack_dir / "state")},
    )
    assert result.returncode == 1  # a failure to reach the host, not bad input
    assert "cannot connect" in result.stderr
    assert not (stack_dir / "models").exists()


# ---------------------------------------------------------------- every bad input: one line, exit 2, no effect

BAD_SETTINGS = [  # (key, value) written into a stack file of its own; the message names the key
    ("gcp:zone", "us-east5"),
    ("gcp:zone", "us-east5-b1"),
    ("gcp:zone", "us-east5-b\n"),
    ("gcp:project", "My_Project"),
    ("tpu-grpo:reservation", "My Reservation"),
    ("tpu-grpo:vmName", "-tpu"),
    ("tpu-grpo:machineType", "ct5lp-hightpu-8t"),
    ("tpu-grpo:bootDiskGb", "100"),
    ("tpu-grpo:bootDiskGb", "big"),
    ("tpu-grpo:dataDiskGb", "50"),
    ("tpu-grpo:sshSourceRanges", ["0.0.0.0/0"]),
    ("tpu-grpo:sshSourceRanges", ["::/0"]),
    ("tpu-grpo:sshSourceRanges", ["10.0.0.300/32"]),
    ("tpu-grpo:sshSourceRanges", []),
    ("tpu-grpo:sshUser", "Root User"),
    ("tpu-grpo:labels", {"Team": "ML"}),
    ("tpu-grpo:model", "llama2-7b"),
    ("tpu-grpo:exportModel", "gpt2"),
    ("tpu-grpo:batches", "0"),
    ("tpu-grpo:batches", "abc"),
    ("tpu-grpo:testBatches", "0"),
    ("tpu-grpo:usePathways", "maybe"),
    ("tpu-grpo:lazyLoadTensors", "2"),
    ("tpu-grpo:machinetype", "ct6e-standard-8t"),
    ("tpu-grpo:serviceAccount", "not-an-email"),
    ("tpu-grpo:subnetwork", "sub"),
    ("tpu-grpo:allowSshFromAnywhere", "sometimes"),
    # a value of the wrong YAML type; the Pulumi CLI's text for a boolean is true or false only
    ("tpu-grpo:slice", ["v6e-16"]),
    ("tpu-grpo:labels", ["team"]),
    ("tpu-grpo:usePathways", "no"),
    ("tpu-grpo:bucket", "yes"),
    # what Cloud Storage refuses, or a folder that is not the one it names
    ("tpu-grpo:checkpointStore", "gs://my-bucket/../other"),
    ("tpu-grpo:checkpointStore", "gs://my-bucket/./x"),
    ("tpu-grpo:checkpointStore", "gs://goog-bucket"),
    ("tpu-grpo:checkpointStore", "gs://192.168.5.4"),
    ("tpu-grpo:checkpointStore", "gs://my-google-runs"),
    ("tpu-grpo:maxRunHours", "1e3"),
    ("tpu-grpo:idleStopMinutes", "٣"),
    # a Hub dataset is OWNER/NAME, as the tokenizer is
    ("tpu-grpo:dataset", "gsm8k"),
    ("tpu-grpo:dataset", "openai/gsm8k/main"),
    ("tpu-grpo:tokenizer", "Llama-3.1-8B"),
]
#: Stack files that are not what a stack file is, as a user may write them: (name, bytes, what the line names).
RAW_STACK_FILES = [
    ("list", b"- a\n", "Pulumi.list.yaml"),
    ("scalar", b"hello\n", "Pulumi.scalar.yaml"),
    ("number-key", b"config:\n  123: x\n", "'123'"),
    ("null-key", b"config:\n  ~: x\n", "'~'"),
    ("bare-key", b"config:\n  zone: us-east5-b\n", "'zone'"),
    ("latin1", b"config:\n  gcp:zone: us-east5-b # caf\xe9\n", "UTF-8"),
    ("twice", b"config:\n  gcp:zone: us-east5-b\n  gcp:zone: us-east5-a\n", "twice"),
    ("unquoted-no", b"tpu-grpo:usePathways: no", "usePathways"),  # the key alone: with the valid rest
    ("unquoted-list", b"tpu-grpo:slice: [v6e-16]", "slice"),
]
SETTINGS_TASKS = ("settings", "up", "plan", "pipeline --dry-run", "provision", "down")


def bad_inputs(port: int) -> list[tuple[tuple[str, ...], str]]:
    """(argv, what the one line must name); --host points at the listener."""
    host = ("--host", f"nobody@127.0.0.1:{port}")
    cases = [
        (("plan", "--stack", "nope"), "'nope'"),
        (("fetch", "--stack", "nope", *host), "Pulumi.nope.yaml"),  # a stack named beside --host must exist
        (("settings", "-s", "../x"), "'../x'"),
        (("up", "--stack", "prod"), "Pulumi.prod.yaml"),
        (("settings", "--stack", "broken"), "Pulumi.broken.yaml"),
        (("train", "-b", "0", *host), "'0'"),
        (("train", "--batches", "abc", *host), "'abc'"),
        (("train", "--batches", "-1"), "'-1'"),
        (("train", "--batches", "1.5"), "'1.5'"),
        (("train", "--run-name", "a b", *host), "'a b'"),
        (("train", "--run-name", "x.partial", *host), "'x.partial'"),
        (("train", "--run-name", "", *host), "''"),
        (("train", "--run-name", "../x"), "'../x'"),
        (("train", "--set", "novalue", *host), "'novalue'"),
        (("train", "--set", "convert:x=1", *host), "'convert:x=1'"),
        (("train", "--set", "num_batches=3"), "'num_batches=3'"),
        (("train", "--set", "deploy:x=1"), "'deploy:x=1'"),
        (("train", "--set", "rl.num_iterations=inf", *host), "'rl.num_iterations=inf'"),
        (("convert", "--set", "train:x=1", *host), "'train:x=1'"),
        (("export", "--step", "0", *host), "'0'"),
        (("export", "--step", "abc"), "'abc'"),
        (("export", "--set", "train:x=1", *host), "'train:x=1'"),
        (("pipeline", "--need-gb", "nan,inf", *host), "'nan,inf'"),
        (("pipeline", "--need-gb", "120"), "'120'"),
        (("pipeline", "--need-gb", "-1,2", *host), "'-1,2'"),
        (("pipeline", "--set", "train:rl.num_iterations=abc", *host), "'train:rl.num_iterations=abc'"),
        (("pipeline", "--set", "bad key=1", *host), "'bad key=1'"),
        (("pipeline", "--host", "nobody"), "'nobody'"),
        (("pipeline", "--host", "u@h:99999"), "'u@h:99999'"),
        (("pipeline", "--wait", "abc", *host), "'abc'"),
        (("pipeline", "--wait", "-5", *host), "'-5'"),
        (("pipeline", "--identity", "/nope", *host), "'/nope'"),
        (("pipeline", "--recover", "-1", *host), "'-1'"),
        (("pipeline", "--recover", "x", *host), "'x'"),
        (("pipeline", "--var", "uv_source=pip", *host), "'uv_source=pip'"),
        (("pipeline", "--recover", "1", "--var", "nope=1", *host), "nope"),
        (("pipeline", "--recover", "1", *host), "--recover 1"),
        (("tensorboard", "--port", "0", *host), "'0'"),
        (("tensorboard", "--every", "x", *host), "'x'"),
        (("tensorboard", "--run", "a b", *host), "'a b'"),
        (("publish", "--repo", "a/b/c", *host), "'a/b/c'"),
        (("publish", "--repo", "a/b", "--run", "a b", *host), "'a b'"),
        (("provision", "--var", "nope=1", *host), "'nope=1'"),
        (("provision", "--var", "apt_upgrade=maybe", *host), "'maybe'"),
        (("provision", "--var", "python_version", *host), "'python_version'"),
        (("provision", "--tags", ",", *host), "','"),
        (("provision", "--tags", "nosuch", *host), "'nosuch'"),
        (("provision", "--playbook", "/nope.yml", *host), "/nope.yml"),
        (("provision", "--locked", "--lock", "/nope.lock", *host), "/nope.lock"),
        (("provision", "--identity", "/nope"), "'/nope'"),
        (("freeze", "--var", "x=1", *host), "'x=1'"),
        (("logs", "--wait", "x", *host), "'x'"),
        (("status", "--host", "a b"), "'a b'"),
        (("cancel", "--identity", "/nope", *host), "'/nope'"),
        (("fetch", "--run", "../x", *host), "'../x'"),
        (("fetch", "--run", "x.partial", *host), "'x.partial'"),
        (("fetch", "--to", "/proc/x", *host), "'/proc/x'"),
        (("fetch", "--to", "Pulumi.yaml/x", *host), "'Pulumi.yaml/x'"),
        (("metrics", "--run", "../../x", "--events", "events"), "'../../x'"),
        (("metrics", "--out", "Pulumi.yaml", "--events", "events"), "'Pulumi.yaml'"),
        (("metrics", "--out", "photo.png", "--events", "events"), "'photo.png'"),
        (("metrics", "--out", "/proc/nope/x.png", "--events", "events"), "'/proc/nope/x.png'"),
        (("metrics", "--events", "/nope"), "'/nope'"),
        (("metrics", "--events", "damaged"), "damaged/events."),
        (("metrics", "--log", "train.log", *host), "'train.log'"),  # a host's run brings its own log
        (("metrics", "--events", "events", "--log", "/nope.log"), "'/nope.log'"),
        (("down", "--identity", "/nope"), "'/nope'"),
        (("down", "--wait", "z", *host), "'z'"),
        (("up", "provision", "pipeline", "--batches", "0"), "'0'"),
        (("plan", "pipeline", "--set", "deploy:x=1"), "'deploy:x=1'"),
        (("provision", *host, "train", "--run-name", "x.partial"), "'x.partial'"),
        # stack names as Pulumi takes them; numbers in ASCII digits, bounded where they mean something
        (("settings", "--stack", ""), "''"),
        (("plan", "--stack", "../../etc/passwd"), "'../../etc/passwd'"),
        (("settings", "--stack", "ünï"), "'ünï'"),
        (("tensorboard", "--port", "²", *host), "'²'"),
        (("tensorboard", "--port", "٣", *host), "'٣'"),
        (("train", "--dry-run", "--set", "rl.num_iterations=²"), "'rl.num_iterations=²'"),
        (("train", "--dry-run", "--set", "rl.num_iterations=٣"), "'rl.num_iterations=٣'"),
        (("train", "--batches", "99999999999999999999", *host), "'99999999999999999999'"),
        (("pipeline", "--batches", "٣", *host), "'٣'"),
        (("export", "--step", "100001", *host), "'100001'"),
        (("pipeline", "--recover", "1000", *host), "'1000'"),
        (("fetch", "--to", "", *host), "--to ''"),
        (("provision", "--var", "idle_stop_minutes=-3", *host), "is negative"),
        (("provision", "--var", "idle_stop_minutes=٣", *host), "'٣'"),
        (("timeline", "--wait", "-5", *host), "is negative"),
        # issue 50: each kind of value by its one parser (values.py), before anything connects or is written
        (("status", "--host", "u@10.0.0..5"), "'u@10.0.0..5'"),
        (("runs", "--host", "u@10.0.0..5"), "'u@10.0.0..5'"),
        (("status", "--host", "u@.a"), "'u@.a'"),
        (("status", "--host", f"u@{'a' * 64}.com"), "a" * 64),
        (("fetch", "--to", "x" * 300, *host), "255"),
        (("metrics", "--events", "events", "--out", "x" * 300 + ".png"), "255"),
        (("metrics", "--events", "x" * 300), "255"),
        (("status", "--identity", "x" * 300, *host), "255"),
        (("provision", "--playbook", "latin1.yml", *host), "not UTF-8"),
        (("provision", "--locked", "--lock", "latin1.lock", *host), "not UTF-8"),
        (("provision", "--tags", "token", *host), "not UTF-8"),  # HF_TOKEN_PATH names latin1.token
        (("train", "--set", "num_test_batches=5", *host), "tpu-grpo:testBatches"),
        (("train", "--set", "chips_per_vm=4", *host), "chips_per_vm"),
        (("train", "--set", "eval_dataset_name=x", *host), "eval_dataset_name"),
        (("train", "--set", "learning_rate=", *host), "'learning_rate='"),
        (("train", "--set", "a.=1"), "'a.=1'"),
        (("train", "--set", "a..b=1", *host), "'a..b=1'"),
        (("train", "--set", "rl.num_iterations=1000000", *host), "from 1 to 999999"),
        (("tensorboard", "--every", "٣", *host), "'٣'"),
        (("tensorboard", "--every", "1_0", *host), "'1_0'"),
        (("pipeline", "--need-gb", "1_2,3", *host), "'1_2,3'"),
        (("pipeline", "--need-gb", "١,٢", *host), "'١,٢'"),
        (("cancel", "--job", "", *host), "--job ''"),
        (("logs", "--job", "../../etc/passwd", *host), "'../../etc/passwd'"),
        (("runs", "--host", "u@a", "--host", "u@b"), "one host"),
        (("metrics", "--events", "events", "--out", "dangling.png"), "'dangling.png'"),
        (("freeze", "--lock", "events", *host), "'events'"),
        (("freeze", "--lock", "Pulumi.yaml/x", *host), "Pulumi.yaml"),
        (("fetch", "--to", " ", *host), "--to ' '"),
        (("metrics", "--compare", "a", "--compare", "a", *host), "twice"),
        (("settings", "--stack", "nonexist"), "--stack='nonexist'"),
        # Invoke's own parse errors, in the project's words and exit code
        (("train", "--bogus"), "--bogus"),
        (("train", "-x"), "-x"),
        (("train", "--batches"), "--batches"),
        (("nosuchtask",), "'nosuchtask'"),
        (("train", "--batches", "3", "--batches", "4"), "'4'"),
        # refusals that must come first: no Pulumi CLI here (down), a slice takes no --recover
        (("down", *host), "pulumi"),
        (("pipeline", "--recover", "1", "--dry-run", "--stack", "slice"), "--recover"),
    ]
    for name, _, named in RAW_STACK_FILES:
        cases.append((("settings", "--stack", name), named))
    for number, (key, _) in enumerate(BAD_SETTINGS):
        task = SETTINGS_TASKS[number % len(SETTINGS_TASKS)].split()
        cases.append(((*task, "--stack", f"bad{number}"), key.split(":")[1]))
    return cases


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.lstat().st_size, path.lstat().st_mtime_ns) for path in folder.rglob("*")
    }


def test_every_bad_input_is_one_line_exit_2_and_changes_nothing(stack_dir, stack_values, listener, tmp_path):
    for number, (key, value) in enumerate(BAD_SETTINGS):
        (stack_dir / f"Pulumi.bad{number}.yaml").write_text(yaml.safe_dump({"config": {**stack_values, key: value}}))
    (stack_dir / "Pulumi.broken.yaml").write_text("config:\n  gcp:zone: [unclosed\n")
    for name, data, _ in RAW_STACK_FILES:
        if not data.startswith((b"config:", b"- ", b"hello")):  # one setting, written as is beside the valid rest
            key = data.decode().split(": ")[0]
            rest = yaml.safe_dump({"config": {k: v for k, v in stack_values.items() if k != key}})
            data = rest.encode() + b"  " + data + b"\n"
        (stack_dir / f"Pulumi.{name}.yaml").write_bytes(data)
    (stack_dir / "Pulumi.slice.yaml").write_text(
        yaml.safe_dump(
            {
                "config": {
                    **stack_values,
                    "tpu-grpo:slice": "v6e-16",
                    "tpu-grpo:usePathways": "true",
                    "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
                }
            }
        )
    )
    write_events(stack_dir / "events")
    write_events(stack_dir / "damaged", "corrupt")
    for name in ("latin1.yml", "latin1.lock", "latin1.token"):
        (stack_dir / name).write_bytes("café".encode("latin-1"))
    (stack_dir / "dangling.png").symlink_to(tmp_path / "nowhere.png")
    (stack_dir / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n someone else's picture")
    state = tmp_path / "state"
    checkout = {path: path.stat().st_mtime_ns for path in ROOT.iterdir() if path.is_file()}
    before = tree(stack_dir)
    cases = bad_inputs(listener.port)
    assert len(cases) >= 135

    def run(case):
        argv, named = case
        return case, invoke(
            *argv,
            cwd=stack_dir,
            env={
                "TPU_GRPO_STATE": str(state),
                "HF_TOKEN": "" if "token" in argv else TEST_TOKEN,
                "HF_TOKEN_PATH": "latin1.token",
            },
        )

    results = [run(case) for case in cases]
    failures = []
    for (argv, named), result in results:
        lines = result.stderr.splitlines()
        if not (
            result.returncode == 2
            and len(lines) == 1
            and lines[0].startswith("error: ")
            and named in lines[0]
            and "fix" in lines[0]
            and result.stdout == ""
            and "Traceback" not in result.stderr
        ):
            failures.append((argv, result.returncode, result.stdout[-300:], result.stderr[-500:]))
    assert failures == [], "\n".join(map(str, failures))
    # each command a fix gives runs as pasted (tests/unit/test_fix_lines.py mends the settings' by running them)
    fixes = {command for _, result in results for command in fix_commands(result.stderr.split("; fix: ", 1)[-1])}
    unread = {command: why for command in fixes if (why := unpasteable(command, stack_dir))}
    assert len(fixes) > 20 and not unread, "\n".join(f"{command!r}: {why}" for command, why in unread.items())
    assert listener.accepted == 0
    assert tree(stack_dir) == before
    assert not state.exists()
    assert {path: path.stat().st_mtime_ns for path in ROOT.iterdir() if path.is_file()} == checkout


def test_events_with_no_maxtext_scalar_are_said_not_plotted(stack_dir, tmp_path):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = tmp_path / "other-events"
    writer = EventFileWriter(str(folder))
    writer.add_event(
        event_pb2.Event(
            step=1,
            wall_time=1.0,
            summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="someone/else", simple_value=1.0)]),
        )
    )
    writer.close()
    out = tmp_path / "m.png"
    result = invoke("metrics", "--events", str(folder), "--out", str(out), cwd=stack_dir)
    assert result.returncode == 2 and result.stdout == "" and not out.exists()
    assert result.stderr.startswith(f"error: --events '{folder}' holds no MaxText scalar (none of ")
    assert len(result.stderr.splitlines()) == 1 and "fix: " in result.stderr


@pytest.mark.parametrize(
    "args", ["pipeline --dry-run --run-name r1 --batches 3", "--list", "--help train", "train -h", "settings", "plan"]
)
def test_output_cut_short_by_its_reader_ends_quietly(stack_dir, args):
    """`invoke pipeline --dry-run | head -1`: the reader goes away (here before the first line); no
    BrokenPipeError, 128 + SIGPIPE: from a task's print or its rich table, and from Invoke's own listing and help."""
    command = f"{sys.executable} -m invoke -r {ROOT} {args} | true; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", command], cwd=stack_dir, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "141" and result.stderr == ""


def test_settings_shows_what_an_unset_setting_comes_to_and_whence(stack_dir, stack_values):
    values = {k: v for k, v in stack_values.items() if k != "tpu-grpo:reservation"}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": {**values, "tpu-grpo:capacity": "spot"}}))
    result = invoke("settings", cwd=stack_dir, env={"COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stdout.splitlines()
        if line.startswith("│ ") and line.split("│")[1].strip()
    }
    assert rows["tpu-grpo:idleStopMinutes"] == "60 (capacity spot's default)"
    assert rows["tpu-grpo:checkpointStore"] == "disk (capacity spot's default)"
    assert rows["tpu-grpo:checkpointPeriod"] == "10 (tpu-grpo's default: every checkpoint scored)"
    assert rows["tpu-grpo:checkpointsToKeep"] == "2 (tpu-grpo's default: every checkpoint scored)"
    assert rows["tpu-grpo:bootDiskGb"] == "200 (the tutorial's)"
    assert rows["gcp:zone"] == "us-east5-b"  # set: shown as written
    assert rows["tpu-grpo:reservation"] == "(unset)"


def test_a_public_key_path_naming_a_folder_says_so(stack_dir, stack_values, tmp_path):
    (stack_dir / "Pulumi.dev.yaml").write_text(
        yaml.safe_dump({"config": {**stack_values, "tpu-grpo:sshPublicKeyPath": str(tmp_path)}})
    )
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and result.stderr == (
        f"error: tpu-grpo:sshPublicKeyPath={str(tmp_path)!r} is a folder, not a file; fix: pulumi config "
        f"set tpu-grpo:sshPublicKeyPath {tmp_path}/id_ed25519.pub\n"
    )


def test_a_host_that_answers_tcp_but_not_ssh_is_one_line_without_paramikos_tracebacks(stack_dir):
    """paramiko logs the failed handshake with its traceback; tpu-grpo says it once, in one line."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held = []

    def hold():  # accept, say a line that is no SSH banner, then close
        connection, _ = server.accept()
        held.append(connection)
        connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        result = invoke(
            "status",
            "--host",
            f"nobody@127.0.0.1:{port}",
            cwd=stack_dir,
            env={"TPU_GRPO_STATE": str(stack_dir / "state")},
        )
    finally:
        thread.join(timeout=5)
        server.close()
    assert result.returncode == 1, result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr and "paramiko" not in result.stderr


def test_the_command_that_forgets_a_host_key_works_pasted_into_a_shell(tmp_path, monkeypatch):
    """What a changed host key's error says to run forgets that key even when the project's folder holds a space."""
    from tpu_grpo.host import hosts

    state = tmp_path / "my project" / ".tpu-grpo"
    state.mkdir(parents=True)
    monkeypatch.setenv("TPU_GRPO_STATE", str(state))
    host = hosts.Host("tpu", "203.0.113.7", 2222)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2"
    (state / "known_hosts").write_text(f"{host.known_hosts_name} {key}\nother.example {key}\n")
    done = subprocess.run(["bash", "-c", hosts.forget_key_command(host)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (state / "known_hosts").read_text() == f"other.example {key}\n"


@pytest.mark.parametrize(
    "later, slice_stack, message",
    [
        (
            ("status", "--host", "a@192.0.2.1", "--host", "b@192.0.2.2"),
            False,
            "error: this task acts on one host, got 2 (a@192.0.2.1, b@192.0.2.2); fix: pass one --host",
        ),
        (
            ("ssh", "--host", "a@192.0.2.1", "--command", ""),
            False,
            "error: --command '' is empty; fix: e.g. --command 'df -h ~/tpu-grpo', or no --command for a shell",
        ),
        (
            ("timeline",),
            True,
            "error: stack 'dev' is slice v6e-16 on GKE, which has no VM to log into; fix: run this "
            "task on a one-VM stack (docs/slices.md)",
        ),
    ],
)
def test_a_later_task_refused_by_its_flags_stops_the_chain_before_the_first_acts(
    stack_dir, stack_values, later, slice_stack, message
):
    """The whole command line is checked first: a task after `metrics` that cannot run (two hosts where one is
    needed; an empty command; a VM's task on a slice's stack) ends the chain before the plot is written."""
    if slice_stack:
        (stack_dir / "Pulumi.dev.yaml").write_text(
            yaml.safe_dump(
                {
                    "config": {
                        **stack_values,
                        "tpu-grpo:slice": "v6e-16",
                        "tpu-grpo:usePathways": "true",
                        "tpu-grpo:checkpointStore": "gs://grpo-runs/runs",
                    }
                }
            )
        )
    events = stack_dir / "events"
    write_events(events)
    plot = stack_dir / "plot.png"
    result = invoke("metrics", "--events", str(events), "--out", str(plot), *later, cwd=stack_dir)
    assert result.returncode == 2 and result.stderr.strip() == message
    assert not plot.exists()


@pytest.mark.parametrize("name", ["[/x].png", "[bold]b[/bold].png"])
def test_what_a_user_wrote_is_printed_as_written_never_as_markup(stack_dir, name):
    write_events(stack_dir / "events")
    result = invoke("metrics", "--events", "events", "--out", name, cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    assert f"plot: {name}" in result.stdout  # rich read `[/x]` as a closing tag (a traceback) and ate `[bold]`
    assert (stack_dir / name).is_file()


def test_a_narrow_terminal_still_shows_every_cell(stack_dir):
    write_events(stack_dir / "events")
    result = invoke("metrics", "--events", "events", "--out", "m.png", cwd=stack_dir, env={"COLUMNS": "10"})
    assert result.returncode == 0, result.stderr
    assert "reward" in result.stdout and "plot: m.png" in result.stdout  # COLUMNS=10 printed every cell empty


@pytest.mark.parametrize("state", ["a-file", "unwritable"])
def test_a_state_folder_that_cannot_be_written_is_one_line_before_anything(stack_dir, state):
    write_events(stack_dir / "events")
    folder = stack_dir / "state" if state == "a-file" else Path("/proc/1/tpu-grpo")  # root may not write in /proc
    if state == "a-file":
        folder.write_text("not a folder")
    result = invoke("metrics", "--events", "events", cwd=stack_dir, env={"TPU_GRPO_STATE": str(folder)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: TPU_GRPO_STATE='{folder}' ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_a_damaged_record_is_read_as_none_and_records_are_written_whole(tmp_path):
    from tpu_grpo.config import laptop_paths
    from tpu_grpo.results import runs

    record = laptop_paths.fetched_record("empty", tmp_path)
    record.parent.mkdir(parents=True)
    record.write_text("")  # a fetch stopped while it wrote the record, before records were written whole
    laptop_paths.fetched_record("list", tmp_path).write_text("[1]")
    model = tmp_path / "models" / "good"
    model.mkdir(parents=True)
    laptop_paths.write_record(laptop_paths.fetched_record("good", tmp_path), {"dir": str(model)})
    assert runs.laptop_runs(tmp_path) == {"good": str(model)}  # `runs` read the empty one: a JSONDecodeError
    assert sorted(path.name for path in record.parent.iterdir()) == ["empty.json", "good.json", "list.json"]


def test_a_stack_given_to_one_task_of_a_chain_is_every_tasks(stack_dir, stack_values):
    """Invoke gives a flag to the task it follows: `settings plan --stack prod` had `settings` act on dev."""
    (stack_dir / "Pulumi.dev.yaml").unlink()  # a task acting on dev fails: it has no stack file
    prod = {**stack_values, "tpu-grpo:model": "qwen3-0.6b"}
    (stack_dir / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": prod}))
    result = invoke("settings", "--json", "plan", "--json", "--stack", "prod", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    decoder = json.JSONDecoder()
    said, end = decoder.raw_decode(result.stdout)
    planned, _ = decoder.raw_decode(result.stdout[end:].lstrip())
    assert said["settings"]["tpu-grpo:model"]["value"] == "qwen3-0.6b" and planned["stack"] == "prod"


@pytest.mark.parametrize(
    "chain, message",
    [
        (
            ("settings", "--stack", "dev", "plan", "--stack", "prod"),
            "error: the command line acts on two stacks (settings --stack dev, plan --stack prod), and a chain acts "
            "on one; fix: give --stack once (it holds for every task of the line), or run them apart: uv run invoke "
            "metrics --out PLOT --events events; uv run invoke settings --stack dev; uv run invoke plan --stack prod",
        ),
        (
            ("status", "--host", "a@192.0.2.1", "logs", "--host", "b@192.0.2.2"),
            "error: the command line acts on two hosts (status --host a@192.0.2.1, logs --host b@192.0.2.2), and a "
            "chain acts on one; fix: give --host once (it holds for every task of the line), or run them apart: uv "
            "run invoke metrics --out PLOT --events events; uv run invoke status --host a@192.0.2.1; uv run invoke "
            "logs --host b@192.0.2.2",
        ),
    ],
)
def test_a_chain_naming_two_stacks_or_hosts_is_refused_before_any_task_acts(stack_dir, chain, message):
    write_events(stack_dir / "events")
    plot = stack_dir / "plot.png"
    result = invoke("metrics", "--events", "events", "--out", str(plot), *chain, cwd=stack_dir)
    assert (result.returncode, result.stderr.strip(), result.stdout) == (2, message.replace("PLOT", str(plot)), "")
    assert not plot.exists()
    apart = fix_commands(result.stderr.split("; fix: ", 1)[1])
    assert len(apart) == 3 and {command: unpasteable(command, stack_dir) for command in apart} == dict.fromkeys(apart)

"""The MaxText 0.2.3 stand-in (tests/doubles/standin) replays the real recording and writes the real tree."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import DOUBLES, FIXTURES, MODELS_KNOWN

STANDIN = DOUBLES / "standin"

TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
TO_HUGGINGFACE = "maxtext.checkpoint_conversion.to_huggingface"
TRAIN_STEP = re.compile(rb"\] Train step (\d+) ")
EVAL_STEP = re.compile(rb"Intermediate Eval \(step=(\d+)\)")


def load_standin():
    """_standin.py on its own (putting tests/doubles/standin on sys.path would shadow any real jax)."""
    spec = importlib.util.spec_from_file_location("_standin_under_test", STANDIN / "_standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixture_lines(name: str) -> list[bytes]:
    """The recorded log without the shell `time` trailer (blank line, real/user/sys)."""
    lines = (FIXTURES / name).read_bytes().split(b"\n")
    while lines and (lines[-1] == b"" or re.fullmatch(rb"(real|user|sys)\t\d+m[0-9.]+s", lines[-1])):
        lines.pop()
    return lines


def tutorial_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(STANDIN),
        "HF_TOKEN": "hf_test_token",
        "TPU_TOPOLOGY": "2x4",
        "TPU_WORKER_ID": "0",
        "TPU_SKIP_MDS_QUERY": "1",
    }


@pytest.fixture
def home(tmp_path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    control(folder)
    return folder


def control(home: Path, **values) -> None:
    values.setdefault("fixtures", str(FIXTURES))
    (home / ".standin.json").write_text(json.dumps(values))


def run(home: Path, module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=tutorial_env(home),
        cwd=home,
        capture_output=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def records(home: Path) -> list[dict]:
    return [json.loads(line) for line in (home / ".standin" / "records.jsonl").read_text().splitlines()]


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def expected_tree(checkpoints: dict[int, int]) -> set[str]:
    """output-tree.txt with the checkpoints written (step -> the recording's checkpoint whose files
    it holds) instead of the recording's, and the real events file's name."""
    out = set()
    for line in (FIXTURES / "output-tree.txt").read_text().splitlines():
        rel = line.strip()[2:]
        if not rel:
            continue
        parts = rel.split("/")
        if parts[:2] == ["checkpoints", "actor"] and len(parts) > 2:
            for step, recorded in checkpoints.items():
                if int(parts[2]) == recorded:
                    out.add("/".join([*parts[:2], str(step), *parts[3:]]))
            continue
        if parts[0] == "tensorboard" and len(parts) > 1:
            continue
        out.add("/".join(parts))
    return out | {f"tensorboard/{p.name}" for p in (FIXTURES / "tensorboard").iterdir()}


def train_args(home: Path, num_batches: int, load: Path | None = None) -> list[str]:
    if load is None:
        load = home / "mt-format" / "0" / "items"
        load.mkdir(parents=True, exist_ok=True)
    return [
        "model_name=llama3.1-8b-Instruct",
        f"load_parameters_path={load}",
        "run_name=smoke",
        f"base_output_directory={home}/post-train/",
        "chips_per_vm=8",
        f"num_batches={num_batches}",
        "num_test_batches=10",
        "rollout_data_parallelism=1",
        "rollout_tensor_parallelism=-1",
    ]


def test_step_mapping_rule():
    standin = load_standin()
    assert [standin.map_step(k, 50) for k in (1, 2, 3, 4)] == [13, 25, 38, 50]
    assert [standin.map_step(k, 4) for k in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert [standin.map_step(k, 1) for k in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert [standin.map_step(k, 2) for k in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert [standin.map_step(k, 10) for k in (1, 2, 3, 4)] == [3, 5, 8, 10]


def test_metadata_version_and_jax_devices(home):
    code = (
        "import importlib.metadata as m, maxtext, jax; "
        "print(m.version('maxtext'), maxtext.__version__, jax.__version__, m.version('jax'), "
        "jax.device_count(), jax.local_device_count(), len(jax.devices()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=tutorial_env(home), capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.2.3", "0.2.3", "0.10.1", "0.10.1", "8", "8", "8"]

    control(home, device_count=4)
    out = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.device_count())"],
        env=tutorial_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.stdout.strip() == "4"


def test_to_maxtext_records_and_writes_the_checkpoint(home):
    base = f"{home}/llama3.1-8b-Instruct/mt-format//"
    args = [
        "model_name=llama3.1-8b-Instruct",
        f"base_output_directory={base}",
        "scan_layers=True",
        "use_multimodal=False",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "checkpoint_storage_use_zarr3=1",
        "checkpoint_storage_use_ocdbt=1",
        "--lazy_load_tensors=False",
    ]
    out = run(home, TO_MAXTEXT, *args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b""
    assert b"--lazy_load_tensors=False" in out.stderr and b"hf_test_token" not in out.stderr

    [rec] = records(home)
    assert rec["module"] == TO_MAXTEXT
    assert rec["argv"] == args
    assert rec["env"] == tutorial_env(home)
    assert rec["cwd"] == str(home)
    assert {"pid", "pgid", "sid"} <= set(rec)

    items = Path(base) / "0" / "items"
    for name in ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt"):
        assert (items / name).stat().st_size > 0
    assert (Path(base) / "0" / "_CHECKPOINT_METADATA").is_file()


def test_train_rl_replays_the_recording_with_mapped_steps(home):
    args = train_args(home, 50)
    out = run(home, TRAIN_RL, *args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b""  # everything is replayed on stderr
    [rec] = records(home)
    assert rec["module"] == TRAIN_RL and rec["argv"] == args and rec["env"] == tutorial_env(home)

    replayed = out.stderr.split(b"\n")
    assert replayed.pop() == b""
    expected = fixture_lines("train_rl.cpu-rehearsal.log")
    assert len(replayed) == len(expected)
    mapping = {1: 13, 2: 25, 3: 38, 4: 50}
    train_steps = []
    for got, want in zip(replayed, expected):
        for pattern in (TRAIN_STEP, EVAL_STEP):
            match = pattern.search(want)
            if match:
                new = mapping[int(match.group(1))]
                want = want[: match.start(1)] + str(new).encode() + want[match.end(1) :]
                if pattern is TRAIN_STEP:
                    train_steps.append(new)
                break
        assert got == want
    assert train_steps == [13, 25, 38, 50]
    assert b"[step=1]" in out.stderr  # Orbax's own lines are left as recorded

    run_dir = home / "post-train" / "smoke"
    assert tree(run_dir) == expected_tree({1: 1, 50: 4})  # rl.yml's checkpoint_period 50: the first step, the last
    for events in (FIXTURES / "tensorboard").iterdir():
        assert (run_dir / "tensorboard" / events.name).read_bytes() == events.read_bytes()
    assert (run_dir / "checkpoints/actor/50/model_params/_METADATA").stat().st_size > 0
    assert not list(run_dir.rglob("*orbax-checkpoint-tmp*"))


def test_train_rl_default_four_steps_is_the_recording_itself(home):
    """The recording's own run: num_batches 4 (rl.yml's default), checkpoint_period 2."""
    args = [a for a in train_args(home, 4) if not a.startswith("num_batches=")] + ["checkpoint_period=2"]
    out = run(home, TRAIN_RL, *args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == b"\n".join(fixture_lines("train_rl.cpu-rehearsal.log")) + b"\n"
    assert tree(home / "post-train" / "smoke") == expected_tree({1: 1, 2: 2, 4: 4})


@pytest.mark.parametrize(
    "num_batches, steps, evals, checkpoints",
    [
        (1, [1], [1], {1: 4}),
        (2, [1, 2], [1, 2], {1: 2, 2: 4}),
        (3, [1, 2, 3], [2, 3], {1: 1, 3: 4}),
    ],
)
def test_train_rl_fewer_steps_drops_repeated_step_lines(home, num_batches, steps, evals, checkpoints):
    out = run(home, TRAIN_RL, *train_args(home, num_batches))
    assert out.returncode == 0, out.stderr
    assert [int(m) for m in TRAIN_STEP.findall(out.stderr)] == steps
    assert [int(m) for m in EVAL_STEP.findall(out.stderr)] == evals
    others = [
        line
        for line in fixture_lines("train_rl.cpu-rehearsal.log")
        if not TRAIN_STEP.search(line) and not EVAL_STEP.search(line)
    ]
    replayed = [
        line for line in out.stderr.split(b"\n")[:-1] if not TRAIN_STEP.search(line) and not EVAL_STEP.search(line)
    ]
    assert replayed == others
    assert tree(home / "post-train" / "smoke") == expected_tree(checkpoints)


def test_train_rl_of_no_batches_evaluates_then_fails_as_maxtext_does(home):
    """num_batches=0 (the export's report evaluation): the evaluation before training, no step, no checkpoint, then
    the StopIteration the real-MaxText tier saw, exit 1."""
    out = run(home, TRAIN_RL, *train_args(home, 0))
    assert out.returncode == 1 and out.stderr.rstrip().endswith(b"StopIteration")
    assert b"Pre RL Training: corr=" in out.stderr and b"Starting RL training..." in out.stderr
    assert not TRAIN_STEP.search(out.stderr) and b"Post RL Training" not in out.stderr
    assert not (home / "post-train" / "smoke" / "checkpoints").exists()


def test_train_rl_fails_without_the_checkpoint_to_load(home):
    missing = home / "nowhere" / "0" / "items"
    out = run(home, TRAIN_RL, *train_args(home, 50, load=missing))
    assert out.returncode == 1
    assert str(missing).encode() in out.stderr and b"not found" in out.stderr
    assert not (home / "post-train" / "smoke" / "checkpoints").exists()
    assert len(records(home)) == 1  # recorded even so


def test_train_rl_killed_mid_run_leaves_a_partial_tree(home):
    control(home, line_delay_s=0.001)
    proc = subprocess.Popen(
        [sys.executable, "-m", TRAIN_RL, *train_args(home, 50)],
        env=tutorial_env(home),
        cwd=home,
        stderr=subprocess.PIPE,
    )
    try:
        for line in proc.stderr:
            if TRAIN_STEP.search(line):
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    actor = home / "post-train" / "smoke" / "checkpoints" / "actor"
    assert sorted(p.name for p in actor.iterdir()) == ["1"]  # Orbax saves a new run's first step
    assert (home / "post-train" / "smoke" / "tensorboard").is_dir()


def steps_in(output: bytes) -> list[int]:
    return [int(step) for step in TRAIN_STEP.findall(output)]


def test_train_rl_checkpoints_every_period_and_keeps_the_newest(home):
    out = run(home, TRAIN_RL, *train_args(home, 8), "checkpoint_period=2", "max_num_checkpoints_to_keep=2")
    assert out.returncode == 0, out.stderr
    actor = home / "post-train" / "smoke" / "checkpoints" / "actor"
    assert sorted(int(p.name) for p in actor.iterdir()) == [6, 8]  # 1, 2, 4, 6, 8 written; the newest two kept
    assert steps_in(out.stderr) == [2, 4, 6, 8]


def test_train_rl_restarted_resumes_after_its_newest_checkpoint(home):
    """As train_rl does: the same run name and output folder restore the newest checkpoint; the
    pre-training evaluation runs again, the steps done before do not."""
    control(home, line_delay_s=0.001)
    args = [*train_args(home, 8), "checkpoint_period=2", "max_num_checkpoints_to_keep=2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", TRAIN_RL, *args], env=tutorial_env(home), cwd=home, stderr=subprocess.PIPE
    )
    try:
        for line in proc.stderr:
            if TRAIN_STEP.search(line) and steps_in(line) == [4]:
                break
        proc.kill()  # the VM is gone
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    actor = home / "post-train" / "smoke" / "checkpoints" / "actor"
    assert sorted(int(p.name) for p in actor.iterdir() if p.name.isdigit()) == [2, 4]
    control(home)
    again = run(home, TRAIN_RL, *args)
    assert again.returncode == 0, again.stderr
    assert f"restored checkpoint 4 from {actor}; training resumes at step 5 of 8".encode() in again.stderr
    assert steps_in(again.stderr) == [6, 8]
    assert again.stderr.count(b"Pre RL Training: ") == 1 and b"Post RL Training: " in again.stderr
    assert sorted(int(p.name) for p in actor.iterdir()) == [6, 8]


def test_to_huggingface_replays_and_exports_the_real_files(home):
    load = home / "post-train" / "smoke" / "checkpoints" / "actor" / "50" / "model_params"
    load.mkdir(parents=True)
    export = home / "hf-trained"
    args = [
        "model_name=llama3.1-8b",
        f"load_parameters_path={load}",
        f"base_output_directory={export}/",
        "scan_layers=True",
        "use_multimodal=False",
        "weight_dtype=bfloat16",
    ]
    out = run(home, TO_HUGGINGFACE, *args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == b"\n".join(fixture_lines("to_huggingface.cpu-rehearsal.log")) + b"\n"
    [rec] = records(home)
    assert rec["module"] == TO_HUGGINGFACE and rec["argv"] == args
    fixture = FIXTURES / "hf-export"
    assert sorted(p.name for p in export.iterdir()) == sorted(p.name for p in fixture.iterdir())
    for path in fixture.iterdir():
        assert (export / path.name).read_bytes() == path.read_bytes()


def test_to_huggingface_fails_without_the_checkpoint_to_load(home):
    out = run(
        home,
        TO_HUGGINGFACE,
        "model_name=llama3.1-8b",
        f"load_parameters_path={home}/none",
        f"base_output_directory={home}/hf",
    )
    assert out.returncode == 1
    assert b"not found" in out.stderr
    assert not (home / "hf").exists()


def test_exit_codes_and_hold_come_from_the_control_file(home):
    control(home, exit_code={"to_maxtext": 3, "train_rl": 4, "to_huggingface": 5}, hold_s=0.3)
    start = time.monotonic()
    out = run(home, TO_MAXTEXT, "model_name=llama3.1-8b-Instruct", f"base_output_directory={home}/mt")
    assert out.returncode == 3
    assert time.monotonic() - start >= 0.3
    load = home / "ckpt"
    load.mkdir()
    assert run(home, TRAIN_RL, *train_args(home, 2)).returncode == 4
    assert (
        run(
            home,
            TO_HUGGINGFACE,
            "model_name=llama3.1-8b",
            f"load_parameters_path={load}",
            f"base_output_directory={home}/hf",
        ).returncode
        == 5
    )
    assert [r["module"] for r in records(home)] == [TO_MAXTEXT, TRAIN_RL, TO_HUGGINGFACE]


def test_fixtures_from_the_control_file_and_the_default(home, tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES, copy)
    shutil.copy(MODELS_KNOWN, tmp_path)  # beside the fixtures, as the test hosts have it
    control(home, fixtures=str(copy))
    assert run(home, TRAIN_RL, *train_args(home, 50)).returncode == 0

    (home / ".standin.json").unlink()  # default: tests/data/maxtext-0.2.3
    out = run(
        home,
        TO_HUGGINGFACE,
        "model_name=llama3.1-8b",
        f"load_parameters_path={home}",
        f"base_output_directory={home}/hf",
    )
    assert out.returncode == 0, out.stderr

    control(home, fixtures=str(tmp_path / "absent"))
    out = run(home, TRAIN_RL, *train_args(home, 50))
    assert out.returncode == 2 and b"fixtures not found" in out.stderr


def test_bad_control_file_is_an_error(home):
    (home / ".standin.json").write_text(json.dumps({"line_delay": 1}))
    out = run(home, TO_MAXTEXT, "model_name=llama3.1-8b-Instruct", f"base_output_directory={home}/mt")
    assert out.returncode == 2 and b"line_delay" in out.stderr


@pytest.mark.parametrize(
    "module, name, table",
    [
        (TO_MAXTEXT, "llama3.1-70b-Instruct", None),
        (TRAIN_RL, "llama3.1-70b-Instruct", "HF_MODEL_CONFIGS"),
        (TO_MAXTEXT, "qwen3-1.7b", "HF_IDS"),
        (TRAIN_RL, "llama9-70b", "ModelName"),
        (TO_HUGGINGFACE, "qwen3-8b", None),
    ],
)
def test_a_model_name_maxtext_would_refuse_is_refused(home, module, name, table):
    """The stand-in takes what MaxText 0.2.3 takes: a ModelName, and for each module the tables it looks the name up
    in (tests/data/maxtext-0.2.3-models.json)."""
    args = {
        TO_MAXTEXT: [f"base_output_directory={home}/mt"],
        TRAIN_RL: train_args(home, 2)[1:],
        TO_HUGGINGFACE: [f"load_parameters_path={home}", f"base_output_directory={home}/hf"],
    }[module]
    out = run(home, module, f"model_name={name}", *args)
    if table is None:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 1 and out.stderr.decode().startswith(
            f"stand-in: model_name={name} is not in MaxText 0.2.3's {table} ("
        )

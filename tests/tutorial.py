"""The tutorial's sections 4 to 6 run for real in bash, with `python3` recording what it is
given: the argv and environment each MaxText step gets when a person follows the tutorial."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.support import TEST_TOKEN, TUTORIAL
from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.jobs import maxtext

MODULES = (
    "maxtext.checkpoint_conversion.to_maxtext",
    "maxtext.trainers.post_train.rl.train_rl",
    "maxtext.checkpoint_conversion.to_huggingface",
)


def sections() -> str:
    """The code blocks of sections 4, 5 and 6, in order, as one shell session."""
    text = TUTORIAL.read_text()
    blocks = []
    for number in (4, 5, 6):
        section = re.search(rf"^## {number}\..*?^```\n(.*?)^```", text, re.S | re.M)
        blocks.append(section.group(1))
    return "".join(blocks)


def calls(folder: Path, token: str, run_name: str) -> dict[str, dict]:
    """module -> {"argv": [...], "env": {...}} as the tutorial's shell would run them, with `date`
    answering `run_name` (the tutorial's RUN_NAME) and the token in place of YOUR_HF_TOKEN."""
    tools = folder / "tutorial-bin"
    tools.mkdir(exist_ok=True)
    record = folder / "tutorial-calls.jsonl"
    (tools / "python3").write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}) + '\\n')\n"
    )
    (tools / "date").write_text(f"#!/bin/sh\necho {run_name}\n")
    for tool in ("python3", "date"):
        (tools / tool).chmod(0o755)
    script = sections().replace("YOUR_HF_TOKEN", token)
    subprocess.run(["bash", "-c", script], check=True, env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(folder)})
    found = {}
    for line in record.read_text().splitlines():
        call = json.loads(line)
        dash_m, module, *argv = call["argv"]
        assert dash_m == "-m"
        found[module] = {"argv": argv, "env": call["env"]}
    return found


def exported_names() -> list[str]:
    """Every variable the tutorial's sections 4-6 export, in order."""
    names = []
    for line in sections().splitlines():
        match = re.match(r"^(?:export ([A-Z_]+)=|[A-Z_]+=.*; export ([A-Z_]+)$)", line)
        if match:
            names.append(match.group(1) or match.group(2))
    return names


#: The tutorial's run: the 8B Instruct model, 50 batches, on a ct6e-standard-8t.
RUN = maxtext.Run(
    model="llama3.1-8b-Instruct",
    export_model="llama3.1-8b",
    batches=50,
    test_batches=10,
    use_pathways=False,
    lazy_load_tensors=False,
    machine=MACHINES["ct6e-standard-8t"],
    run_name="2026-12-02-22-10-00",
)


def job_home(folder) -> tuple[dict, Path]:
    """A home with a venv and the token file, and a `python3` that records its argv and environment:
    (the environment to run a job script in, the record file)."""
    home = folder / "home"
    (home / "maxtext_venv/bin").mkdir(parents=True)
    (home / "maxtext_venv/bin/activate").write_text("")
    (home / ".cache/huggingface").mkdir(parents=True)
    (home / ".cache/huggingface/token").write_text(TEST_TOKEN)
    tools, record = folder / "bin", folder / "ours.jsonl"
    tools.mkdir()
    (tools / "python3").write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], "
        "'env': dict(os.environ), "
        "'stdin': sys.stdin.read() if sys.argv[1:2] == ['-'] else None}) + '\\n')\n"
    )
    (tools / "python3").chmod(0o755)
    return {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(home)}, record


def run_ours(folder, run: maxtext.Run, env: dict | None = None) -> dict[str, dict]:
    """Each of our scripts run in bash on a home with a venv and the token file (`env`: a job_home of
    `folder` already made), `python3` recording."""
    env, record = (env, folder / "ours.jsonl") if env else job_home(folder)
    for step in maxtext.STEPS:
        subprocess.run(["bash", "-c", maxtext.script(run, step)], check=True, cwd=env["HOME"], env=env)
    found = {}
    for line in record.read_text().splitlines():
        call = json.loads(line)
        argv = call["argv"]
        # MaxText's modules (the training's through run_module: `python3 - MODULE`); not the convert job's
        # `python3 -` asking its version, nor the export's report evaluation (a second train_rl, test_maxtext.py's)
        if (argv[0] == "-m" or argv[1:2] == [maxtext.MODULES["train"]]) and argv[1] not in found:
            found[argv[1]] = {"argv": argv[2:], "env": call["env"]}
    return found


#: Our deliberate additions to the tutorial's argv: the compile cache (every step), one restore of the weights, the
#: learning rate's schedule over the run and a checkpoint every 10 steps, the newest 2 kept, each scored (train_rl;
#: tpu_grpo/jobs/maxtext.py, tpu_grpo/catalog/stores.py).
TRAINING_ADDED = (
    "load_checkpoint_only_once",
    "learning_rate_schedule_steps",
    "checkpoint_period",
    "max_num_checkpoints_to_keep",
)
OURS_ADDED = ("jax_cache_dir=", *(f"{name}=" for name in TRAINING_ADDED))


def assert_same_as_tutorial(ours: dict[str, dict], theirs: dict[str, dict]) -> None:
    """argv equal element by element (the tutorial's hf_access_token= aside), and every variable
    the tutorial exports equal character for character; nothing else of ours but OURS_ONLY."""
    names = exported_names()
    assert list(ours) == list(theirs) == list(MODULES)
    for module in MODULES:
        expected = [arg for arg in theirs[module]["argv"] if not arg.startswith("hf_access_token=")]
        assert [arg for arg in ours[module]["argv"] if not arg.startswith(OURS_ADDED)] == expected, module
        added = {arg.partition("=")[0] for arg in ours[module]["argv"] if arg.startswith(OURS_ADDED)}
        assert added == {"jax_cache_dir"} | (set(TRAINING_ADDED) if module == MODULES[1] else set())
        for name in names:
            if name in theirs[module]["env"]:
                assert ours[module]["env"].get(name) == theirs[module]["env"][name], (module, name)
    token_args = [arg for arg in theirs[MODULES[0]]["argv"] if arg.startswith("hf_access_token=")]
    assert token_args == [f"hf_access_token={TEST_TOKEN}"]  # the one difference: the token moves to HF_TOKEN
    assert ours[MODULES[0]]["env"]["HF_TOKEN"] == TEST_TOKEN

"""A pipeline's steps run in order by the host itself (tpu_grpo/jobs/pipeline.py's chain_script): convert -> train ->
export -> save, each a job of its own as `invoke train` starts one (its folder, job.json, log, exit code, and its
done-record on success), so status, logs and cancel see the step and a later pipeline skips what is done. The laptop
starts the chain and follows its lines; a closed laptop stops nothing. The chain holds the TPU's lock from its start
to its end (start_job.sh's, passed on to each step): no other job starts between its steps, and the idle stop counts
the VM busy until its last step has ended.

The export's checkpoint is the one the training's intermediate evaluations scored best, chosen once a training of the
run has finished, as tpu_grpo/jobs/pipeline.py's `scored` chooses it on the laptop (progress.best: the highest
accuracy among the evaluated steps that have a checkpoint, the earlier on a tie). The laptop renders the export and
the save twice: for the last checkpoint ("last"), and for a stand-in step (SENTINEL, "best") whose number this program
replaces with the chosen step, naming the export's done-record by its inputs as pipeline.record_key does.

Its data: the file its first argument names (chain.json): `jobs`, `done`, `root` (folders, each may begin with `~`),
`wrapper` (job_wrapper.sh's text), `sentinel`, `steps` (convert's and train's), `variants` ({"best": [export, save],
"last": [...]}), each step {name, script, meta, record, test, when_done}: its job's command, job.json, done-record name,
a bash test that holds when it is done, and, for a step that runs even when done, the command it then runs; `choose`:
{list (bash that prints the names in the run's checkpoint folders), run, iterations, prefix, pattern, field, keys}
(progress.py's ABSL_PREFIX, EVAL, EVAL_FIELD and EVAL_KEYS, so a log is read one way).
Its lines: `tpu-grpo pipeline: STEP done|skipped|job ID|exit CODE`, which the laptop reads (pipeline.CHAIN_LINE)."""

import hashlib
import json
import os
import re
import subprocess
import sys
import time

SAID = "tpu-grpo pipeline:"
#: The TPU's lock, held since start_job.sh: each step holds it too, as a job started alone does.
LOCK_FD = 9
#: An evaluation's fields that are whole numbers (progress.Eval's correct and total); the others are decimals.
COUNTS = ("corr", "total")


def say(text: str) -> None:
    print(f"{SAID} {text}", flush=True)


def record_key(meta: dict) -> str:
    """The done-record's name of a step whose inputs are meta["inputs"] (pipeline.record_key's, for the export)."""
    digest = hashlib.sha256(json.dumps(meta["inputs"], sort_keys=True).encode()).hexdigest()[:12]
    return f"{meta['step']}-{digest}"


def message(line: str, prefix: "re.Pattern[str]") -> str:
    """A log line's message: what follows absl's prefix, or the line itself (progress.message)."""
    line = line.rstrip("\r\n")
    if found := prefix.search(line):
        return line[found.end() :].strip()
    return line.rsplit("\r", 1)[-1].strip()


def scores(lines: list[str], choose: dict) -> list[tuple[float, int]]:
    """Each intermediate evaluation whose fields progress.py reads (whole counts, decimal rates): (accuracy, its outer
    step)."""
    prefix, pattern, field = (re.compile(choose[name]) for name in ("prefix", "pattern", "field"))
    found = []
    for line in lines:
        said = pattern.match(message(line, prefix))
        if not said or said["step"] is None:
            continue
        values = dict(field.findall(said["ifields"]))
        try:
            for key in choose["keys"]:
                (int if key in COUNTS else float)(values[key])
        except (KeyError, ValueError):
            continue
        found.append((float(values["accuracy"]), int(said["step"])))
    return found


def best_step(lines: list[str], checkpoints: set[int], choose: dict) -> int | None:
    """The train step of the best scored checkpoint (progress.best, scored_step), or None: none was scored."""
    iterations = choose["iterations"]
    scored = [(accuracy, -step) for accuracy, step in scores(lines, choose) if step * iterations in checkpoints]
    if not scored:
        return None
    step = -max(scored)[1]
    return step * iterations or None


def trainings(jobs: str, run: str) -> list[str]:
    """The folders of the run's training jobs, oldest first."""
    found = []
    for name in sorted(os.listdir(jobs)):
        try:
            with open(os.path.join(jobs, name, "job.json")) as file:
                meta = json.load(file)
        except (OSError, ValueError):
            continue
        if meta.get("step") == "train" and meta.get("run") == run:
            found.append(os.path.join(jobs, name))
    return found


def read(path: str) -> str:
    """A file's text, or nothing when it is not there (yet)."""
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def chosen(given: dict) -> int | None:
    """The step to export: the best scored once a training of the run has finished (pipeline.scored), else None."""
    choose = given["choose"]
    folders = trainings(os.path.expanduser(given["jobs"]), choose["run"])
    if not any(read(os.path.join(folder, "exit_code")).strip() == "0" for folder in folders):
        return None
    listed = subprocess.run(["bash", "-c", choose["list"]], capture_output=True, text=True, check=False).stdout
    checkpoints = {int(name) for name in listed.split() if name.isdigit()}
    lines = [line for folder in folders for line in read(os.path.join(folder, "log")).splitlines()]
    return best_step(lines, checkpoints, choose)


def variant(given: dict, step: int | None) -> list[dict]:
    """The export and the save of the chosen step: the "best" ones with the stand-in replaced, else the "last"."""
    if step is None:
        return given["variants"]["last"]
    sentinel = str(given["sentinel"])
    steps = json.loads(json.dumps(given["variants"]["best"]).replace(sentinel, str(step)))
    export = steps[0]  # its inputs' digest names its done-record, and its save's
    old, new = (key.rsplit("-", 1)[1] for key in (export["record"], record_key(export["meta"])))
    return json.loads(json.dumps(steps).replace(old, new))


def holds(test: str) -> bool:
    return subprocess.run(["bash", "-c", test], stdin=subprocess.DEVNULL, check=False).returncode == 0


def new_id(step: str) -> str:
    """As tpu_grpo/jobs/vm_jobs.py's new_id: UTC start time to the millisecond, then the step."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}-{step}"


def run_job(given: dict, chain: str, step: dict, command: str) -> int:
    """Run one step as start_job.sh starts a job (without its lock, which the chain holds); its exit code."""
    jobs, root = (os.path.expanduser(given[name]) for name in ("jobs", "root"))
    job_id = new_id(step["name"])
    folder = os.path.join(jobs, job_id)
    os.makedirs(folder)
    for name, text in (
        ("command.sh", command),
        ("job.json", json.dumps({**step["meta"], "chain": chain}, indent=1)),
        ("run.sh", given["wrapper"]),
    ):
        with open(os.path.join(folder, name), "w") as file:
            file.write(text)
    with open(os.path.join(root, "current"), "w") as file:
        file.write(f"{job_id}\n")
    say(f"{step['name']} job {job_id}")
    held = (LOCK_FD,) if os.path.exists(f"/proc/self/fd/{LOCK_FD}") else ()
    subprocess.run(
        ["bash", os.path.join(folder, "run.sh"), folder, step["record"], os.path.expanduser(given["done"])],
        cwd=os.path.expanduser("~"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own, as a job started alone: cancel ends it and nothing else
        pass_fds=held,
        check=False,
    )
    code = read(os.path.join(folder, "exit_code")).strip()
    return int(code) if code.lstrip("-").isdigit() else -1


def main(path: str) -> int:
    with open(path) as file:
        given = json.load(file)
    chain = os.path.basename(os.path.dirname(os.path.abspath(path)))
    steps = [*given["steps"], *variant(given, chosen(given))]
    done = [holds(step["test"]) for step in steps]
    last_done = max((number for number, each in enumerate(done) if each), default=-1)
    trained = False
    for number, step in enumerate(steps):
        if number < last_done or (number == last_done and not step.get("when_done")):
            say(f"{step['name']} {'done' if done[number] else 'skipped'}")
            continue
        if step["name"] == "export" and trained:  # the training just finished: its scores choose the checkpoint
            steps[number:] = variant(given, chosen(given))
            step = steps[number]
        command = step["when_done"] if done[number] and step.get("when_done") else step["script"]
        code = run_job(given, chain, step, command)
        say(f"{step['name']} exit {code}")
        if code != 0:
            return code
        trained = trained or step["name"] == "train"
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

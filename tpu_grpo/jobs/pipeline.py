"""convert -> train -> export -> save on one host, run by the host itself as one detached job (a chain: remote/chain.py)
whose every step is a job of its own, recorded when it succeeds: a re-run skips what is done (a converted checkpoint
serves every run) and resumes after a failure, and a closed laptop stops nothing, nor keeps the chips waiting for the
next step. A preflight checks the host first, in one round trip, so a missing token or a full disk fails in seconds,
not after an hour of TPU; the laptop then follows the chain's steps.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tpu_grpo.catalog import release, stores
from tpu_grpo.catalog.models import DEFAULT_DATASET, DEFAULT_DATASET_TEST_ROWS
from tpu_grpo.config import host_paths, settings, values
from tpu_grpo.config.errors import BadFlag, NotReady, SettingsError, UserError
from tpu_grpo.config.keys import PROJECT
from tpu_grpo.host import artifacts, facts, gcs, hosts, remote
from tpu_grpo.jobs import maxtext, progress, vm_jobs, watch

PIPELINE = ("convert", "train", "export", "save")
MODELS = f"{vm_jobs.ROOT}/models"
PIPELINES = f"{vm_jobs.ROOT}/pipelines"
RUNS = f"{vm_jobs.ROOT}/runs"
LOG_TAIL_LINES = 15


class PipelineError(UserError):
    """A step that failed or cannot start; one line (and the log's last lines) with the fix."""

    exit_code = 1


class RunNameTaken(UserError):
    """A run name given again with other inputs: it names one training, so this is bad input."""


@dataclass
class StepOutcome:
    """What became of one pipeline step (a playbook's step is provision.playbook.Step)."""

    name: str
    state: str  # done | skipped | ran | failed
    job: str | None = None
    exit_code: int | None = None
    detail: str = ""


@dataclass
class Outcome:
    run: str
    host: str
    steps: list[StepOutcome] = field(default_factory=list)
    saved: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def record_key(run: maxtext.Run, step: str) -> str:
    """The done-record's name: equal inputs give the same key, so an equal step is found and reused."""
    digest = hashlib.sha256(json.dumps(run.inputs(step), sort_keys=True).encode()).hexdigest()[:12]
    return f"{step}-{run.name}-{digest}" if step == "train" else f"{step}-{digest}"


def saved_dir(run_name: str) -> str:
    return f"{MODELS}/{run_name}"


def run_archive(run_name: str) -> str:
    """The run's folder on the data disk: what it was trained and saved with, and what else of it
    must outlive /dev/shm (its TensorBoard events, its last checkpoint when asked for)."""
    return f"{RUNS}/{run_name}"


def trained_record(run_name: str) -> str:
    """What the run was trained with: written, under the TPU's lock, when its first training starts."""
    return f"{run_archive(run_name)}/trained-with.json"


def saved_record(run_name: str) -> str:
    """What the run's saved model was exported with: written when save completes."""
    return f"{run_archive(run_name)}/saved-with.json"


def identity(run: maxtext.Run, step: str) -> str:
    """The inputs behind a run's training ("train") or its saved model ("export"), run name aside, as
    canonical JSON: a run name names one training, and one saved model."""
    inputs = run.inputs(step)
    inputs.pop("run_name")
    return json.dumps(inputs, sort_keys=True)


def name_taken(run: maxtext.Run, what: str, found: str, wanted: str) -> RunNameTaken:
    """The one line for a run name reused with other inputs: the earlier values against these."""
    try:
        earlier = json.loads(found)
    except ValueError:
        earlier = {}
    now = json.loads(wanted)
    differences = [
        f"{key}={earlier.get(key)!r} (this command: {now.get(key)!r})"
        for key in sorted(set(earlier) | set(now))
        if earlier.get(key) != now.get(key)
    ]
    return RunNameTaken(
        f"run {run.name!r} was {what} with {', '.join(differences) or found}; a run name names "
        f"one training; fix: pick a new run name (e.g. --run-name {run.name}-2), or give the "
        "earlier flags to continue that run"
    )


def output_test(run: maxtext.Run, step: str) -> str:
    """A bash test that holds when the step's result is on the host and belongs to these inputs."""
    paths = maxtext.paths(run)
    record = f"{vm_jobs.DONE}/{record_key(run, step)}"
    if step in ("convert", "train"):
        # a training's last checkpoint, which the checkpoint manager keeps whatever it deletes
        folder = paths["checkpoint"] if step == "convert" else f"{paths['checkpoints']}/{run.train_steps}/model_params"
        return f"[ -f {record} ] && " + (bucket_holds(folder) if in_bucket(run) else f"[ -d {folder} ]")
    if step == "export":  # /dev/shm/.../hf-trained holds the newest export only
        return (
            f'[ -f {record} ] && [ "$(ls -t {vm_jobs.DONE}/export-* | head -1)" = {record} ] '
            f"&& [ -f {paths['hf_export']}config.json ]"
        )
    return (
        f"[ -f {saved_dir(run.name)}/SHA256SUMS ] "
        f'&& [ "$(cat {saved_record(run.name)} 2>/dev/null)" = {shlex.quote(identity(run, "export"))} ]'
    )


#: MaxText's Python on the host; in the post-training image, the first on PATH (a slice's pods).
HOST_PYTHON = f"{host_paths.VENV}/bin/python3"


def children_on_host(folder: str, python: str = HOST_PYTHON) -> str:
    """Bash that prints a gs:// folder's children, a name a line, with MaxText's own client (on the host, or a pod)."""
    return remote.run("folder_children", {"folder": folder}, python=python)


def steps_on_host(folder: str, python: str = HOST_PYTHON) -> str:
    """Bash that prints the steps Orbax finished writing in a gs:// checkpoints folder (stores.COMMIT_FILE)."""
    return remote.run("folder_children", {"folder": folder, "committed": stores.COMMIT_FILE}, python=python)


def bucket_holds(folder: str, python: str = HOST_PYTHON) -> str:
    """A bash test that holds when a gs:// folder is in its bucket, asked on the host (or in a pod)."""
    parent, name = folder.rstrip("/").rsplit("/", 1)
    return f'[ -n "$( ({children_on_host(parent, python)}\n) 2>/dev/null | grep -x {name})" ]'


def in_bucket(run: maxtext.Run) -> bool:
    """Whether the run's checkpoints live in a gs:// store (the laptop reads its checkpoints and events there too)."""
    return run.store.name == "gs"


def present(connection, run: maxtext.Run, folder: str) -> bool:
    """Whether a folder of the run's store holds something."""
    if in_bucket(run):
        return gcs.exists(folder)
    return hosts.run_script(connection, f"[ -d {folder} ]").exited == 0


def _steps(names: list[str]) -> list[int]:
    return sorted(int(name) for name in names if re.fullmatch(r"[0-9]+", name))


class Checkpoints(facts.Fact):
    """The checkpoints in folders of the host's disk (or /dev/shm), by step."""

    script = staticmethod(lambda *folders: f"ls -1 {' '.join(folders)} 2>/dev/null; true")
    parse = staticmethod(lambda answer, *folders: sorted(set(_steps(answer.stdout.split()))))


def checkpoint_steps(connection, run: maxtext.Run) -> list[int]:
    """The training checkpoints of the run in its store, by step: the manager's, and the best scored one it would have
    deleted, kept (maxtext.keeper_lines)."""
    where = maxtext.paths(run)
    if in_bucket(run):
        return _steps(gcs.committed(where["checkpoints"]))
    return Checkpoints.read(connection, where["checkpoints"], *([where["kept"]] if maxtext.VM.keeps_best(run) else []))


def probe_script(run: maxtext.Run) -> str:
    """One round trip: which steps are done, what the run name was trained and saved with, and which
    pipelines ran before with these inputs."""
    lines = [f"if {output_test(run, step)}; then echo done {step}; fi" for step in PIPELINE]
    for kind, path in (("trained-with", trained_record(run.name)), ("saved-with", saved_record(run.name))):
        lines.append(f"[ -f {path} ] && echo {kind} $(base64 -w0 {path})")
    lines.append(f"for f in $(ls -1t {PIPELINES} 2>/dev/null); do echo pipeline $(base64 -w0 {PIPELINES}/$f); done")
    return "\n".join(lines) + "\ntrue"


def pipeline_inputs(run: maxtext.Run) -> dict:
    """A pipeline's identity, run name aside: the same flags resume the same run, whichever checkpoint its
    training's scores chose (pipelines recorded before the choice existed name the last, as these do)."""
    inputs = replace(run, scored_step=None).inputs("export")
    inputs.pop("run_name")
    return inputs


@dataclass
class Probed:
    done: set[str] = field(default_factory=set)
    pipelines: list[dict] = field(default_factory=list)
    records: dict[str, str] = field(default_factory=dict)  # trained-with / saved-with -> JSON

    def to_json(self) -> dict:
        return {"done": sorted(self.done), "pipelines": self.pipelines, "records": self.records}

    def check_name(self, run: maxtext.Run) -> None:
        """Refuse a run name that was trained, or saved, with other inputs than these."""
        for kind, step, what in (("trained-with", "train", "trained"), ("saved-with", "export", "saved")):
            wanted = identity(run, step)
            if kind in self.records and self.records[kind] != wanted:
                raise name_taken(run, what, self.records[kind], wanted)


def parse_probe(answer: facts.Answer) -> Probed:
    probed = Probed()
    for line in answer.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "done":
            probed.done.add(rest)
        elif kind in ("trained-with", "saved-with"):
            probed.records[kind] = base64.b64decode(rest).decode(errors="replace")
        elif kind == "pipeline":
            try:
                probed.pipelines.append(json.loads(base64.b64decode(rest)))
            except ValueError:  # a record cut short (a disk full while writing): not resumable
                continue
    return probed


class Probe(facts.Fact):
    """Which steps of a run are done on the host, what its name was trained and saved with, the pipelines run
    before (its argument: the run's record, maxtext.Run.to_record)."""

    script = staticmethod(lambda record: probe_script(maxtext.Run.from_record(record)))
    parse = staticmethod(lambda answer, record: parse_probe(answer))


def probe(connection, run: maxtext.Run) -> Probed:
    return Probe.read(connection, run.to_record())


def preflight_script(run: maxtext.Run, need_gb: dict[str, float], check_tpu: bool) -> str:
    """Every check in one script (remote/preflight.sh); each failing one prints `fail: what; fix: how`."""
    # Without provisioning's download of the model, the conversion downloads it itself, into the data disk's cache.
    download_kb = int(need_gb.get("download", 0) * 1024 * 1024)
    return remote.shell(
        "preflight",
        VENV=host_paths.VENV,
        MAXTEXT_VERSION=release.MAXTEXT_VERSION,
        VERSION_PROGRAM=remote.text("maxtext_version"),
        TOKEN_FILE=host_paths.TOKEN_FILE if run.row.gated else "",  # a public model's run needs no token
        SHM_KB=int(need_gb["shm"] * 1024 * 1024),
        SHM_GB=f"{need_gb['shm']:g}",
        DATA_ROOT=vm_jobs.ROOT,
        DATA_KB=int(need_gb["data"] * 1024 * 1024),
        MODELS=MODELS,
        DOWNLOADED=maxtext.downloaded_model(run) if download_kb else "",
        DOWNLOAD_KB=download_kb,
        CHIPS=run.machine.chips if check_tpu else "",
        MACHINE_TYPE=run.machine.machine_type,
    )


class Preflight(facts.Fact):
    """What keeps the host from running a run now, a `what; fix: how` each (its arguments: the run's record, the GB
    it needs, whether to count the TPU's chips)."""

    script = staticmethod(
        lambda record, need_gb, check_tpu: preflight_script(maxtext.Run.from_record(record), need_gb, check_tpu)
    )
    parse = staticmethod(
        lambda answer, *_: [
            line.removeprefix("fail: ") for line in answer.stdout.splitlines() if line.startswith("fail: ")
        ]
    )


def preflight(connection, run: maxtext.Run, need_gb: dict[str, float], check_tpu: bool) -> None:
    failures = Preflight.read(connection, run.to_record(), need_gb, check_tpu)
    if failures:
        raise PipelineError("preflight failed: " + " | ".join(failures))


def parse_need_gb(text: str | None, run: maxtext.Run) -> dict[str, float]:
    """`--need-gb SHM,DATA` -> {"shm": .., "data": ..}; by default what the run's store needs, and ("download") what
    the conversion downloads itself onto the data disk when provisioning's download of the model is not complete."""
    if text is None:
        return {
            **stores.need_gb(run.store, run.checkpoints_to_keep, run.row.weights_gb, run.row.checkpoint_gb),
            "download": round(run.row.conversion_download_gb(run.lazy_load_tensors), 1),
        }
    gigabytes = values.decimal(0, 100_000, " GB")
    parts = str(text).split(",")
    try:
        if len(parts) != 2:
            raise values.Refused("is not SHM_GB,DATA_GB (two numbers)")
        shm, data = (gigabytes(part) for part in parts)
    except values.Refused as problem:
        raise BadFlag(f"--need-gb {text!r} {problem}; fix: e.g. --need-gb 120,36") from None
    return {"shm": shm, "data": data}


def job_meta(run: maxtext.Run, step: str) -> dict:
    meta: dict[str, object] = {
        "step": step,
        "run": run.name,
        "key": record_key(run, step),
        "inputs": run.inputs(step),
        "record": run.to_record(),
        "paths": maxtext.paths(run),
        "capacity": run.capacity,
    }
    if step == "train":
        meta["total_steps"] = run.train_steps
    return meta


def start_step(connection, run: maxtext.Run, step: str) -> str:
    """Start one MaxText step as a detached job (refused when the TPU is busy, and a training whose run
    name was trained with other inputs); returns the job id."""
    job_id = vm_jobs.new_id(step)
    claim = (trained_record(run.name), identity(run, "train")) if step == "train" else None
    try:
        vm_jobs.start(connection, job_id, maxtext.script(run, step), job_meta(run, step), record_key(run, step), claim)
    except vm_jobs.ClaimTaken as taken:
        assert claim, "only a training claims its run name"
        raise name_taken(run, "trained", taken.found, claim[1]) from None
    return job_id


def running_jobs(connection, run: maxtext.Run) -> dict[str, vm_jobs.Job]:
    """This run's chain ("pipeline"), or its steps started alone, that have a job running now (a pipeline re-run
    attaches to them)."""
    keys = {record_key(run, step): step for step in maxtext.STEPS} | {chain_meta(run)["key"]: "pipeline"}
    return {
        keys[job.meta.get("key", "")]: job
        for job in vm_jobs.list_jobs(connection)
        if job.state == "running" and job.meta.get("key") in keys and "chain" not in job.meta
    }


def failure(connection, job_id: str, step: str, code: int) -> PipelineError:
    tail = vm_jobs.read_log(connection, job_id).decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return PipelineError(
        f"{step} failed (job {job_id}, exit {code}); last lines of its log:\n"
        + "\n".join(f"  {line}" for line in tail)
        + "\nfix the cause, then run the same command again: finished steps are skipped"
    )


def save_script(run: maxtext.Run, keep_checkpoint: bool, replace: bool) -> str:
    """The save step's job: copy from /dev/shm to the data disk, each folder with checksums, the exported model, the
    run's TensorBoard events (for `invoke metrics` later) and, if asked, the checkpoint of the exported step (to train
    on from it; a bucket store keeps both itself); then record what the model was exported with and when it was
    saved. `replace=False` keeps a model already saved with these inputs."""
    paths = maxtext.paths(run)
    copies = [(paths["hf_export"], saved_dir(run.name), replace)]
    if not in_bucket(run):  # a bucket keeps the run's events and checkpoints itself
        copies.append((f"{paths['run']}/tensorboard", f"{run_archive(run.name)}/tensorboard", replace))
        if keep_checkpoint:
            kept = f"checkpoints/actor/{run.export_step}"
            copies.append((f"{paths['run']}/{kept}", f"{run_archive(run.name)}/{kept}", False))
    record, saved_at = saved_record(run.name), f"{run_archive(run.name)}/saved-at.json"
    return (
        "\n".join(
            [
                f"# tpu-grpo save: the model of run {run.name} to the data disk",
                "set -euo pipefail",
                "started=$(date +%s.%N)",
                *(f"(\n{artifacts.save_script(*copy).rstrip()}\n)" for copy in copies),
                f"mkdir -p {run_archive(run.name)}",
                f"printf %s {shlex.quote(identity(run, 'export'))} > {record}.tmp && mv {record}.tmp {record}",
                f'printf \'{{"run": "%s", "started": %s, "finished": %s}}\' {run.name} "$started" '
                f'"$(date +%s.%N)" > {saved_at}.tmp && mv {saved_at}.tmp {saved_at}',
            ]
        )
        + "\n"
    )


def write_record(connection, run: maxtext.Run) -> None:
    """Note that this run was started with these inputs: a re-run without --run-name continues it."""
    hosts.write_text(
        connection, f"{PIPELINES}/{run.name}.json", json.dumps({"run": run.name, "inputs": pipeline_inputs(run)})
    )


def resumable_run(pipelines: list[dict], run: maxtext.Run) -> str | None:
    """The newest earlier pipeline with the same inputs: its run is the one to continue."""
    wanted = json.loads(json.dumps(pipeline_inputs(run)))
    for record in pipelines:
        if record.get("inputs") == wanted:
            return record["run"]
    return None


def named_pipeline(connection, run: maxtext.Run, new_name: str) -> maxtext.Run:
    """A pipeline's run named: its own name, else the newest earlier pipeline's of the same inputs (it continues that
    run), else `new_name`."""
    if run.run_name is not None:
        return run
    return run.named(resumable_run(probe(connection, run.named(new_name)).pipelines, run.named(new_name)) or new_name)


#: The stand-in step of a chain's "best" export and save (remote/chain.py), which the host replaces with the step the
#: training's scores chose: larger than any run's train steps (maxtext.MAX_BATCHES), so it means nothing else.
SENTINEL = 987_654_321_123
#: What a chain's step that had ended before the laptop followed the chain is said to be (not replayed).
ENDED_BEFORE = "ended before this follow"
#: A chain's line for one of its steps (remote/chain.py's `say`).
CHAIN_LINE = re.compile(r"tpu-grpo pipeline: (?P<step>\w+) (?P<what>done|skipped|job|exit)(?: (?P<detail>\S+))?")


def chain_step(run: maxtext.Run, step: str, keep_checkpoint: bool = False) -> dict:
    """One step as remote/chain.py runs it: its job's command and job.json, its done-record and done-test; a save
    asked to keep the checkpoint runs even when done, keeping the model it saved before (`when_done`)."""
    again = save_script(run, keep_checkpoint, replace=False) if step == "save" and keep_checkpoint else ""
    return {
        "name": step,
        "script": save_script(run, keep_checkpoint, replace=True) if step == "save" else maxtext.script(run, step),
        "meta": job_meta(run, step),
        "record": "" if step == "save" else record_key(run, step),
        "test": output_test(run, step),
        "when_done": again,
    }


def checkpoints_listing(run: maxtext.Run) -> str:
    """Bash that prints the names in the run's checkpoint folders (checkpoint_steps, as the host reads them)."""
    where = maxtext.paths(run)
    if in_bucket(run):
        return steps_on_host(where["checkpoints"])
    return Checkpoints.script(where["checkpoints"], *([where["kept"]] if maxtext.VM.keeps_best(run) else []))


def chain_data(run: maxtext.Run, keep_checkpoint: bool) -> dict:
    """What remote/chain.py is given on the host: every step of the run as a job, the export and save chosen as
    `exports` says."""
    run = replace(run, scored_step=None)
    return {
        "jobs": vm_jobs.JOBS,
        "done": vm_jobs.DONE,
        "root": vm_jobs.ROOT,
        "wrapper": remote.text("job_wrapper", ".sh"),
        "steps": [chain_step(run, step) for step in ("convert", "train")],
        **exports(
            run,
            lambda chosen: [chain_step(chosen, step, keep_checkpoint) for step in ("export", "save")],
            checkpoints_listing(run),
        ),
    }


def exports(run: maxtext.Run, render: Callable[[maxtext.Run], list[dict]], listing: str) -> dict:
    """How remote/chain.py chooses the export, on either target: the steps from the export on, rendered by `render` for
    the last checkpoint and, unless the export's step is fixed (--step, --last), for the stand-in of the best scored
    one (SENTINEL); `listing`, bash that prints the names in the run's checkpoint folders; and how its training's log
    is read (progress.py's patterns). `run` has no scored step."""
    variants = {"last": render(run)}
    if not (run.step or run.last):
        variants["best"] = render(replace(run, scored_step=SENTINEL))
    choose = {
        "list": listing,
        "run": run.name,
        "iterations": run.iterations,
        "prefix": progress.ABSL_PREFIX.pattern,
        "pattern": progress.EVAL.pattern,
        "field": progress.EVAL_FIELD.pattern,
        "keys": list(progress.EVAL_KEYS),
    }
    return {"sentinel": SENTINEL, "variants": variants, "choose": choose}


def chain_script(run: maxtext.Run, keep_checkpoint: bool) -> str:
    """The chain's job: its data written beside it, then remote/chain.py, in MaxText's venv, runs the steps."""
    data = json.dumps(chain_data(run, keep_checkpoint), sort_keys=True)
    return "\n".join(
        [
            f"# tpu-grpo pipeline of run {run.name}: convert -> train -> export -> save, each step a job of its own",
            "set -euo pipefail",
            'here=$(dirname "$0")',
            "cat > \"$here/chain.json\" <<'TPU_GRPO_CHAIN_DATA'",
            data,
            "TPU_GRPO_CHAIN_DATA",
            remote.run("chain", python=HOST_PYTHON, command_line='"$here/chain.json"'),
        ]
    )


def chain_meta(run: maxtext.Run) -> dict:
    return {"step": "pipeline", "run": run.name, "key": f"pipeline-{run.name}", "inputs": pipeline_inputs(run)}


def start_chain(connection, run: maxtext.Run, keep_checkpoint: bool) -> str:
    """Start the run's chain as one detached job, refused when the TPU is busy and when the run name was trained
    with other inputs (its claim, under the TPU's lock); returns its job id."""
    job_id = vm_jobs.new_id("pipeline")
    claim = (trained_record(run.name), identity(run, "train"))
    try:
        vm_jobs.start(connection, job_id, chain_script(run, keep_checkpoint), chain_meta(run), claim=claim)
    except vm_jobs.ClaimTaken as taken:
        raise name_taken(run, "trained", taken.found, claim[1]) from None
    return job_id


def not_run(step: str, done: bool) -> StepOutcome:
    """A step the pipeline skips: done before, or before a later step that is done."""
    return (
        StepOutcome(step, "done", detail="done before")
        if done
        else StepOutcome(step, "skipped", detail="a later step is done")
    )


def follow_chain(
    session: vm_jobs.Session,
    run_name: str,
    chain: str,
    follow: Callable[[str, str], int],
    on_step: Callable[[StepOutcome], None],
) -> Outcome:
    """Follow the chain's lines to its end, each step's job through `follow` (job id, step) as it starts (a step that
    had ended before this follow began is said, not replayed); a failed step's error names its log's last lines."""
    outcome = Outcome(run_name, session.host.name)
    pending = [b""]
    so_far = vm_jobs.read_log(session.connection, chain).decode(errors="replace").splitlines()
    ended = {
        said["step"]: int(said["detail"])
        for line in so_far
        if (said := CHAIN_LINE.fullmatch(line.strip())) and said["what"] == "exit"
    }

    def on_bytes(data: bytes) -> None:
        *lines, pending[0] = (pending[0] + data).split(b"\n")
        for line in lines:
            said = CHAIN_LINE.fullmatch(line.decode(errors="replace").strip())
            if said is None or said["what"] == "exit":
                continue
            step = said["step"]
            if said["what"] == "job":
                code = ended[step] if step in ended else follow(said["detail"], step)
                detail = saved_dir(run_name) if step == "save" else ENDED_BEFORE if step in ended else ""
                outcome.steps.append(StepOutcome(step, "ran" if code == 0 else "failed", said["detail"], code, detail))
            else:
                outcome.steps.append(not_run(step, done=said["what"] == "done"))
            on_step(outcome.steps[-1])

    code = vm_jobs.follow(session, chain, on_bytes)
    failed = [step for step in outcome.steps if step.state == "failed"]
    if failed:
        raise failure(session.connection, failed[-1].job or chain, failed[-1].name, failed[-1].exit_code or code)
    if code != 0:
        raise failure(session.connection, chain, "the pipeline", code)
    if any(step.name == "save" and step.state == "ran" for step in outcome.steps):
        outcome.saved = saved_dir(run_name)
    return outcome


def run_pipeline(
    session: vm_jobs.Session,
    run: maxtext.Run,
    *,
    need_gb: dict[str, float],
    follow: Callable[[str, str], int],
    on_step: Callable[[StepOutcome], None] = lambda step: None,
    keep_checkpoint: bool = False,
) -> Outcome:
    """Bring the run to `save` by its chain, skipping done steps; `follow(job_id, step)` streams a job to its exit
    code. A run name that was trained or saved with other inputs is refused before anything starts; a chain of the
    run that runs already is followed, and a step of it started alone is followed to its end first. The run is
    named (named_pipeline)."""
    run = scored(session.connection, run)  # what a done export and save were made of (the chain chooses again)
    probed = probe(session.connection, run)
    probed.check_name(run)
    done = probed.done
    if keep_checkpoint:  # save again: what it saved before is verified and kept, the checkpoint added
        done.discard("save")
    last_done = max((PIPELINE.index(step) for step in done), default=-1)
    attach = running_jobs(session.connection, run)
    chain = attach.pop("pipeline", None)
    if chain is None and last_done == len(PIPELINE) - 1:
        outcome = Outcome(run.name, session.host.name)
        for step in PIPELINE:
            outcome.steps.append(not_run(step, done=step in done))
            on_step(outcome.steps[-1])
        return outcome
    if chain is None:
        for step, job in attach.items():  # a step started alone (invoke train): the chain starts after it
            if (code := follow(job.id, step)) != 0:
                raise failure(session.connection, job.id, step, code)
        if not attach:
            preflight(session.connection, run, need_gb, check_tpu=last_done < PIPELINE.index("export"))
        write_record(session.connection, run)
    chain_id = chain.id if chain else start_chain(session.connection, run, keep_checkpoint)
    return follow_chain(session, run.name, chain_id, follow, on_step)


def build_run(
    chosen: settings.Settings,
    *,
    batches=None,
    run_name: str | None = None,
    sets: list[str] | None = None,
    default_step: str | None = None,
    step=None,
) -> maxtext.Run:
    """A Run from the stack's settings and the task's flags, every flag validated before any connection.
    `default_step`: the one step a step task runs (its `--set`s are that step's); None for the pipeline. A run not
    named is named by its start time for a conversion or a training; an export's or a pipeline's is resolved where
    it runs (Run.run_name)."""
    run = maxtext.Run.of(
        chosen.training,
        batches=maxtext.check_count("--batches", batches) if batches is not None else chosen.batches,
        run_name=(
            maxtext.check_run_name(run_name)
            if run_name is not None
            else maxtext.timestamp_run_name()
            if default_step in ("convert", "train")
            else None
        ),
        sets=maxtext.parse_sets(sets, default_step),
        step=maxtext.check_count("--step", step) if step is not None else None,
    )
    examples = run.report_examples.stop  # the choosing examples, then the report's
    if (run.dataset or DEFAULT_DATASET) == DEFAULT_DATASET and examples > DEFAULT_DATASET_TEST_ROWS:
        room = max(0, DEFAULT_DATASET_TEST_ROWS // run.eval_batch_size - run.test_batches)
        raise SettingsError(
            f"{PROJECT}:testBatches",
            run.test_batches,
            f"and reportBatches {run.report_batches} take {examples} test examples at {run.eval_batch_size} a batch, "
            f"and GSM8K's test split has {DEFAULT_DATASET_TEST_ROWS} (MaxText would score fewer without a word)",
            f"pulumi config set {PROJECT}:reportBatches {room} (or fewer testBatches)",
        )
    return run


def trained_runs(connection) -> list[dict]:
    """The runs whose training finished, oldest first, with the inputs they were trained with."""
    return [job.meta for job in vm_jobs.list_jobs(connection) if job.step == "train" and job.exit_code == 0]


def _trained_as(meta: dict, asked: maxtext.Run) -> maxtext.Run:
    """The run a training job ran, from its record; a job recorded before records held the whole run: from its
    inputs, what it trained on (the model, tokenizer, data and loss), filled in with the run asked for."""
    if "record" in meta:
        return maxtext.Run.from_record(meta["record"])
    inputs = meta["inputs"]
    said = maxtext.trained_on(inputs)
    return replace(
        asked,
        run_name=meta["run"],
        model=said["model"],
        tokenizer=said["tokenizer"],
        dataset=said["dataset"],
        dataset_config=said["dataset_config"],
        loss_algo=said["loss"],
        batches=inputs["batches"],
        test_batches=inputs["test_batches"],
        sets={**asked.sets, "train": inputs.get("train_set", {})},
        store=stores.STORES.get(inputs.get("store", "shm"), asked.store),
    )


def training_lines(connection, run_name: str, jobs: list[vm_jobs.Job] | None = None) -> list[str]:
    """The log lines of a run's trainings on the host (among `jobs`, else all), oldest first: a resumed training's
    attempts all count."""
    return [
        line
        for job in (vm_jobs.list_jobs(connection) if jobs is None else jobs)
        if job.step == "train" and job.run == run_name
        for line in vm_jobs.read_log(connection, job.id).decode(errors="replace").splitlines()
    ]


def scored(connection, run: maxtext.Run) -> maxtext.Run:
    """The run with its best scored checkpoint (progress.best over its trainings' intermediate evaluations and the
    checkpoints in its store) when the export's step is not chosen (`--step`, `--last`) and a training of it
    finished; else the run as it is (its export then takes the last checkpoint)."""
    if run.step or run.last or run.run_name is None:
        return run
    jobs = vm_jobs.list_jobs(connection)
    if not any(job.step == "train" and job.run == run.run_name and job.exit_code == 0 for job in jobs):
        return run
    return best_of(run, training_lines(connection, run.run_name, jobs), checkpoint_steps(connection, run))


def best_of(run: maxtext.Run, lines: list[str], checkpoints: list[int]) -> maxtext.Run:
    """The run with the checkpoint its trainings' log lines score best among `checkpoints` (progress.best) as its
    scored step; else as it is, exporting its last. A VM's export and a slice's choose by this."""
    found = progress.best(progress.parse_lines(lines), checkpoints, run.iterations)
    return replace(run, scored_step=progress.scored_step(found, run.iterations)) if found and found.step else run


def export_choice(
    run: maxtext.Run,
    trained: list[tuple[str, maxtext.Run | None]],
    lines: Callable[[str], list[str]],
    steps_of: Callable[[maxtext.Run], list[int]],
    where: str,
) -> maxtext.Run:
    """The run an export converts, on either target: the one named, else the newest whose training finished
    (`trained`: each such run's name and run, None when its record predates whole records), at the step asked
    (`--step`, `--last`), else at the one its trainings' log `lines` score best among `steps_of` it (best_of), else
    its last; refused, nothing started, when that checkpoint is not in its store."""
    found = [(name, made) for name, made in trained if run.run_name in (None, name)]
    if not found:
        which = "any run" if run.run_name is None else f"run {run.run_name!r}"
        raise NotReady(
            f"no finished training for {which} {where}; fix: uv run invoke train --batches 50 (or name a trained "
            "run: uv run invoke status)"
        )
    name, made = found[-1]
    run = run.export_of(made) if made else replace(run, run_name=name)
    steps = steps_of(run)
    if made is None and steps:  # its batches unknown: its newest checkpoint is its last
        run = replace(run, step=run.step or steps[-1])
    elif not (run.step or run.last):
        run = best_of(run, lines(run.name), steps)
    if run.export_step not in steps:
        cleared = " (was /dev/shm cleared by a restart?)" if run.store.name == "shm" else ""
        raise BadFlag(
            f"run {run.name} has no checkpoint at step {run.export_step} in {maxtext.paths(run)['checkpoints']}; it "
            f"has: {', '.join(map(str, steps)) or 'none' + cleared}; fix: --step {steps[-1] if steps else 'N'}"
        )
    return run


def for_export(connection, run: maxtext.Run) -> maxtext.Run:
    """The run to export on the host (export_choice), from its training jobs' records and logs."""
    return export_choice(
        run,
        [(meta["run"], _trained_as(meta, run)) for meta in trained_runs(connection)],
        lambda name: training_lines(connection, name),
        lambda chosen: checkpoint_steps(connection, chosen),
        "on this host",
    )


def require_converted(connection, run: maxtext.Run) -> None:
    checkpoint = maxtext.paths(run)["checkpoint"]
    if not present(connection, run, checkpoint):
        raise PipelineError(
            f"no converted checkpoint at {checkpoint}; fix: uv run invoke convert "
            "(or uv run invoke pipeline, which converts first)"
        )


def start_checked(connection, run: maxtext.Run, step: str) -> str:
    """Start one step on its own, after checking its input is there (nothing starts otherwise), and that an idle stop
    cannot take what it makes before anything saves it."""
    if step == "train":
        require_converted(connection, run)
        refuse_unsaved_training(connection, run)
    return start_step(connection, run, step)


def refuse_unsaved_training(connection, run: maxtext.Run) -> None:
    """A training alone keeps its checkpoints in /dev/shm, which an idle stop empties (it powers the VM off an idle
    while after the training, whether or not anyone exported it); a pipeline saves the model first."""
    if run.store.name != "shm" or not (idle := watch.IdleStop.read(connection)):
        return
    raise UserError(
        f"a training alone keeps its checkpoints in /dev/shm, and this VM powers itself off {idle['idle_minutes']} "
        "idle minutes after its last job, which empties it; fix: uv run invoke pipeline (it exports and saves the "
        "model on the data disk before the VM can stop), or set tpu-grpo:checkpointStore disk"
    )

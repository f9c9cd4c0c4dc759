"""`invoke publish`: a saved run's model to the Hugging Face Hub, with a model card.

The upload runs on the host (tpu_grpo/host/remote/hub.py), as a detached job: the model (16 GB) and the
token are there, and the VM's uplink is the fast one. Before anything is written or uploaded, the
host asks the Hub whether its token may write the repo (refused in one line with the fix), and
creates the repo if it is missing. The card is written beside the saved model (listed in its
SHA256SUMS, so `fetch` brings it home) and uploaded with it; only files the Hub does not hold yet
are sent, so a re-run uploads nothing.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import asdict, dataclass, field

import yaml
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from tpu_grpo.catalog.accelerators import MACHINES
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.catalog.models import DEFAULT_DATASET, MODELS
from tpu_grpo.config import host_paths, laptop_paths, stack_file, values
from tpu_grpo.config.errors import UserError
from tpu_grpo.host import artifacts, hosts, remote
from tpu_grpo.jobs import maxtext, pipeline, vm_jobs, watch
from tpu_grpo.jobs.progress import RUN_LOG_LINES, Eval, Report, parse_line, report, scored_step, startup, startup_text
from tpu_grpo.results import retrieval

TAGS = ("grpo", "maxtext", "tpu", "reinforcement-learning", "tpu-grpo")
REFUSED_EXIT = 3
_PLAN = re.compile(r"tpu-grpo: publish (\d+) files, (\d+) bytes, to \S+ \((\d+) already there\)")
_SENT = re.compile(r"tpu-grpo: sent (\S+) (\d+)$")
_UPLOADED = re.compile(r"tpu-grpo: uploaded (\S+) (\d+)$")
_COMMITTED = re.compile(r"tpu-grpo: committed (\S+) (\S+)$")


class PublishError(UserError):
    """The Hub refused the token or the repo; nothing was written or uploaded (exit 2)."""


class UploadFailed(UserError):
    """The upload job failed on the host: the flags were right (exit 1); a re-run goes on."""

    exit_code = 1


def check_repo(text: str) -> str:
    """`--repo OWNER/NAME` as the Hub names repositories: the one rule of Hub ids (values.hub_id)."""
    return values.flag("--repo", text, values.hub_id, "your-name/Llama-3.1-8B-Instruct-GRPO")


def license_note(repo_id: str, license_id: str) -> str | None:
    """The Llama 3.1 license asks that a model built from Llama and shared be named starting with "Llama"."""
    name = repo_id.split("/")[1]
    if license_id != "llama3.1" or name.lower().startswith("llama"):
        return None
    return (
        f'note: the Llama 3.1 license asks that a model built with Llama be named starting with "Llama" '
        f"(e.g. --repo {repo_id.split('/')[0]}/Llama-{name})"
    )


def _environment(hub: str | None) -> list[str]:
    """The Hub program's environment on the host: the token from its file, the Hub, no tqdm bars in a log."""
    lines = maxtext.token_lines(needed=True) + ["export HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONUNBUFFERED=1"]
    return lines + ([f"export HF_ENDPOINT={hub}"] if hub else [])


def hub_script(given: dict, hub: str | None) -> str:
    """Bash that runs remote/hub.py with its data `given` in the MaxText venv (its huggingface_hub)."""
    return (
        "\n".join(
            [
                "set -eo pipefail",
                *_environment(hub),
                remote.run("hub", given, python=f"{host_paths.VENV}/bin/python"),
            ]
        )
        + "\n"
    )


@dataclass
class Facts:
    """What the card says, read from the host: the run's records, its trainings, their evals."""

    run: str
    trained: dict
    saved: dict
    capacity: str
    maxtext_version: str
    train_seconds: float
    trainings: int
    pre: Eval | None = None
    post: Eval | None = None
    startup: dict | None = None  # the last training's start (tpu_grpo.jobs.progress.startup)
    intermediate: list[Eval] = field(default_factory=list)  # every training's, oldest first
    report: Report | None = None  # the newest export's score of its checkpoint on the report examples

    @property
    def exported(self) -> Eval | None:
        """The evaluation of the weights the saved model holds: the intermediate one after its checkpoint's batch
        when it is not the last (the best scored: pipeline.scored), else the evaluation after training."""
        if self.exports_the_last:
            return self.post
        step, iterations = self.saved.get("step"), self._iterations
        return next((e for e in reversed(self.intermediate) if scored_step(e, iterations) == step), None)

    @property
    def _iterations(self) -> int:
        return maxtext.iterations(self.trained.get("train_set", {}))

    @property
    def exports_the_last(self) -> bool:
        return self.saved.get("step") == int(self.trained.get("batches") or 0) * self._iterations


def facts(connection, run: str) -> Facts:
    """Two round trips: the run's training jobs, then their eval lines, its records and MaxText's version."""
    jobs = [job for job in vm_jobs.list_jobs(connection) if job.run == run]
    trainings = [job for job in jobs if job.step == "train"]
    exports = [job for job in jobs if job.step == "export" and job.finished and job.exit_code == 0]
    lines = [
        f"echo job {job.id}; grep -aE '{RUN_LOG_LINES}' {vm_jobs.JOBS}/{job.id}/log || true"
        for job in [*trainings, *exports]
    ]
    for kind, path in (("trained", pipeline.trained_record(run)), ("saved", pipeline.saved_record(run))):
        lines.append(f"[ -f {path} ] && echo {kind} $(base64 -w0 {path})")
    lines.append(
        f"echo maxtext $({remote.run('maxtext_version', python=f'{host_paths.VENV}/bin/python')}\n"
        ") 2>/dev/null || echo maxtext unknown"
    )
    answer = hosts.run_script(connection, "\n".join(lines) + "\ntrue").stdout
    return read_facts(run, trainings, answer, exports[-1].id if exports else None)


def read_facts(run: str, trainings: list, answer: str, export: str | None = None) -> Facts:
    """The facts in the host's answer to `facts`' script, for the run's training jobs (oldest first): before
    training as the first training measured it, after as the last one did; the report evaluation of its newest
    successful export (job id `export`) when it scored the saved model's step."""
    records: dict[str, dict] = {}
    evals: dict[str | None, list[Eval]] = {}
    logs: dict[str | None, list[str]] = {}
    version = "unknown"
    job = None
    for line in answer.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("trained", "saved"):
            records[kind] = json.loads(base64.b64decode(rest))
        elif kind == "maxtext":
            version = rest.strip()
        elif kind == "job":
            job = rest
        else:
            logs.setdefault(job, []).append(line)
            if isinstance(event := parse_line(line), Eval):
                evals.setdefault(job, []).append(event)
    if "saved" not in records:
        raise artifacts.HostStateError(
            f"run {run} has no saved model on this host; fix: uv run invoke pipeline "
            f"--run-name {run} (it exports and saves it), or pick one from uv run invoke "
            "status"
        )
    finished = [job for job in trainings if job.finished]
    reported = report(logs.get(export, [])) if export else None
    first = evals.get(trainings[0].id, []) if trainings else []
    last = evals.get(trainings[-1].id, []) if trainings else []
    return Facts(
        run=run,
        trained=records.get("trained", records["saved"]),
        saved=records["saved"],
        capacity=trainings[-1].meta.get("capacity", "unknown") if trainings else "unknown",
        maxtext_version=version,
        train_seconds=sum(job.finished - job.started for job in finished),
        trainings=len(trainings),
        pre=next((e for e in first if e.stage == "pre"), None),
        post=next((e for e in reversed(last) if e.stage == "post"), None),
        intermediate=[e for job in trainings for e in evals.get(job.id, []) if e.stage == "intermediate"],
        report=reported if reported and reported.step == records["saved"].get("step") else None,
        startup=startup(logs.get(trainings[-1].id, []), time.gmtime(trainings[-1].started).tm_year)
        if trainings
        else None,
    )


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _score(found: Eval | None, field_name: str) -> str:
    if found is None:
        return "not measured"
    value = getattr(found, field_name)
    return f"{value:g}% ({found.correct}/{found.total})" if field_name == "accuracy" else f"{value:g}%"


def _cost(train_seconds: float, machine, capacity: str) -> str:
    """The training's chip-hours at the capacity's price, with the price's source; what is not known, said."""
    row = CAPACITIES.get(capacity)
    if not machine or not row:
        return "not known (machine or capacity unrecorded)"
    chip_hours = train_seconds / 3600 * machine.chips
    return (
        f"{chip_hours:.2f} chip-hours of training at the {capacity} price: ${row.cost_usd(chip_hours):,.2f} "
        f"({row.price_source})"
    )


def card(found: Facts) -> str:
    """The model card: the Hub's YAML metadata, then what was trained, on what, how long, and how it scored."""
    given = maxtext.trained_on(found.trained)
    row = MODELS[given["model"]]
    base = row.hf_id
    dataset, subset, loss, tokenizer = given["dataset"], given["dataset_config"], given["loss"], given["tokenizer"]
    metadata = {
        "base_model": base,
        "base_model_relation": "finetune",
        "datasets": [dataset],
        "library_name": "transformers",
        "license": row.license,
        "pipeline_tag": "text-generation",
        "tags": [*TAGS[:4], dataset.split("/")[-1].lower(), *TAGS[4:]],
    }
    train_set = found.trained.get("train_set", {})
    grpo = {**maxtext.GRPO_DEFAULTS, **train_set}
    machine = MACHINES.get(found.trained.get("machine", ""))
    hardware = (
        f"{machine.machine_type} ({machine.accelerator_type}, {machine.chips} chips)"
        if machine
        else found.trained.get("machine", "unknown")
    )
    sets = [
        f"`{step}:{key}={value}`"
        for step, values in (
            ("convert", found.trained.get("convert_set", {})),
            ("train", train_set),
            ("export", found.saved.get("export_set", {})),
        )
        for key, value in values.items()
    ]
    again = retrieval.finish_command({"run": found.run, "inputs": found.trained})
    rows = [
        ("method", f"GRPO, MaxText {found.maxtext_version} (`maxtext.trainers.post_train.rl.train_rl`)"),
        ("base model", f"[{base}](https://huggingface.co/{base})"),
        (
            "dataset",
            f"[{dataset}](https://huggingface.co/datasets/{dataset})"
            + (f" (`{subset}`)" if subset else "")
            + ", MaxText's math reward",
        ),
        ("loss", f"{loss} (`rl.loss_algo`)"),
        ("tokenizer", f"[{tokenizer}](https://huggingface.co/{tokenizer}), in the export too"),
        ("batches", f"{found.trained.get('batches')} (`num_batches`), batch size {grpo['batch_size']}"),
        ("generations per prompt", f"{grpo['rl.num_generations']} (`rl.num_generations`)"),
        ("learning rate", f"{grpo['learning_rate']} (`learning_rate`)"),
        ("KL coefficient beta", f"{grpo['rl.grpo_beta']} (`rl.grpo_beta`)"),
        ("clipping epsilon", f"{grpo['rl.grpo_epsilon']} (`rl.grpo_epsilon`)"),
        ("iterations per batch", f"{grpo['rl.num_iterations']} (`rl.num_iterations`)"),
        ("every `--set`", ", ".join(sets) or "none"),
        (
            "checkpoint exported",
            f"step {found.saved.get('step')}, as `{found.saved.get('export_model')}` in "
            f"{found.saved.get('export_set', {}).get('weight_dtype', 'bfloat16')}",
        ),
        ("machine", hardware),
        ("capacity", found.capacity),
        (
            "training time",
            f"{_duration(found.train_seconds)} in {found.trainings} training job{'s' if found.trainings != 1 else ''}",
        ),
        ("cost", _cost(found.train_seconds, machine, found.capacity)),
        ("start-up", startup_text(found.startup) or "not in the log"),
    ]
    tested = found.report.score if found.report else None
    evals = [
        (label, _score(found.pre, name), _score(found.exported, name), _score(tested, name))
        for label, name in (
            ("accuracy", "accuracy"),
            ("partial accuracy", "partial_accuracy"),
            ("format accuracy", "format_accuracy"),
        )
    ]
    named = "GSM8K" if dataset == DEFAULT_DATASET else dataset
    method = "GRPO (Group Relative Policy Optimization)" if loss == "grpo" else f"GRPO with the {loss} loss"
    llama = row.license == "llama3.1"
    body = [
        f"# {found.run}: {base.split('/')[-1]} trained with {'GRPO' if loss == 'grpo' else loss} on {named}",
        "",
        f"[{base}](https://huggingface.co/{base}) post-trained with {method} "
        f"on the {named} training set with [MaxText](https://github.com/AI-Hypercomputer/maxtext) "
        f"{found.maxtext_version} on a Cloud TPU v6e, by tpu-grpo (run `{found.run}`)."
        + (" Built with Llama." if llama else ""),
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in rows),
        "",
        "## Evaluation",
        "",
        f"MaxText's own {named} evaluation (greedy), as the logs report it. The training scored the model before "
        f"training and after each checkpoint's batch on {found.trained.get('test_batches')} batches of the test "
        "split (`num_test_batches`), and the exported checkpoint "
        f"(step {found.saved.get('step')}, "
        + ("the last" if found.exports_the_last else "the best scored")
        + ") was chosen on them. "
        + (
            f"The report set, test examples {found.report.start} to {found.report.stop} of MaxText's shuffled test "
            "split, chose nothing: its score is the one to quote."
            if found.report
            else "It was not scored on a report set (tpu-grpo:reportBatches 0, or its export ran elsewhere)."
        ),
        "",
        "| | before | exported, as chosen | exported, report set |",
        "|---|---|---|---|",
        *(f"| {label} | {before} | {after} | {tested} |" for label, before, after, tested in evals),
        "",
        "## Reproduce",
        "",
        "With tpu-grpo, from a checkout and a stack of your own:",
        "",
        "```",
        again,
        "```",
        "",
        "## License",
        "",
        (
            "Llama 3.1 is licensed under the Llama 3.1 Community License, Copyright (c) Meta "
            "Platforms, Inc. All Rights Reserved. This model is a derivative of it and is shared under "
            "the same terms."
            if llama
            else f"A derivative of {base}, shared under its license (`{row.license}`)."
        ),
        "",
    ]
    return "---\n" + yaml.safe_dump(metadata, sort_keys=False) + "---\n\n" + "\n".join(body)


def write_card(connection, run: str, text: str) -> str:
    """Put the card beside the saved model, as README.md listed in its SHA256SUMS; returns its path."""
    folder = pipeline.saved_dir(run)
    card = base64.b64encode(text.encode()).decode()
    result = hosts.run_script(connection, remote.shell("write_card", FOLDER=folder, CARD=card, SUMS=artifacts.SUMS))
    if result.exited != 0:
        raise UploadFailed(f"writing the model card in {folder} failed: {result.stderr.strip()[-300:]}")
    return f"{folder}/README.md"


def check_hub(connection, repo_id: str, private: bool, hub: str | None) -> dict:
    """The host asks the Hub: may its token write the repo? If so, the repo is made when missing."""
    result = hosts.run_script(connection, hub_script({"command": "check", "repo": repo_id, "private": private}, hub))
    answer = {}
    for line in result.stdout.splitlines()[::-1]:
        try:
            answer = json.loads(line)
            break
        except ValueError:
            continue
    if result.exited == REFUSED_EXIT:
        raise PublishError(answer.get("error", "the Hub refused"))
    if result.exited != 0 or "user" not in answer:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UploadFailed(
            f"asking the Hub from the host failed (exit {result.exited}): {tail[0]}; fix: check "
            "that the VM reaches the Hub, and that huggingface_hub is in the venv (uv run invoke "
            "provision)"
        )
    return answer


@dataclass
class Outcome:
    run: str
    repo: str
    url: str
    job: str
    created: bool
    private: bool
    card: str
    uploaded: list[str] = field(default_factory=list)  # in a commit on the Hub
    bytes_uploaded: int = 0
    bytes_sent: int = 0  # sent so far, the commit still to come
    already_there: int = 0
    commit: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


class UploadView(watch.LogView):
    """The upload job's log: a progress bar over the bytes to send (a step per file)."""

    def __init__(self, console: Console, job_id: str, outcome: Outcome, verbose: bool):
        self.outcome, self.verbose = outcome, verbose
        super().__init__(
            console,
            job_id,
            Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
            ),
        )
        self.task = self.progress.add_task(f"publish {outcome.run}", total=None)

    def _line(self, line: str) -> None:
        if match := _PLAN.match(line):
            self.outcome.already_there = int(match[3])
            self.progress.update(self.task, total=int(match[2]), completed=0)
            self.progress.console.print(line.removeprefix("tpu-grpo: "))
        elif match := _SENT.match(line):
            self.outcome.bytes_sent += int(match[2])
            self.progress.update(self.task, completed=self.outcome.bytes_sent)
        elif match := _UPLOADED.match(line):
            self.outcome.uploaded.append(match[1])
            self.outcome.bytes_uploaded += int(match[2])
        elif match := _COMMITTED.match(line):
            self.outcome.commit = match[1]
        elif line.startswith("tpu-grpo: "):
            self.progress.console.print(line.removeprefix("tpu-grpo: "))
        elif self.verbose or watch.SHOWN.search(line):
            self.progress.console.print(line, markup=False, highlight=False)


def publish(
    session: vm_jobs.Session, run: str | None, repo_id: str, private: bool, console: Console, verbose: bool = False
) -> Outcome:
    """Check with the Hub, write the card, then upload in a detached job and follow it."""
    hub = stack_file.hub_endpoint()
    connection = session.connection
    run = run or retrieval.newest_saved(connection)
    found = facts(connection, run)
    if note := license_note(repo_id, MODELS[maxtext.trained_on(found.trained)["model"]].license):
        console.print(note)
    answer = check_hub(connection, repo_id, private, hub)
    path = write_card(connection, run, card(found))
    job_id = vm_jobs.new_id("publish")
    script = hub_script({"command": "upload", "repo": repo_id, "folder": pipeline.saved_dir(run)}, hub)
    vm_jobs.start(connection, job_id, script, {"step": "publish", "run": run, "repo": repo_id})
    outcome = Outcome(
        run, repo_id, f"{hub or 'https://huggingface.co'}/{repo_id}", job_id, answer["created"], answer["private"], path
    )
    console.print(
        f"publish {run} -> {outcome.url} ({'private' if outcome.private else 'public'}, "
        f"{'created now' if outcome.created else 'exists'}), job {job_id} on {session.host.name}"
    )
    with UploadView(console, job_id, outcome, verbose) as view:
        code = vm_jobs.follow(session, job_id, view.feed, on_reconnect=view.note)
    if code != 0:
        tail = view.path.read_text(errors="replace").strip().splitlines()[-5:]  # the log as followed
        raise UploadFailed(
            f"the upload failed (job {job_id}, exit {code}); last lines of its log:\n"
            + "\n".join(f"  {line}" for line in tail)
            + "\nfix the cause, then run the same command again: files already on the Hub are "
            "not sent again"
        )
    # what `invoke runs` and `down` say of the run on the Hub, unasked
    laptop_paths.write_record(
        laptop_paths.published_record(run), {"run": run, "repo": repo_id, "url": outcome.url, "commit": outcome.commit}
    )
    return outcome

"""Results that are never lost: which runs on the host are not yet on this laptop (what
`invoke down` guards), fetching a saved model with checksums, and a run's metrics.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from pathlib import Path

from rich.console import Console

from tpu_grpo.config import laptop_paths, stack_file, values
from tpu_grpo.host import artifacts, facts, gcs, hosts
from tpu_grpo.jobs import maxtext, pipeline, progress, vm_jobs


def destination(run: str | None, to: str | None) -> Path:
    """Where fetch writes, checked writable (and nothing made) before anything connects."""
    if run is not None:
        maxtext.check_run_name(run, "--run")
    return artifacts.check_destination(to if to is not None else str(stack_file.project_root() / "models"))


def check_metrics_flags(
    run: str | None,
    out: str | None,
    events: str | None,
    force: bool,
    compare: list[str] | None = None,
    log: str | None = None,
) -> Path | None:
    """`invoke metrics`' flags, checked before anything is read or connected; returns the --out path."""
    from tpu_grpo.results import metrics

    if run is not None:
        maxtext.check_run_name(run, "--run")
    for name in compare or []:
        maxtext.check_run_name(name, "--compare")
    if compare and len(set(compare)) < len(compare):
        twice = next(name for name in compare if compare.count(name) > 1)
        raise metrics.MetricsError(
            f"--compare {twice!r} names the same run twice; fix: name each run once, e.g. --compare RUN1 --compare RUN2"
        )
    if compare and len(compare) < 2:
        raise metrics.MetricsError(
            f"--compare {compare[0]!r} names one run, and a comparison takes two or more; fix: e.g. --compare "
            f"{compare[0]} --compare RUN2"
        )
    if compare and (run is not None or events is not None):
        given = "--run" if run is not None else "--events"
        raise metrics.MetricsError(
            f"--compare compares runs of the host, and {given} names one run (or a local folder); fix: leave out "
            f"{given}, or --compare"
        )
    if events is not None:
        values.flag(
            "--events", events, values.existing_folder, "", "give the run's tensorboard folder, copied from the VM"
        )
    if log is not None and events is None:
        raise metrics.MetricsError(
            f"--log {log!r} is the log of a local --events folder (the host's run brings its own); "
            "fix: add --events FOLDER, or leave --log out"
        )
    if log is not None:
        values.flag(
            "--log", log, values.existing_file, "", "give the training's log, e.g. .tpu-grpo/runs/RUN/train.log"
        )
    return metrics.check_plot_path(out, force) if out is not None else None


def is_published(run: str) -> bool:
    """The Hub acknowledged a commit of the run's model (recorded by this laptop's `invoke publish`): it is safe
    there, whatever becomes of the VM."""
    return bool(laptop_paths.read_record(laptop_paths.published_record(run)).get("commit"))


def _runs(answer: facts.Answer) -> dict[str, dict | None]:
    runs: dict[str, dict | None] = {}
    for line in answer.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "saved" and not rest.endswith(".partial"):
            runs[rest] = None
        elif kind == "trained":
            meta = json.loads(base64.b64decode(rest))
            runs.setdefault(meta["run"], meta)
    return runs


class RunsOnHost(facts.Fact):
    """Every run with a trained model on the host -> None when saved on the data disk, else the training's record
    (its inputs): the model is then only in the checkpoint store, not saved."""

    script = staticmethod(
        lambda: (
            f"ls -1 {pipeline.MODELS} 2>/dev/null | sed 's/^/saved /'; "
            f'for f in {vm_jobs.DONE}/train-*; do [ -f "$f" ] && echo trained $(base64 -w0 "$f"); done; true'
        )
    )
    parse = staticmethod(_runs)


def finish_command(meta: dict) -> str:
    """The pipeline command that exports and saves a trained run: its name and the flags it was trained with."""
    inputs = meta["inputs"]
    sets = "".join(
        f" --set train:{key}={shlex.quote(str(value))}" for key, value in inputs.get("train_set", {}).items()
    )
    return f"uv run invoke pipeline --run-name {meta['run']} --batches {inputs['batches']}{sets}"


def is_fetched(run: str) -> bool:
    folder = laptop_paths.recorded_folder(laptop_paths.read_record(laptop_paths.fetched_record(run)))
    return folder is not None and artifacts.verify_local(folder)


def unfetched(session: vm_jobs.Session) -> list[str]:
    """A line for each run whose model would die with the VM, with the command that saves it."""
    return only_on_the_vm(RunsOnHost.read(session.connection))


def only_on_the_vm(runs: dict[str, dict | None]) -> list[str]:
    """A line for each of the host's runs (RunsOnHost) that is nowhere else: not fetched to this laptop with its
    checksums intact, not published to the Hub with a commit it acknowledged."""
    lines = []
    for run, trained in sorted(runs.items()):
        if is_fetched(run) or is_published(run):
            continue
        if trained is None:
            lines.append(f"run {run}: saved on the data disk only; fix: uv run invoke fetch --run {run}")
        else:
            lines.append(
                f"run {run}: trained, not saved (in /dev/shm, if its store is shm); "
                f"fix: {finish_command(trained)} "
                f"(exports and saves it), then uv run invoke fetch --run {run}"
            )
    return lines


def newest_saved(connection) -> str:
    result = hosts.run_script(connection, f"ls -1t {pipeline.MODELS} 2>/dev/null | grep -v '[.]partial$' | head -1")
    name = result.stdout.strip()
    if not name:
        raise artifacts.HostStateError(
            "no saved model on this host yet; fix: uv run invoke pipeline --batches 50 (it exports and saves the model)"
        )
    return name


def fetch_run(session: vm_jobs.Session, run: str | None, folder: Path, console: Console):
    """Download the run's saved model into `folder` (models/RUN unless --to), with a progress bar."""
    connection = session.connection
    run = run or newest_saved(connection)
    with hosts.busy(connection, "fetch"):  # a long fetch keeps the VM from stopping itself under it
        return _fetch(
            run,
            folder,
            session.host.name,
            console,
            lambda target, progress: artifacts.fetch(
                connection, pipeline.saved_dir(run), target, progress, host=session.host
            ),
        )


def fetch_from_bucket(url: str, run: str, folder: Path, console: Console):
    """A slice's exported model from its run's folder in the bucket into `folder` (models/RUN unless --to)."""
    return _fetch(run, folder, url, console, lambda target, progress: gcs.fetch_folder(url, target, progress))


def _fetch(run: str, folder: Path, source: str, console: Console, download):
    """A run's model into `folder` (models/RUN unless --to) by `download(target, progress)`, with a progress bar,
    recorded as fetched (for `down`'s guard and `invoke timeline`)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    target = folder / run if folder == stack_file.project_root() / "models" else folder
    artifacts.check_destination(target)
    started = time.time()
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"fetch {run}", total=None)
        result = download(target, lambda done, total, name: bar.update(task, completed=done, total=total))
    laptop_paths.write_record(
        laptop_paths.fetched_record(run),
        {"run": run, "host": source, "dir": str(target.resolve()), "started": started, "finished": time.time()},
    )
    console.print(
        f"run {run}: {len(result.files)} files in {target}, checksums verified "
        f"({result.bytes_transferred} bytes transferred, {len(result.skipped)} already here)"
    )
    return result


def metrics_from_bucket(run_url: str, run: str, train_log: bytes, iterations: int, out: Path | None):
    """A slice run's metrics: its TensorBoard events from the bucket, its eval lines from the training log."""
    _events_from_bucket(f"{run_url}/tensorboard", run)
    return _load_and_plot(run, train_log, iterations, out)


def _iterations(job: vm_jobs.Job) -> int:
    """rl.num_iterations of a training job, as its record keeps its `--set`s."""
    return maxtext.iterations(job.meta.get("inputs", {}).get("train_set", {}))


def _train_job(connection, run: str | None) -> vm_jobs.Job:
    trained = [
        job
        for job in vm_jobs.list_jobs(connection)
        if job.step == "train" and job.state != "running" and (run is None or job.run == run)
    ]
    if not trained:
        which = f"run {run!r}" if run else "any run"
        raise vm_jobs.JobError(f"no training of {which} on this host; fix: name a run from uv run invoke status")
    return trained[-1]


def _events_folder(connection, sftp, job: vm_jobs.Job) -> tuple[str, list]:
    """The run's TensorBoard folder on the host and its event files (SFTP attributes): in the
    checkpoint store while the run is there (/dev/shm empties at a restart), else the copy `save`
    made on the data disk."""
    from tpu_grpo.results import metrics

    live = f"{job.meta['paths']['run']}/tensorboard"
    archived = f"{pipeline.run_archive(job.run)}/tensorboard"
    for folder in (live, archived):
        remote = hosts.run_script(connection, f"cd {folder} 2>/dev/null && pwd").stdout.strip()
        if remote:
            found = [entry for entry in sftp.listdir_attr(remote) if entry.filename.startswith("events.")]
            if found:
                return remote, found
    raise metrics.MetricsError(
        f"no TensorBoard events of run {job.run} in {live} (/dev/shm does not survive a "
        f"restart) nor in {archived} (the pipeline's save copies them there); "
        "fix: point --events at a copy"
    )


def sync_events(connection, job: vm_jobs.Job) -> int:
    """Bring the run's event files on the laptop up to the host's: only the bytes not here yet (an
    events file only grows), read from the offset the local copy has; its hparams beside them (once), and its
    evaluations as scalars (those its log added since).
    Returns the bytes copied."""
    from tpu_grpo.results import metrics

    board = laptop_paths.events(job.run)
    board.mkdir(parents=True, exist_ok=True)
    live = f"{job.meta['paths']['run']}/tensorboard"
    if live.startswith("gs://"):  # a bucket store keeps the events: read from the laptop
        before = sum(path.stat().st_size for path in board.glob("events.*"))
        _events_from_bucket(live, job.run)
        copied = sum(path.stat().st_size for path in board.glob("events.*")) - before
    else:
        copied = _events_over_sftp(connection, job, board)
    metrics.write_hparams(board, given(job.meta.get("inputs", {})), job.started)
    lines = hosts.run_script(connection, f"grep -aE '{progress.EVAL_LINES}' {vm_jobs.JOBS}/{job.id}/log; true").stdout
    evals = metrics.evals_from_log(lines)
    metrics.write_evals(board, job.id, evals, _iterations(job), job.meta.get("total_steps") or 0, job.started)
    return copied


def _events_over_sftp(connection, job: vm_jobs.Job, board: Path) -> int:
    sftp = connection.sftp()
    remote, found = _events_folder(connection, sftp, job)
    copied = 0
    for entry in found:
        local = board / entry.filename
        have = local.stat().st_size if local.exists() else 0
        if entry.st_size > have:
            with sftp.open(f"{remote}/{entry.filename}", "rb") as source, local.open("ab") as target:
                source.seek(have)
                data = source.read(entry.st_size - have)
                target.write(data)
                copied += len(data)
    return copied


def _events_from_bucket(url: str, run: str) -> None:
    """The run's TensorBoard event files from a bucket folder into its laptop folder, or a one-line error."""
    from tpu_grpo.results import metrics

    board = laptop_paths.events(run)
    board.mkdir(parents=True, exist_ok=True)
    if not [name for name in gcs.download(url, board) if name.startswith("events.")]:
        raise metrics.MetricsError(f"no TensorBoard events of run {run} in {url}; fix: point --events at a copy")


def _load_and_plot(run: str, train_log: bytes, iterations: int, out: Path | None):
    """The run's metrics from its laptop copy of the events and this training log; its plot written."""
    from tpu_grpo.results import metrics

    board = laptop_paths.events(run)
    (board.parent / "train.log").write_bytes(train_log)
    return _plotted(metrics.load(board, board.parent / "train.log", run, iterations), out)


def _plotted(found, out: Path | None):
    from tpu_grpo.results import metrics

    path = out or laptop_paths.run_folder(found.run) / laptop_paths.METRICS_PLOT
    path.parent.mkdir(parents=True, exist_ok=True)
    return found, metrics.plot(found, path)


def metrics_of_events(run: str | None, events: str, log: str | None, out: Path | None):
    """Load a run's metrics from a local folder of TensorBoard events (and its evaluations from a local log) and write
    its plot; returns (metrics, png path). The flags were checked by check_metrics_flags."""
    from tpu_grpo.results import metrics

    found = metrics.load(Path(events).expanduser(), Path(log).expanduser() if log else None, run=run)
    if not found.rows:
        raise metrics.MetricsError(
            f"--events {str(events)!r} holds no MaxText scalar (none of "
            f"{', '.join(sorted(metrics.SERIES.values()))}); fix: give a run's tensorboard "
            "folder, e.g. .tpu-grpo/runs/RUN/tensorboard"
        )
    return _plotted(found, out)


def metrics_of(session: vm_jobs.Session, run: str | None, out: Path | None):
    """Load a run's metrics (the host's TensorBoard events and train log, copied to the laptop first) and write its
    plot; returns (metrics, png path)."""
    connection = session.connection
    job = _train_job(connection, run)
    sync_events(connection, job)
    found, path = _load_and_plot(job.run, vm_jobs.read_log(connection, job.id), _iterations(job), out)
    found.trained_on = given(job.meta.get("inputs", {}))
    return found, path


def given(inputs: dict) -> dict:
    """What a run was given, as the columns runs are compared by: model, dataset, loss, tokenizer, batches and each
    `--set` (STEP:KEY)."""
    return {
        **maxtext.trained_on(inputs),
        "batches": inputs.get("batches"),
        **{
            f"{step}:{key}": value
            for step in ("convert", "train")
            for key, value in inputs.get(f"{step}_set", {}).items()
        },
    }

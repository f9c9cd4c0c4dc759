"""What a GRPO run learned, per step: reward, loss, KL and completion length, plus eval accuracy.

MaxText writes the per-step numbers as TensorBoard scalars (`run_name/tensorboard/`) and the
eval accuracy only to its log. This reads the events files with TensorBoard's own reader, joins
them with the evals parsed from the log (tpu_grpo.jobs.progress), and shows them as a table or a PNG.
TensorBoard and matplotlib are imported inside the functions that need them, so importing this
module (from tasks.py, say) stays cheap.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_grpo.config import values
from tpu_grpo.config.errors import UserError
from tpu_grpo.jobs import progress
from tpu_grpo.jobs.progress import Eval, parse_lines

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.table import Table

#: The series a person wants, by row field, with MaxText 0.2.3's scalar tags (confirmed in a run).
SERIES: dict[str, str] = {
    "reward": "rewards/train/mean",
    "loss": "actor/train/loss",
    "kl": "actor/train/kl",
    "completion_length": "completions/train/mean_length",
}
LABELS = {
    "reward": "mean reward",
    "loss": "loss",
    "kl": "KL",
    "completion_length": "completion length (tokens)",
}
#: Rollout-side tags are written with the learner's step count before the update (0, 1, ...),
#: the actor's after it (1, 2, ...): the batch rolled out at 0 is the one train step 1 learns
#: from. The real run shows it: rewards/* and completions/* at steps 0-3, actor/* at 1-4.
ROLLOUT_PREFIXES = ("rewards/", "completions/")
ROLLOUT_STEP_OFFSET = 1
EVENTS_GLOB = "events.out.tfevents.*"
EVAL_PANEL = "eval accuracy"
#: Written into every plot's PNG (its Software text), so that only our own plots are overwritten.
PLOT_MARK = "tpu-grpo metrics"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class MetricsError(UserError):
    """A run's metrics cannot be read; the message names the folder and the fix."""


@dataclass
class Row:
    step: int
    reward: float | None = None
    loss: float | None = None
    kl: float | None = None
    completion_length: float | None = None


@dataclass
class Metrics:
    run: str
    rows: list[Row]
    evals: list[Eval] = field(default_factory=list)
    trained_on: dict[str, str] = field(default_factory=dict)  # model, dataset, loss, tokenizer, where known
    iterations: int = 1  # rl.num_iterations: the train steps of a batch, which an intermediate evaluation counts

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) of one row field, skipping steps without it."""
        return [(row.step, value) for row in self.rows if (value := getattr(row, name)) is not None]

    def last_step(self) -> int:
        steps = [row.step for row in self.rows] + [e.step * self.iterations for e in self.evals if e.step is not None]
        return max(steps, default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            **self.trained_on,
            "tags": SERIES,
            "rows": [{key: _finite(value) for key, value in asdict(row).items()} for row in self.rows],
            "evals": [{key: _finite(value) for key, value in asdict(e).items()} for e in self.evals],
            "best": best_eval(self),
        }


def best_eval(metrics: Metrics) -> dict[str, Any] | None:
    """The evaluation the plots mark `best` (the checkpoint `invoke export` converts), as the table and --json say."""
    return next(
        ({"step": step, "accuracy": value} for step, value, stage in eval_points(metrics) if stage == "best"), None
    )


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a diverged loss becomes null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def event_files(folder: Path) -> list[Path]:
    """The events files in `folder`, or in its `tensorboard/` when given the run's folder; one that is no file (a
    folder of that name, a link to nothing) is refused by name."""
    folder = Path(folder)
    for candidate in (folder, folder / "tensorboard"):
        if candidate.is_dir() and (found := sorted(candidate.glob(EVENTS_GLOB))):
            if odd := next((path for path in found if not path.is_file()), None):
                what = "a link to nothing" if odd.is_symlink() and not odd.exists() else "no file"
                raise MetricsError(
                    f"{odd} is {what}, where TensorBoard's events files are; fix: copy the run's tensorboard folder "
                    "again, or remove it"
                )
            return found
    what = "no such folder" if not folder.is_dir() else f"no TensorBoard events files ({EVENTS_GLOB})"
    raise MetricsError(
        f"{what}: {folder}; fix: point --events at the run's base_output_directory/run_name/tensorboard (copied from "
        "the VM), or run training with enable_tensorboard=true"
    )


def check_events_file(path: Path) -> None:
    """Raise MetricsError unless the file is whole TFRecord frames (length, masked CRC-32C of it,
    data, masked CRC-32C of that): TensorBoard's reader stops quietly at the first bad frame, which
    would show a damaged run as a short one (metrics reads finished runs only)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    data, offset = Path(path).read_bytes(), 0
    while offset < len(data):
        header = data[offset : offset + 12]
        length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else 0
        end = offset + 12 + length + 4
        if len(header) < 12 or end > len(data):
            problem = f"is cut short at byte {offset} of {len(data)}"
        elif (
            masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]
            or masked_crc32c(data[offset + 12 : end - 4]) != struct.unpack("<I", data[end - 4 : end])[0]
        ):
            problem = f"is damaged at byte {offset} (a checksum does not match)"
        else:
            offset = end
            continue
        raise MetricsError(
            f"{path} {problem}, so it cannot be read as TensorBoard events; "
            "fix: copy it again from the run's tensorboard folder"
        )


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in every events file of the folder: tag -> [(step, value)] sorted by step.

    Steps as written (no shifting); values at one step keep the order they were written in.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing import event_accumulator as ea

    collected: dict[str, list[tuple[int, float, float]]] = {}
    for path in event_files(folder):
        check_events_file(path)
        accumulator = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0})
        try:
            accumulator.Reload()
        except DecodeError:  # whole TFRecord frames (check_events_file) that hold no Event
            raise MetricsError(
                f"{path} holds records that are no TensorBoard events; fix: copy it again from the run's tensorboard "
                "folder, or remove it"
            ) from None
        for tag in accumulator.Tags()[ea.SCALARS]:
            collected.setdefault(tag, []).extend((e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag))
    return {
        tag: [(step, value) for step, _, value in sorted(points, key=lambda p: (p[0], p[1]))]
        for tag, points in sorted(collected.items())
    }


def train_step(tag: str, step: int) -> int:
    """The train step a scalar belongs to (see ROLLOUT_STEP_OFFSET)."""
    return step + ROLLOUT_STEP_OFFSET if tag.startswith(ROLLOUT_PREFIXES) else step


def rows_from_scalars(scalars: dict[str, list[tuple[int, float]]]) -> list[Row]:
    """One row per train step; where a step holds several values of a tag, the last wins."""
    rows: dict[int, Row] = {}
    for name, tag in SERIES.items():
        for step, value in scalars.get(tag, []):
            step = train_step(tag, step)
            setattr(rows.setdefault(step, Row(step)), name, float(value))
    return [rows[step] for step in sorted(rows)]


def evals_from_log(text: str) -> list[Eval]:
    """The pre, intermediate and post evals in a train_rl log, in the order they ran."""
    return [event for event in parse_lines(text.splitlines()) if isinstance(event, Eval)]


def run_name(folder: Path) -> str:
    folder = Path(folder).resolve()
    return folder.parent.name if folder.name == "tensorboard" else folder.name


def load(folder: Path, log: Path | None = None, run: str | None = None, iterations: int = 1) -> Metrics:
    """A run's metrics from its TensorBoard folder and, when given, its train_rl log."""
    rows = rows_from_scalars(read_scalars(folder))
    evals = evals_from_log(Path(log).read_text(errors="replace")) if log is not None else []
    return Metrics(run=run or run_name(folder), rows=rows, evals=evals, iterations=iterations)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def eval_caption(evals: list[Eval]) -> str:
    parts = [
        f"{e.stage if e.step is None else f'step {e.step}'} {e.accuracy:.1f}% ({e.correct}/{e.total})" for e in evals
    ]
    return "eval accuracy: " + ", ".join(parts) if parts else "no evals in the log"


def table(metrics: Metrics) -> Table:
    """One row per train step: reward, loss, KL, completion length."""
    from rich.table import Table

    given = metrics.trained_on
    about = f": {given['model']} on {given['dataset']}, loss {given['loss']}" if given else ""
    result = Table(title=f"GRPO run {metrics.run}{about}", caption=eval_caption(metrics.evals))
    result.add_column("step", justify="right")
    for name in SERIES:
        result.add_column(LABELS[name], justify="right")
    for row in metrics.rows:
        result.add_row(str(row.step), *(_cell(getattr(row, name)) for name in SERIES))
    return result


def eval_points(metrics: Metrics) -> list[tuple[int, float, str]]:
    """(train step, accuracy %, stage) of each eval at the step it scored (progress.scored_step); the intermediate one
    scored best (the checkpoint `invoke export` converts: each is a checkpoint's) is marked `best`."""
    last = metrics.last_step()
    steps = [progress.scored_step(e, metrics.iterations, last) for e in metrics.evals]
    best = progress.best(metrics.evals, steps, metrics.iterations)
    return [(step, e.accuracy, "best" if e is best else e.stage) for step, e in zip(steps, metrics.evals)]


def figure(metrics: Metrics) -> Figure:
    """One panel per series and one for eval accuracy; a panel without data says so."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = len(SERIES) + 1
    fig = Figure(figsize=(8, 2.4 * panels), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(panels, 1, sharex=True)
    fig.suptitle(f"GRPO run {metrics.run}")
    for ax, name in zip(axes, SERIES):
        _panel(ax, LABELS[name], SERIES[name], metrics.series(name))
    _eval_panel(axes[-1], eval_points(metrics))
    axes[-1].set_xlabel("train step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _panel(ax, label: str, tag: str, points: list[tuple[int, float]]) -> None:
    ax.set_title(f"{label}: {tag}", fontsize="medium")
    ax.set_ylabel(label)
    if not points:
        _no_data(ax)
        return
    steps, values = zip(*points)
    ax.plot(steps, values, marker="o", label=label)
    ax.grid(alpha=0.3)


def _eval_panel(ax, points: list[tuple[int, float, str]]) -> None:
    ax.set_title(f"{EVAL_PANEL} (from the log)", fontsize="medium")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-5, 105)
    if not points:
        _no_data(ax)
        return
    steps, values, _ = zip(*points)
    ax.plot(steps, values, marker="o", label="accuracy")
    for step, value, stage in points:
        if stage != "intermediate":
            ax.annotate(stage, (step, value), textcoords="offset points", xytext=(4, 6))
    ax.grid(alpha=0.3)


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")


def is_our_plot(path: Path) -> bool:
    """Whether `path` is a PNG this module wrote (its Software text is PLOT_MARK)."""
    with Path(path).open("rb") as file:
        head = file.read(1 << 16)
    return head.startswith(PNG_SIGNATURE) and b"Software\x00" + PLOT_MARK.encode() in head


def check_plot_path(out: str, force: bool) -> Path:
    """Where the plot may go: a .png that is new or a plot of ours (any file with `force`), in a
    folder that can be made and written. Run before anything is read or written."""
    path = values.flag("--out", out, values.new_file, "metrics.png")
    flag = f"--out {out!r}"
    if path.suffix.lower() != ".png":
        raise MetricsError(f"{flag}: the plot is a PNG; fix: --out NAME.png")
    if path.exists() and not force and not is_our_plot(path):
        raise MetricsError(
            f"{flag} exists and is not a plot that tpu-grpo wrote; fix: another --out, or --force to overwrite it"
        )
    return path


#: The suffix of the events file holding a run's hparams (the inputs it was given), beside its own events.
HPARAMS_SUFFIX = ".tpu-grpo-hparams"


def write_hparams(folder: Path, given: dict, started: float) -> Path | None:
    """The run's inputs as the hparams plugin's session summary (its SessionStartInfo, a SessionEndInfo saying it
    ended) in an events file of its own beside the run's events, so TensorBoard's HParams dashboard lists runs by what
    they were given, with their scalars' last values as metrics. Written once; None when it is there already. The
    protos are tensorboard's own (tensorboard.plugins.hparams), written without TensorFlow."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = Path(folder)
    if list(folder.glob(f"events.*{HPARAMS_SUFFIX}")):
        return None
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=started)
    for name, value in given.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            start.hparams[name].number_value = value
        elif value is not None:
            start.hparams[name].string_value = str(value)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=started)

    def event(tag: str, content) -> event_pb2.Event:
        value = summary_pb2.Summary.Value(
            tag=tag, metadata=metadata.create_summary_metadata(content), tensor=metadata.NULL_TENSOR
        )
        return event_pb2.Event(wall_time=started, summary=summary_pb2.Summary(value=[value]))

    writer = EventFileWriter(str(folder), filename_suffix=HPARAMS_SUFFIX)
    version = metadata.PLUGIN_DATA_VERSION
    writer.add_event(
        event(
            metadata.SESSION_START_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_start_info=start, version=version),
        )
    )
    writer.add_event(
        event(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end, version=version))
    )
    writer.close()
    return folder


#: The suffix of the events files holding a training job's evaluations as scalars, with the job's id and how many.
EVALS_SUFFIX = ".tpu-grpo-evals"
#: The scalars each evaluation gives TensorBoard (`eval/NAME`), as MaxText's log says them.
EVAL_SCALARS = ("accuracy", "partial_accuracy", "format_accuracy", "mean_reward")


def write_evals(folder: Path, job_id: str, evals: list[Eval], iterations: int, last_step: int, at: float) -> int:
    """A training job's evaluations as TensorBoard scalars beside MaxText's events, which hold none (its log does):
    `eval/accuracy` and the rest at the train step each scored (progress.scored_step). An events file only grows,
    so those not written yet go into a file of their own, named by the job and the count written. Returns how many it
    wrote."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = Path(folder)
    suffix = f"{EVALS_SUFFIX}-{job_id}-"
    written = max((int(path.name.rsplit("-", 1)[1]) for path in folder.glob(f"events.*{suffix}*")), default=0)
    new = evals[written:]
    if not new:
        return 0
    writer = EventFileWriter(str(folder), filename_suffix=f"{suffix}{len(evals)}")
    for each in new:
        step = progress.scored_step(each, iterations, last_step)
        values = [
            summary_pb2.Summary.Value(tag=f"eval/{name}", simple_value=getattr(each, name)) for name in EVAL_SCALARS
        ]
        writer.add_event(event_pb2.Event(wall_time=at, step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    return len(new)


#: What a comparison overlays: the series a person reads a GRPO run by, then its evaluations.
COMPARED = ("reward", "kl", "completion_length")


def differing(given: list[dict]) -> list[str]:
    """Each run's legend: its name and the inputs in which the runs differ (all the same: the name alone)."""
    keys = sorted({key for inputs in given for key in inputs})
    differ = [key for key in keys if len({json.dumps(inputs.get(key), sort_keys=True) for inputs in given}) > 1]
    return [", ".join(f"{key}={inputs.get(key)}" for key in differ) for inputs in given]


def compare_figure(runs: list[Metrics]) -> Figure:
    """One panel per compared series and one for eval accuracy, a line per run (its best evaluation marked), the
    legend naming what differs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    legends = differing([metrics.trained_on for metrics in runs])
    fig = Figure(figsize=(9, 2.6 * (len(COMPARED) + 1)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(COMPARED) + 1, 1, sharex=True)
    fig.suptitle("GRPO runs compared: " + ", ".join(metrics.run for metrics in runs))
    for metrics, legend in zip(runs, legends):
        label = f"{metrics.run} ({legend})" if legend else metrics.run
        for ax, name in zip(axes, COMPARED):
            if points := metrics.series(name):
                ax.plot(*zip(*points), marker="o", label=label)
        if evals := eval_points(metrics):
            [line] = axes[-1].plot(
                [step for step, _, _ in evals], [value for _, value, _ in evals], marker="o", label=label
            )
            for step, value, stage in evals:  # the checkpoint each run's export converts
                if stage == "best":
                    axes[-1].annotate(
                        "best", (step, value), textcoords="offset points", xytext=(4, 6), color=line.get_color()
                    )
    for ax, name in zip(axes, COMPARED):
        ax.set_title(f"{LABELS[name]}: {SERIES[name]}", fontsize="medium")
        ax.set_ylabel(LABELS[name])
    axes[-1].set_title(f"{EVAL_PANEL} (from the log)", fontsize="medium")
    axes[-1].set_ylabel("accuracy (%)")
    for ax in axes:
        if ax.get_lines():
            ax.legend(fontsize="small")
            ax.grid(alpha=0.3)
        else:
            _no_data(ax)
    axes[-1].set_xlabel("train step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def plot(metrics: Metrics | list[Metrics], path: Path) -> Path:
    """Write the figure (of one run, or runs compared) as a PNG (Agg, no display needed), marked as ours, and return
    its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drawn = compare_figure(metrics) if isinstance(metrics, list) else figure(metrics)
    drawn.savefig(path, format="png", dpi=100, metadata={"Software": PLOT_MARK})
    return path

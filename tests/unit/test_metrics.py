"""A run's metrics come out of MaxText 0.2.3's real TensorBoard events file and log: the values
match a hand-rolled read of the same file, the table and the PNG show them, a missing series
says "no data", and a folder without events files says what to do."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.support import DATA, FIXTURES
from tpu_grpo.config import laptop_paths
from tpu_grpo.jobs.progress import Eval, TrainStep, parse_lines
from tpu_grpo.results import metrics
from tpu_grpo.results.metrics import Metrics, MetricsError, Row

EVENTS = FIXTURES / "tensorboard"
LOG = FIXTURES / "train_rl.cpu-rehearsal.log"
DOC = DATA / "maxtext-0.2.3.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def raw_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of one events file, read record by record (TFRecord framing + Event proto)."""
    from tensorboard.compat.proto import event_pb2

    data = path.read_bytes()
    found: dict[str, list[tuple[int, float]]] = {}
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
        for value in event.summary.value:
            found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


@pytest.fixture(scope="module")
def raw() -> dict[str, list[tuple[int, float]]]:
    (path,) = EVENTS.glob("events.out.tfevents.*")
    return raw_scalars(path)


@pytest.fixture(scope="module")
def scalars():
    return metrics.read_scalars(EVENTS)


@pytest.fixture(scope="module")
def run() -> Metrics:
    return metrics.load(EVENTS, log=LOG, run="smoke")


def log_train_steps() -> list[TrainStep]:
    return [e for e in parse_lines(LOG.read_text().splitlines()) if isinstance(e, TrainStep)]


def test_read_scalars_matches_the_file(scalars, raw):
    assert set(scalars) == set(raw)
    for tag, points in raw.items():
        assert scalars[tag] == sorted(points, key=lambda p: p[0]), tag
    assert [step for step, _ in scalars["actor/train/loss"]] == [1, 2, 3, 4]
    assert [step for step, _ in scalars["rewards/train/mean"]] == [0, 1, 2, 3]


def documented_tags() -> set[str]:
    """The doc's `group/mode/{a,b}suffix` lists, expanded."""
    tags = set()
    for prefix, names, suffix in re.findall(r"`([\w/]+/)\{([^}]*)\}(\w*)`", DOC.read_text()):
        tags |= {f"{prefix}{name.strip()}{suffix}" for name in names.split(",")}
    return tags


def test_tags_are_the_documented_ones(scalars):
    documented = documented_tags()
    assert "completions/train/mean_length" in documented
    assert set(metrics.SERIES.values()) <= documented
    assert documented <= set(scalars)
    assert {tag for tag in scalars if not tag.startswith("jax/")} == documented


def test_rows_are_train_steps(run, raw):
    """Rollout tags (0-based) line up with the actor's train steps, which the log confirms."""
    steps = [row.step for row in run.rows]
    assert steps == [step for step, _ in raw["actor/train/loss"]]
    assert steps == [e.step for e in log_train_steps()] == [1, 2, 3, 4]
    by_step = {row.step: row for row in run.rows}
    for field, tag in metrics.SERIES.items():
        offset = metrics.ROLLOUT_STEP_OFFSET if tag.startswith(metrics.ROLLOUT_PREFIXES) else 0
        assert [(step + offset, value) for step, value in raw[tag]] == run.series(field), field
        for step, value in raw[tag]:
            assert getattr(by_step[step + offset], field) == value


def test_loss_agrees_with_the_log(run):
    """The log prints the loss to 6 decimals; TensorBoard holds the float32 behind it."""
    losses = dict(run.series("loss"))
    for event in log_train_steps():
        assert abs(losses[event.step] - event.loss) < 5e-7


def test_evals_from_log():
    text = LOG.read_text()
    evals = metrics.evals_from_log(text)
    lines = [
        line
        for line in text.splitlines()
        if "] Pre RL Training:" in line or "] Intermediate Eval (" in line or "] Post RL Training:" in line
    ]
    assert len(evals) == len(lines) == 4
    assert [(e.stage, e.step) for e in evals] == [
        ("pre", None),
        ("intermediate", 2),
        ("intermediate", 4),
        ("post", None),
    ]
    for line, e in zip(lines, evals):
        assert f"corr={e.correct}, total={e.total}," in line
        assert f"accuracy={e.accuracy}%" in line
        assert f"mean_reward={e.mean_reward:.4f}" in line
    assert metrics.evals_from_log("no evals here\n") == []


def test_to_json(run):
    data = json.loads(json.dumps(run.to_json(), allow_nan=False))
    assert data["run"] == "smoke"
    assert data["tags"] == metrics.SERIES
    assert [row["step"] for row in data["rows"]] == [row.step for row in run.rows]
    assert data["rows"][0] == {"step": 1, **{f: getattr(run.rows[0], f) for f in metrics.SERIES}}
    assert [e["stage"] for e in data["evals"]] == ["pre", "intermediate", "intermediate", "post"]


def test_to_json_turns_nan_into_null():
    data = Metrics("r", [Row(step=1, loss=float("nan"), kl=math.inf, reward=0.5)]).to_json()
    assert data["rows"] == [{"step": 1, "reward": 0.5, "loss": None, "kl": None, "completion_length": None}]
    assert json.dumps(data, allow_nan=False)


def test_table(run):
    console = Console(record=True, width=200)
    console.print(metrics.table(run))
    text = console.export_text()
    assert "GRPO run smoke" in text
    for header in ("step", "mean reward", "loss", "KL", "completion length"):
        assert header in text
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == len(run.rows)
    for line, row in zip(body, run.rows):
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[0] == str(row.step)
        assert [float(c) for c in cells[1:]] == pytest.approx([getattr(row, f) for f in metrics.SERIES], rel=1e-3)
    caption = metrics.table(run).caption
    assert caption == metrics.eval_caption(run.evals)
    for e in run.evals:
        label = e.stage if e.step is None else f"step {e.step}"
        assert f"{label} {e.accuracy:.1f}% ({e.correct}/{e.total})" in caption
    assert " ".join(text.split()).count("% (") == len(run.evals)


def test_plot_writes_a_png_with_every_panel(run, raw, tmp_path):
    path = metrics.plot(run, tmp_path / "out" / "smoke.png")
    assert path == tmp_path / "out" / "smoke.png"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])
    assert width > 400 and height > 400

    figure = metrics.figure(run)
    axes = figure.get_axes()
    assert len(axes) == len(metrics.SERIES) + 1
    for ax, tag in zip(axes, metrics.SERIES.values()):
        assert tag in ax.get_title()
        assert ax.get_ylabel()
        (line,) = ax.get_lines()
        offset = metrics.ROLLOUT_STEP_OFFSET if tag.startswith(metrics.ROLLOUT_PREFIXES) else 0
        assert list(line.get_xdata()) == [step + offset for step, _ in raw[tag]]
        assert list(line.get_ydata()) == pytest.approx([value for _, value in raw[tag]])
    assert axes[-1].get_xlabel() == "train step"


def test_eval_panel_puts_pre_at_zero_and_post_at_the_last_step(run):
    """The recorded run's intermediate evaluations score 0% after batches 2 and 4: the earlier is the best."""
    last = max(row.step for row in run.rows)
    assert metrics.eval_points(run) == [
        (0, run.evals[0].accuracy, "pre"),
        (run.evals[1].step, run.evals[1].accuracy, "best"),
        (run.evals[2].step, run.evals[2].accuracy, "intermediate"),
        (last, run.evals[3].accuracy, "post"),
    ]
    ax = metrics.figure(run).get_axes()[-1]
    assert metrics.EVAL_PANEL in ax.get_title()
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 2, 4, 4]
    assert list(line.get_ydata()) == [e.accuracy for e in run.evals]
    assert {t.get_text() for t in ax.texts} == {"pre", "best", "post"}


def test_missing_series_say_no_data(tmp_path):
    """An events file holding only the loss: the other panels say so instead of crashing."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path))
    for step, loss in [(1, 0.5), (2, 0.25)]:
        value = summary_pb2.Summary.Value(tag="actor/train/loss", simple_value=loss)
        writer.add_event(event_pb2.Event(step=step, wall_time=float(step), summary=summary_pb2.Summary(value=[value])))
    writer.close()

    run = metrics.load(tmp_path)
    assert run.rows == [Row(1, loss=0.5), Row(2, loss=0.25)]
    assert run.evals == []
    figure = metrics.figure(run)
    for ax, field in zip(figure.get_axes(), [*metrics.SERIES, "evals"]):
        if field == "loss":
            assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2]]
            assert not ax.texts
        else:
            assert ax.get_lines() == []
            assert [t.get_text() for t in ax.texts] == ["no data"]
    assert metrics.plot(run, tmp_path / "partial.png").read_bytes()[:8] == PNG_MAGIC
    assert metrics.plot(Metrics("empty", []), tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


def test_every_events_file_in_the_folder_is_read(tmp_path, raw):
    (original,) = EVENTS.glob("events.out.tfevents.*")
    shutil.copy(original, tmp_path / original.name)
    shutil.copy(original, tmp_path / (original.name + ".restart"))
    merged = metrics.read_scalars(tmp_path)
    for tag, points in raw.items():
        assert len(merged[tag]) == 2 * len(points)
        assert [step for step, _ in merged[tag]] == sorted(step for step, _ in points + points)


def test_run_folder_is_accepted(tmp_path):
    (original,) = EVENTS.glob("events.out.tfevents.*")
    board = tmp_path / "smoke" / "tensorboard"
    board.mkdir(parents=True)
    shutil.copy(original, board)
    assert metrics.read_scalars(tmp_path / "smoke") == metrics.read_scalars(EVENTS)
    assert metrics.load(tmp_path / "smoke").run == "smoke"
    assert metrics.load(board).run == "smoke"


def test_folder_without_events_files(tmp_path):
    (tmp_path / "notes.txt").write_text("not an events file")
    with pytest.raises(MetricsError) as error:
        metrics.read_scalars(tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert str(tmp_path) in message
    assert "events.out.tfevents" in message and "tensorboard" in message


def test_missing_folder(tmp_path):
    with pytest.raises(MetricsError, match="no such folder") as error:
        metrics.load(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(error.value)


def test_import_is_cheap():
    code = (
        "import sys, tpu_grpo.results.metrics; "
        "print(sorted(m for m in ('matplotlib', 'tensorboard', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_runs_compared_are_one_line_each_in_every_panel_and_the_legend_names_what_differs(tmp_path):
    from tpu_grpo.results import metrics

    def run(name: str, generations: str, scale: float) -> metrics.Metrics:
        rows = [
            metrics.Row(step, reward=step * scale, loss=0.1, kl=0.01 * step, completion_length=100 + step)
            for step in (1, 2, 3)
        ]
        evals = [
            Eval("pre", None, 1, 4, 25.0, 25.0, 100.0, 0.5),
            Eval("intermediate", 1, 2, 4, 50.0, 50.0, 100.0, 1.0),
            Eval("intermediate", 2, 3, 4, 75.0 * scale, 75.0, 100.0, 1.5),
            Eval("post", None, 3, 4, 75.0 * scale, 75.0, 100.0, 1.5),
        ]
        return metrics.Metrics(
            name,
            rows,
            evals,
            {"model": "llama3.1-8b-Instruct", "loss": "grpo", "train:rl.num_generations": generations},
        )

    first, second = run("g2", "2", 1.0), run("g4", "4", 0.5)
    figure = metrics.compare_figure([first, second])
    panels = figure.axes
    assert [ax.get_title() for ax in panels] == [
        "mean reward: rewards/train/mean",
        "KL: actor/train/kl",
        "completion length (tokens): completions/train/mean_length",
        "eval accuracy (from the log)",
    ]
    legends = ["g2 (train:rl.num_generations=2)", "g4 (train:rl.num_generations=4)"]
    for ax, name in zip(panels, metrics.COMPARED):
        assert [line.get_label() for line in ax.get_lines()] == legends
        for line, found in zip(ax.get_lines(), (first, second)):
            assert list(zip(line.get_xdata(), line.get_ydata())) == found.series(name)
    accuracy = [list(line.get_ydata()) for line in panels[-1].get_lines()]
    assert accuracy == [[25.0, 50.0, 75.0, 75.0], [25.0, 50.0, 37.5, 37.5]]
    # each run's best evaluation (the checkpoint its export converts) is marked, in its line's colour
    marks = [(text.get_text(), text.xy, text.get_color()) for text in panels[-1].texts]
    colors = [line.get_color() for line in panels[-1].get_lines()]
    assert marks == [("best", (2, 75.0), colors[0]), ("best", (1, 50.0), colors[1])]
    path = metrics.plot([first, second], tmp_path / "compare.png")
    assert metrics.is_our_plot(path)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--compare", "a"], "--compare 'a' names one run, and a comparison takes two or more; fix: e.g. --compare a "),
        (["--compare", "a", "--compare", "a"], "--compare 'a' names the same run twice; fix: name each run once"),
        (
            ["--compare", "a", "--compare", "b", "--run", "c"],
            "--compare compares runs of the host, and --run names one run (or a local folder); fix: leave out --run",
        ),
    ],
)
def test_a_comparison_needs_two_runs_of_the_host_and_nothing_else(stack_dir, argv, said):
    """Each refusal names only the flags that were given (round 6: one --compare was told of --run and --events)."""
    from tests.support import invoke

    result = invoke("metrics", *argv, cwd=stack_dir)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.startswith(f"error: {said}")
    assert ("--events" in result.stderr) == ("--events" in argv)


def test_tensorboard_compares_runs_by_what_they_were_given(tmp_path, monkeypatch):
    """Each run's inputs as hparams summaries beside its events (written once, without TensorFlow), read back through
    TensorBoard's own HTTP API as `invoke tensorboard` serves them (tpu_grpo/results/tensorboard_sync.py): the HParams
    dashboard's experiment lists the inputs (and which differ) and each run's session its inputs and its scalars'
    last values."""
    import urllib.request

    from tensorboard.backend.event_processing import event_accumulator

    from tests.host.sshd import free_port
    from tpu_grpo.results import tensorboard_sync

    monkeypatch.setenv("TPU_GRPO_STATE", str(tmp_path))
    for name, generations in (("g2", "2"), ("g4", "4")):
        folder = laptop_paths.events(name)
        shutil.copytree(FIXTURES / "tensorboard", folder)
        given = {"model": "llama3.1-8b-Instruct", "loss": "grpo", "batches": 4, "train:rl.num_generations": generations}
        assert metrics.write_hparams(folder, given, 1796000000.0) is not None
        assert metrics.write_hparams(folder, given, 1796000000.0) is None  # once
        assert len(metrics.load(folder).rows) == 4  # the scalars read as before
    url = tensorboard_sync.serve(["g2", "g4"], free_port()) + "data/plugin/hparams/"

    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        return json.load(urllib.request.urlopen(request, timeout=10))

    experiment = post("experiment", {"experimentName": ""})
    infos = {info["name"]: info for info in experiment["hparamInfos"]}
    assert set(infos) == {"model", "loss", "batches", "train:rl.num_generations"}
    assert infos["train:rl.num_generations"]["differs"] and sorted(
        infos["train:rl.num_generations"]["domainDiscrete"]
    ) == ["2", "4"]
    assert not infos["model"]["differs"]
    groups = post(
        "session_groups",
        {
            "experimentName": "",
            "allowedStatuses": ["STATUS_SUCCESS"],
            "startIndex": 0,
            "sliceSize": 10,
            "colParams": [{"hparam": "train:rl.num_generations"}, {"metric": {"tag": "rewards/train/mean"}}],
        },
    )
    recorded = event_accumulator.EventAccumulator(str(FIXTURES / "tensorboard"))
    recorded.Reload()
    last_reward = recorded.Scalars("rewards/train/mean")[-1].value
    sessions = {group["name"]: group for group in groups["sessionGroups"]}
    assert {name: group["hparams"]["train:rl.num_generations"] for name, group in sessions.items()} == {
        "g2/tensorboard": "2",
        "g4/tensorboard": "4",
    }
    for group in sessions.values():
        [reward] = [value for value in group["metricValues"] if value["name"]["tag"] == "rewards/train/mean"]
        assert reward["value"] == pytest.approx(last_reward)


def test_a_run_of_several_iterations_a_batch_plots_each_evaluation_at_the_train_step_it_scored():
    """With rl.num_iterations 2, the evaluation after batch 5 scored train step 10, where the TensorBoard sync and
    the export put it too; the best is the one export converts."""
    from tpu_grpo.jobs.progress import Eval

    def scored(stage, step, accuracy):
        return Eval(stage, step, 1, 4, accuracy, accuracy, 100.0, accuracy / 100)

    evals = [scored("pre", None, 10.0), scored("intermediate", 5, 60.0), scored("intermediate", 10, 40.0)]
    evals.append(scored("post", None, 40.0))
    run = metrics.Metrics("r", [metrics.Row(step) for step in range(1, 21)], evals, iterations=2)
    assert metrics.eval_points(run) == [
        (0, 10.0, "pre"),
        (10, 60.0, "best"),
        (20, 40.0, "intermediate"),
        (20, 40.0, "post"),
    ]


def test_a_trainings_evaluations_reach_tensorboard_as_scalars_once_each(tmp_path):
    """write_evals puts each evaluation at the train step it scored (0 before, batch x iterations, the last after),
    writes only those not written yet, and MaxText's own series are read as before beside them."""
    from tpu_grpo.jobs.progress import Eval

    def scored(stage, step, accuracy):
        return Eval(stage, step, 1, 4, accuracy, accuracy, 100.0, accuracy / 100)

    first = [scored("pre", None, 25.0), scored("intermediate", 10, 50.0)]
    assert metrics.write_evals(tmp_path, "job-1", first, 2, 100, 1000.0) == 2
    assert metrics.write_evals(tmp_path, "job-1", first, 2, 100, 1000.0) == 0  # a sync with nothing new
    later = [*first, scored("intermediate", 20, 75.0), scored("post", None, 60.0)]
    assert metrics.write_evals(tmp_path, "job-1", later, 2, 100, 1000.0) == 2
    read = metrics.read_scalars(tmp_path)
    assert read["eval/accuracy"] == [(0, 25.0), (20, 50.0), (40, 75.0), (100, 60.0)]
    assert read["eval/mean_reward"][1] == (20, pytest.approx(0.5))
    assert {tag.split("/")[1] for tag in read} == set(metrics.EVAL_SCALARS)
    assert metrics.rows_from_scalars(read) == []  # no series of MaxText's taken from them


def test_the_best_evaluation_the_plot_marks_is_said_by_the_table_and_the_json(run, tmp_path, stack_dir):
    """The plot marks the intermediate evaluation that scored best (the earlier on a tie); `metrics` says it in its
    text and `--json` too, read here from the recorded log's own lines (one iteration a batch: a step is a batch)."""
    from tests.support import invoke

    scored = [
        (int(step), float(accuracy))
        for step, accuracy in re.findall(r"Intermediate Eval \(step=(\d+)\): .*?accuracy=([0-9.]+)%", LOG.read_text())
    ]
    top = max(accuracy for _, accuracy in scored)
    step = min(step for step, accuracy in scored if accuracy == top)
    assert run.iterations == 1 and run.to_json()["best"] == {"step": step, "accuracy": top}
    args = ("metrics", "--events", str(EVENTS), "--log", str(LOG), "--out", str(tmp_path / "m.png"))
    assert json.loads(invoke(*args, "--json", cwd=stack_dir).stdout)["best"] == {"step": step, "accuracy": top}
    assert f"best: {top:g}% at step {step} (marked `best` in the plot)" in invoke(*args, cwd=stack_dir).stdout

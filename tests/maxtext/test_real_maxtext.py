"""Each family of the model table converts, trains and exports under MaxText 0.2.3's own code, from the scripts
tpu-grpo generates for a stack (the text `--dry-run` prints), on one VM and in a slice's pods with its bucket; and
what tpu-grpo reads back (checkpoints, progress, evaluations, resumption, the export) is what MaxText really wrote,
a model that learned from its rewards and carries the tokenizer it trained with."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from tests.maxtext import stack
from tests.maxtext.conftest import COMPILE_CACHES
from tests.maxtext.families import FAMILIES, ROWS
from tests.maxtext.readback import QUESTION
from tests.support import MAXTEXT_VENV as VENV
from tests.support import ROOT
from tpu_grpo.catalog import models, stores
from tpu_grpo.host import facts, gcs
from tpu_grpo.jobs import maxtext, pipeline, progress


def tail(done, lines: int = 40) -> str:
    return "\n".join((done.stdout + done.stderr).splitlines()[-lines:])


def tail_lines(lines: list[str], count: int = 60) -> str:
    return "\n".join(lines[-count:])


def readback(asked: dict, env=None) -> dict:
    """What tests/maxtext/readback.py reads back, in the tier's venv, one process for all `asked`."""
    return json.loads(
        subprocess.run(
            [VENV / "bin/python", "-m", "tests.maxtext.readback", json.dumps(asked, default=str)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        ).stdout
    )


def scored(log: list[str]) -> dict[tuple[str, int | None], tuple[float, str]]:
    """Each evaluation of a log, (stage, step) -> (its accuracy, the digest of the weights it scored: what the stand-in
    rollout said last before it)."""
    found: dict[tuple[str, int | None], tuple[float, str]] = {}
    weights = ""
    for line in log:
        if stack.WEIGHTS_LINE in line:  # after a progress bar's carriage return, at times
            weights = line.rsplit(" ", 1)[1]
        for event in progress.parse_lines([line]):
            if isinstance(event, progress.Eval):
                found[(event.stage, event.step)] = (event.accuracy, weights)
    return found


def best_scored(evaluations: dict[tuple[str, int | None], tuple[float, str]]) -> int:
    """The step of the intermediate evaluation of highest accuracy, the earlier on a tie (the rule the project
    documents)."""
    steps = {step: accuracy for (stage, step), (accuracy, _) in evaluations.items() if stage == "intermediate"}
    return max(steps, key=lambda step: (steps[step], -step))


#: Below what a healthy run of every family reaches (tests/maxtext/readback.learned, on the tier's run of 2026-12-08: at
#: least 0.73% of a matrix's weights moved, Llama's k_proj; the margin rose by 0.024 at least, Llama's and Qwen3's), a
#: quarter and a fifth of it: the least share of each weight matrix's weights the training must move, and the least
#: rise of the margin of right over wrong (a schedule that trains nothing flips a few weights in bfloat16 and moves the
#: margin by rounding noise, 1e-5).
MOVED_AT_LEAST, RISE_AT_LEAST = 0.002, 0.005


#: One row of each family; every row with TPU_GRPO_MAXTEXT_ROWS=all (docs/development.md).
TESTED = ROWS if os.environ.get("TPU_GRPO_MAXTEXT_ROWS") == "all" else FAMILIES


# every family on a VM first, then in a slice (workers take tests in this order)
@pytest.mark.parametrize(("model", "placement"), stack.placements(TESTED, every=TESTED is ROWS))
def test_a_stack_converts_trains_resumes_and_exports(make_host, request, tmp_path, model, placement):
    in_slice = placement == "slice"
    host = make_host(TESTED[model])
    chosen = stack.stack(model, placement, request.getfixturevalue("bucket") if in_slice else None)
    run = stack.run(chosen, host.family, host.data, in_slice)
    where = maxtext.paths(run)
    bucket = stack.bucket_environment(request.getfixturevalue("storage_emulator")) if in_slice else {}
    root = (maxtext.Placement(pod=True) if in_slice else maxtext.VM).compile_cache_root(run)
    cached = host.keep_bucket_compile_caches(root, model) if in_slice else host.keep_compile_caches(root)

    def step(name: str, of: maxtext.Run) -> list[str]:
        script, environment = stack.script(chosen, of, name)
        done = host.run(script, {**environment, **bucket}, in_slice)
        assert done.returncode == 0, tail(done)
        return (done.stdout + done.stderr).splitlines()

    step("convert", run)
    converted = gcs.names(where["checkpoint"]) if in_slice else os.listdir(host.path(where["checkpoint"]))
    assert "_METADATA" in converted  # where the training loads it from
    if not in_slice:  # the stack's default: eager (lazyLoadTensors false), as the model's row allows
        assert not run.lazy_load_tensors or models.MODELS[model].eager_load_method is None

    log = step("train", run)
    events = progress.parse_lines(log)
    steps = [event.step for event in events if isinstance(event, progress.TrainStep)]
    assert steps == list(range(1, run.train_steps + 1))
    evals = [event for event in events if isinstance(event, progress.Eval)]
    assert [event.stage for event in evals][0] == "pre" and evals[-1].stage == "post"
    assert any(isinstance(event, progress.Completed) for event in events)
    if in_slice:
        found = pipeline.checkpoint_steps(None, run)
    else:
        names = os.listdir(host.path(where["checkpoints"])) + os.listdir(host.path(where["kept"]))
        found = pipeline.Checkpoints.parse(facts.Answer("\n".join(names)), "")
    assert found[-1] == stack.BATCHES and set(found) <= {1, 2, 4}  # every checkpoint_period steps and the last
    # each checkpoint scored (eval_interval from checkpointPeriod 2, no --set): the hook fired after batches 2 and 4,
    # each on the weights synced to the rollout after its batch, and they moved
    evaluations = scored(log)
    scored_steps = [step for stage, step in evaluations if stage == "intermediate"]
    assert scored_steps == [2, 4] and {step for step in found if step % 2 == 0} <= set(scored_steps)
    weights = {key: digest for key, (_, digest) in evaluations.items()}
    assert len({weights[("pre", None)], weights[("intermediate", 2)], weights[("intermediate", 4)]}) == 3, weights
    best = best_scored(evaluations)
    if not in_slice:
        # Orbax kept the newest (checkpointsToKeep 1); the keeper, the best scored one's weights, hard-linked
        assert sorted(os.listdir(host.path(where["checkpoints"]))) == [str(stack.BATCHES)]
        assert os.listdir(host.path(where["kept"])) == [str(best)], evaluations
        assert f"tpu-grpo: keeps checkpoint {best}, the best scored so far" in "\n".join(log)

    # the actor is the reference model copied, not the checkpoint restored a second time (load_checkpoint_only_once)
    assert "Creating policy model by copying reference model instead of restoring" in "\n".join(log)
    first = progress.startup(log, 2026)
    folder = first["cache"]["folder"]  # JAX wrote the trainer's compiled programs there
    if in_slice:
        assert folder.startswith(f"{root}/") and any(name.endswith("-cache") for name in gcs.names(folder))
        named = folder.removeprefix(f"{root}/")
    else:
        assert host.path(folder).is_relative_to(host.path(root)) and any(host.path(folder).glob("*-cache"))
        named = str(host.path(folder).resolve().relative_to(COMPILE_CACHES))
    # warm exactly when an earlier training of these settings (an earlier run) left entries in the folder the project
    # names for them
    assert first["cache"]["warm"] == any(str(entry.parent.relative_to(COMPILE_CACHES)) == named for entry in cached)
    assert first["phases"].keys() == set(progress.STARTUP_LABELS)

    longer = stack.run(chosen, host.family, host.data, in_slice, batches=stack.MORE_BATCHES)
    resumed = step("train", longer)
    warm = progress.startup(resumed, 2026)
    assert warm["cache"]["warm"] and warm["cache"]["folder"] == folder  # batches fix no shape
    events = progress.parse_lines(resumed)
    assert progress.Resumed(stack.BATCHES) in events  # the script's own line, before MaxText restores it
    assert [e.step for e in events if isinstance(e, progress.TrainStep)] == list(
        range(stack.BATCHES + 1, stack.MORE_BATCHES + 1)
    )
    evaluations.update({key: value for key, value in scored(resumed).items() if key[0] == "intermediate"})
    weights = {key: digest for key, (_, digest) in evaluations.items()}
    best = best_scored(evaluations)  # of every checkpoint of the run, the resumed training's among them
    if in_slice:
        host.bring_back_compile_caches(root)
    else:  # the resumed training's keeper kept the better of its own and the one kept before
        assert os.listdir(host.path(where["kept"])) == [str(best)], evaluations

    exported = step("export", longer)
    # a VM's export scores the checkpoint it converts on the 4 test rows after the training's 8, training nothing
    report = progress.report(exported)
    if in_slice:  # its export runs on a CPU pod
        assert report is None
    else:
        assert report is not None and (report.step, report.start, report.stop) == (longer.export_step, 8, 12)
        assert report.score is not None and report.score.total == 4, tail_lines(exported)
        # the report scored the weights it exports: those the training's evaluation of that checkpoint scored
        assert scored(exported)[("pre", None)][1] == weights[("intermediate", longer.export_step)]
        assert not any(isinstance(e, progress.TrainStep) for e in progress.parse_lines(exported))
        assert f"{progress.REPORT_LINE} done" in "\n".join(exported)
    if in_slice:  # brought to the laptop as `invoke fetch` brings a slice's export
        export = tmp_path / "fetched"
        gcs.fetch_folder(maxtext.paths(longer)["run_export"], export, lambda *_: None)
    else:
        export = host.path(maxtext.paths(longer)["hf_export"])
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == [host.family.architecture]
    last_step = (
        "gs://{}/{}{}".format(*gcs.split(where["checkpoints"]), stack.MORE_BATCHES)
        if in_slice  # `//` folded
        else host.path(where["checkpoints"]) / str(stack.MORE_BATCHES)
    )
    # the weights kept as the best scored: the keeper's on a VM, the manager's (3 kept) in a slice's bucket
    kept = f"{str(last_step).rsplit('/', 1)[0]}/{best}" if in_slice else host.path(where["kept"]) / str(best)
    read = readback(
        {
            "load": [export, host.model_folder],
            "learned": [host.model_folder, export, host.rollout_log],
            "bytes": last_step,
            "digests": {"best": f"{kept}/model_params"},
        },
        env=bucket,
    )
    assert read["bytes"] == {"model_params": models.WEIGHT_BYTES, "optimizer_state": models.MOMENT_BYTES}  # the disk's
    assert read["digests"]["best"] == weights[("intermediate", best)]  # the weights its evaluation scored
    loaded = read["load"]
    assert loaded["class"] == host.family.architecture and loaded["new_tokens"] > 0
    assert loaded["unexpected_keys"] == loaded["mismatched_keys"] == []  # the class's names and shapes
    assert all(key.startswith(host.family.untrained) for key in loaded["missing_keys"]), loaded["missing_keys"]
    # the tokenizer it trained with, not the export name's (Llama's base), whose template differs: the question
    # renders as the training rendered it, and its tokens decode to that text
    assert (export / "chat_template.jinja").read_bytes() == (host.model_folder / "chat_template.jinja").read_bytes()
    assert loaded["rendered"] == loaded["trained_rendered"] == loaded["decoded"]
    assert QUESTION[0]["content"] in loaded["rendered"]

    # GRPO learned from the rollout's rewards, from the start MaxText trained from (its bfloat16 conversion): a share of
    # every weight matrix moved, and the answers rewarded became likelier than those not
    learned = read["learned"]
    least = min(learned["moved"], key=learned["moved"].get)
    assert learned["moved"][least] >= MOVED_AT_LEAST, (least, learned["moved"][least])
    assert learned["pairs"] and learned["margin_after"] - learned["margin_before"] >= RISE_AT_LEAST, learned

    if in_slice:
        # a save a preemption cut short, as Orbax leaves it in a bucket (the step's files, its commit_success.txt not
        # yet written, Orbax's last): the step is not one to resume from or export
        from google.cloud import storage

        name, prefix = gcs.split(where["checkpoints"])
        storage.Client().bucket(name).blob(f"{prefix}{stack.MORE_BATCHES}/{stores.COMMIT_FILE}").delete()
        assert pipeline.checkpoint_steps(None, longer) == [2, 4]
    else:
        # the best scored checkpoint (which Orbax deleted and the keeper kept through the resumed training, unless it
        # is the last) converts, and the report scores its weights
        best_exported = step("export", dataclasses.replace(longer, scored_step=best))
        assert os.listdir(host.path(where["kept"])) == [str(best)]
        assert any(line.startswith(f"{progress.REPORT_LINE} {best} on test examples 8 to 12") for line in best_exported)
        assert scored(best_exported)[("pre", None)][1] == weights[("intermediate", best)]
        converted = "kept" if best != stack.MORE_BATCHES else "checkpoints/actor"
        assert any(f"{converted}/{best}/model_params" in line for line in best_exported)
        assert (host.path(maxtext.paths(longer)["hf_export"]) / "config.json").is_file()


def test_a_vms_pipeline_runs_every_step_by_the_hosts_own_chain(make_host, tmp_path):
    """The chain `invoke pipeline` starts on a VM (its job's command.sh, run as job_wrapper.sh runs it) converts,
    trains, exports and saves under MaxText itself, each step a job with its log and exit code: the export's
    checkpoint is the one the host chose from MaxText's own evaluation lines, kept from Orbax's deletion unless it is
    the last, its weights those the evaluation scored; and the saved model is on the data disk with its sums."""
    model = next(model for model, placement in stack.placements(TESTED) if placement == "vm")
    host = make_host(TESTED[model])
    chosen = stack.stack(model, "vm")
    run = stack.run(chosen, host.family, host.data, in_slice=False)
    host.keep_compile_caches(maxtext.VM.compile_cache_root(run))
    folder = host.home / "tpu-grpo/jobs/20261207-000000.000-pipeline"
    folder.mkdir(parents=True)
    (folder / "command.sh").write_text(pipeline.chain_script(run, keep_checkpoint=False))
    done = host.run(f"bash {folder}/command.sh", stack.chips_as_devices(chosen.chips), timeout=1800)
    assert done.returncode == 0, tail(done)
    said = [line.split()[2:4] for line in done.stdout.splitlines() if line.startswith("tpu-grpo pipeline:")]
    assert said == [[step, what] for step in ("convert", "train", "export", "save") for what in ("job", "exit")]
    jobs = sorted(path for path in folder.parent.iterdir() if path != folder)
    assert [path.name.rsplit("-", 1)[1] for path in jobs] == ["convert", "train", "export", "save"]
    assert all((path / "exit_code").read_text() == "0\n" for path in jobs), tail_lines(
        (jobs[-1] / "log").read_text().splitlines()
    )
    evaluations = scored((jobs[1] / "log").read_text().splitlines())
    best = best_scored(evaluations)
    exported = (jobs[2] / "log").read_text()
    assert f"tpu-grpo: exports checkpoint {best}, the best scored of those in the store" in exported
    assert f"{'kept' if best != stack.BATCHES else 'checkpoints/actor'}/{best}/model_params" in exported
    assert scored(exported.splitlines())[("pre", None)][1] == evaluations[("intermediate", best)][1]
    assert json.loads((jobs[2] / "job.json").read_text())["inputs"]["step"] == best
    assert (
        host.home / "tpu-grpo/done" / pipeline.record_key(dataclasses.replace(run, scored_step=best), "export")
    ).exists()
    saved = host.path(pipeline.saved_dir(run.name))
    assert (saved / "SHA256SUMS").is_file() and json.loads((saved / "config.json").read_text())["architectures"] == [
        host.family.architecture
    ]
    assert json.loads(host.path(pipeline.saved_record(run.name)).read_text())["step"] == best


def test_the_shipped_list_of_maxtexts_keys_is_the_installed_packages():
    """`--set` refuses a key MaxText's config does not have (tpu_grpo/catalog/maxtext_keys.txt): the list is the one
    tests/maxtext/config_keys.py reads from the installed MaxText now, and holds keys tpu-grpo's runs here pass."""
    said = subprocess.run(
        [str(VENV / "bin/python"), str(ROOT / "tests/maxtext/config_keys.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert said == (ROOT / "tpu_grpo/catalog/maxtext_keys.txt").read_text()
    assert {"learning_rate", "rl.num_generations", "num_batches"} <= set(said.split())

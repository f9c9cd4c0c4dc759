"""A step on a multi-host slice: rendered as a JobSet, created through the Kubernetes API, followed by
its head's log (the same progress view as on one VM), ended by the JobSet's own status, cancelled by
deleting it. What keeps a slice's job from running (no capacity, an image that cannot be pulled, a
crashed worker) is said in one line with what to do.

A pipeline is run by the cluster itself: a driver Job on the CPU pool runs remote/chain.py, the VM's chain, which
creates each step's JobSet once the one before has completed; the laptop starts it and follows its lines."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass

from rich.console import Console

from tpu_grpo.catalog import images, release
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.cloud import jobset
from tpu_grpo.cloud.kube import NAMESPACE, Cluster, ClusterError
from tpu_grpo.config.errors import INTERRUPTED, BadFlag, NotReady, UserError
from tpu_grpo.config.printing import styled
from tpu_grpo.config.settings import Settings
from tpu_grpo.jobs import maxtext, watch
from tpu_grpo.jobs.job_records import JobRecord

#: The replicated job whose pod runs the step's script: the Pathways head, or the CPU job's only one.
SCRIPT_JOBS = ("pathways-head", "main")
POLL_SECONDS = 2.0
PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
#: A registry refusing the puller (containerd's "403 Forbidden", Artifact Registry's "DENIED: Permission ... denied").
PULL_DENIED = re.compile(r"\b403\b|[Ff]orbidden|DENIED|denied|[Uu]nauthorized")
TOTAL_STEPS = "tpu-grpo/total-steps"
RUN_RECORD = "tpu-grpo/run"  # a training's whole run (maxtext.Run.to_record), which its export is made of
#: A Kubernetes label value: the run name is one on each of its jobs.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


@dataclass
class SliceJob:
    name: str
    step: str
    run: str
    state: str  # pending, running, finished, failed
    exit_code: int | None
    created: str
    problem: str | None
    total_steps: int | None = None  # a training's GRPO steps, for the progress bar
    trained: dict | None = None  # a training's run record (maxtext.Run.to_record)

    def record(self) -> JobRecord:
        return JobRecord(
            self.name,
            self.step,
            self.run,
            self.state,
            self.exit_code,
            self.created,
            None,
            self.total_steps,
            self.problem,
        )


def placement(settings: Settings) -> maxtext.Placement:
    """The slice's pods, their training compiled for SHAPE x NUMBER (`v6e-16x2`)."""
    return maxtext.Placement(pod=True, slice_shape=f"{settings.slice}x{settings.num_slices}")


def manifest(settings: Settings, run: maxtext.Run, step: str) -> dict:
    """The JobSet of one step: training under Pathways on the slice, conversion and export on the CPU pool."""
    if not _LABEL_VALUE.fullmatch(run.name):
        raise BadFlag(
            f"--run-name {run.name!r} cannot label a slice's jobs (Kubernetes labels: at most "
            "63 characters, starting and ending with a letter or digit); fix: e.g. "
            "--run-name gsm8k-1"
        )
    name = jobset.job_name(step, run.name)
    image = images.post_training_image(settings.project, settings.region)
    assert settings.tpu_slice, "a slice's stack"
    script = maxtext.script(run, step, placement(settings))
    if step != "train":
        return jobset.cpu(name, step, run.name, image, script)
    made = jobset.pathways(
        name,
        step,
        run.name,
        image,
        script,
        settings.tpu_slice,
        settings.num_slices,
        f"{settings.store.root}/pathways-scratch",
    )
    made["metadata"]["annotations"] = {
        TOTAL_STEPS: str(run.train_steps),  # for a later `logs --follow`
        RUN_RECORD: json.dumps(run.to_record()),
    }
    return made


def _container_statuses(pod: dict) -> list[dict]:
    status = pod.get("status", {})
    return status.get("initContainerStatuses", []) + status.get("containerStatuses", [])


def pull_fix(message: str, image: str) -> str:
    """What to do about an image the nodes cannot pull: a registry that refuses the nodes' account (403, denied) is
    a missing role, not a missing image; kubelet's back-off message names no cause."""
    if PULL_DENIED.search(message):
        return (
            "the nodes' service account may not read the image repository: it needs roles/artifactregistry.reader "
            "on it, which `uv run invoke up` grants (see invoke plan)"
        )
    if image.endswith(f":{release.MAXTEXT_VERSION}"):
        return "uv run invoke image"
    return "check the image's tag and the nodes' access to its registry"


def trouble(pods: list[dict], capacity: str) -> str | None:
    """What keeps the job's pods from running, in one line with the fix, or None."""
    for pod in pods:
        name = pod["metadata"]["name"]
        for container in _container_statuses(pod):
            waiting = container.get("state", {}).get("waiting") or {}
            if waiting.get("reason") in PULL_ERRORS:
                fix = pull_fix(waiting.get("message", ""), container.get("image", ""))
                return (
                    f"{name} cannot pull {container.get('image')} ({waiting['reason']}: "
                    f"{waiting.get('message', '').strip()}); fix: {fix}"
                )
            ended = container.get("state", {}).get("terminated") or container.get("lastState", {}).get("terminated")
            if container["name"] == "pathways-worker" and ended and ended.get("exitCode"):
                return (
                    f"worker {name} crashed (exit {ended['exitCode']}, {ended.get('reason', 'Error')}); fix: read "
                    f"its log (kubectl logs {name} -c pathways-worker --previous); Kubernetes restarts it"
                )
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return (
                    f"{name} cannot be scheduled{CAPACITIES[capacity].unschedulable_note}: "
                    f"{condition.get('message', '').strip()}; fix: check the TPU node pool's capacity and quota "
                    "(gcloud container node-pools describe; the reservation, spot availability, TPU quota in the "
                    "zone)"
                )
    return None


def describe(cluster: Cluster, found: dict, capacity: str) -> SliceJob:
    return _state(found, cluster.pods(found["metadata"]["name"]), capacity)


def _state(found: dict, pods: list[dict], capacity: str) -> SliceJob:
    """A JobSet's state from its own status: Completed or Failed conditions end it; the exit code is the
    script's (its container's), else 1 for a failure. Its pods say what keeps it from running."""
    meta, status = found["metadata"], found.get("status", {})
    conditions = {c["type"] for c in status.get("conditions", []) if c.get("status") == "True"}
    exit_code, problem = None, None
    if "Completed" in conditions:
        state, exit_code = "finished", 0
    elif "Failed" in conditions:
        state, exit_code = "failed", _script_exit_code(pods) or 1
        problem = trouble(pods, capacity) or next(
            (c.get("message") for c in status.get("conditions", []) if c["type"] == "Failed"), None
        )
    else:
        running = any(pod.get("status", {}).get("phase") == "Running" for pod in pods)
        state, problem = ("running" if running else "pending"), trouble(pods, capacity)
    labels, annotations = meta.get("labels", {}), meta.get("annotations", {})
    total, record = annotations.get(TOTAL_STEPS, ""), annotations.get(RUN_RECORD)
    return SliceJob(
        meta["name"],
        labels.get(jobset.STEP_LABEL, "?"),
        labels.get(jobset.RUN_LABEL, "?"),
        state,
        exit_code,
        meta.get("creationTimestamp", ""),
        problem,
        int(total) if re.fullmatch(r"[0-9]+", total) else None,
        json.loads(record) if record else None,
    )


def _script_pod(pods: list[dict]) -> dict | None:
    return next(
        (
            pod
            for pod in pods
            if pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/replicatedjob-name") in SCRIPT_JOBS
        ),
        None,
    )


def _script_exit_code(pods: list[dict]) -> int | None:
    pod = _script_pod(pods)
    for container in (pod or {}).get("status", {}).get("containerStatuses", []):
        if container["name"] == jobset.CONTAINER and container.get("state", {}).get("terminated"):
            return container["state"]["terminated"].get("exitCode")
    return None


def put_token(cluster: Cluster, needed: bool) -> None:
    """The laptop's Hugging Face token (as huggingface_hub finds it) into the cluster's Secret, replaced when
    given again; a job that `needed` one (a gated model's) without one is refused before it is created."""
    from tpu_grpo.provision.engine import local_secret

    token = local_secret("hf_token")
    if token:
        cluster.put_token(token)
    elif needed and not cluster.has_token():
        raise UserError(
            "no Hugging Face token for the slice's pods: HF_TOKEN is not set and the cluster "
            f"has no Secret {jobset.TOKEN_SECRET}; fix: HF_TOKEN=hf_... uv run invoke pipeline"
        )


def ready(cluster: Cluster, settings: Settings, run: maxtext.Run) -> None:
    """What a run's jobs need on the cluster before one is created: the image pushed, the token (a gated model's)."""
    image = images.post_training_image(settings.project, settings.region)
    if cluster.image_record().get("image") != image:
        raise NotReady(f"the cluster has no record of {image} being pushed; fix: uv run invoke image")
    put_token(cluster, needed=run.row.gated)


def refuse_running(cluster: Cluster, settings: Settings, run: maxtext.Run, step: str) -> None:
    """Refuse to start a step of a run whose JobSet of that step has not ended."""
    name = jobset.job_name(step, run.name)
    before = cluster.jobset(name)
    if before is not None and describe(cluster, before, settings.capacity).state not in ("finished", "failed"):
        raise NotReady(
            f"job {name} ({step} of run {run.name}) is still on the cluster; fix: "
            f"wait for it (uv run invoke logs --job {name} --follow) or cancel it "
            f"(uv run invoke cancel --job {name})"
        )


def start(cluster: Cluster, settings: Settings, run: maxtext.Run, step: str) -> str:
    """Create the step's JobSet (an ended one of the same name replaced); its name."""
    wanted = manifest(settings, run, step)
    ready(cluster, settings, run)
    refuse_running(cluster, settings, run, step)
    name = wanted["metadata"]["name"]
    if cluster.delete(name):  # ended: a step run again
        _wait_gone(cluster.jobset, name)
    cluster.create(wanted)
    return name


def _wait_gone(read, name: str, timeout_s: float = 120.0) -> None:
    """Wait until the API has let a deleted object go (`read` returns None)."""
    deadline = time.monotonic() + timeout_s
    while read(name) is not None:
        if time.monotonic() > deadline:
            raise ClusterError(f"job {name} is still being deleted after {timeout_s:.0f} s; fix: try again shortly")
        time.sleep(POLL_SECONDS)


#: A pipeline's driver as status and cancel name its step.
CHAIN = "pipeline"
#: What a step the driver did not run is said to be.
NOT_RUN = {"done": "its output is in the bucket", "skipped": "a later step is done"}
LOG_TAIL_LINES = 15


def driver_name(run: maxtext.Run) -> str:
    return jobset.job_name(CHAIN, run.name)


def chain_step(settings: Settings, run: maxtext.Run, step: str, output: str | None) -> dict:
    """One step as the driver (remote/chain.py) runs it: its JobSet, and a test that holds when its output is in the
    bucket (the export has none: it runs each time)."""
    from tpu_grpo.jobs import pipeline

    test = pipeline.bucket_holds(output, python="python3") if output else "false"
    return {"name": step, "manifest": manifest(settings, run, step), "test": test, "record": "", "when_done": ""}


def chain_data(settings: Settings, run: maxtext.Run) -> dict:
    """What the driver is given: convert and train, each skipped when its output is in the bucket, and the export
    chosen as pipeline.exports says, by the training's head log and the checkpoints in the bucket."""
    from tpu_grpo.jobs import pipeline

    run = dataclasses.replace(run, scored_step=None)
    paths = maxtext.paths(run)
    listing = pipeline.steps_on_host(paths["checkpoints"], python="python3")
    data = {
        "cluster": {"namespace": NAMESPACE, "poll": POLL_SECONDS},
        "steps": [
            chain_step(settings, run, "convert", paths["checkpoint"]),
            chain_step(settings, run, "train", paths["post_train"]),
        ],
        **pipeline.exports(run, lambda chosen: [chain_step(settings, chosen, "export", None)], listing),
    }
    data["choose"]["training"] = jobset.job_name("train", run.name)
    return data


def start_chain(cluster: Cluster, settings: Settings, run: maxtext.Run) -> str:
    """Create the run's driver (an ended one of its name replaced), after every check a step's start makes: each
    step's JobSet renders, the image was pushed, the token is there, and no step of the run is on the cluster."""
    from tpu_grpo.host import remote

    data = chain_data(settings, run)
    ready(cluster, settings, run)
    if not cluster.has_pipeline_account():
        raise ClusterError(
            f"the cluster has no service account {release.PIPELINE_ACCOUNT}, which a pipeline's driver runs as (a "
            "stack made before pipelines ran in the cluster); fix: uv run invoke up"
        )
    for step in maxtext.STEPS:
        refuse_running(cluster, settings, run, step)
    name = driver_name(run)
    if cluster.delete_driver(name):  # ended (a running one is followed instead: SliceTarget.pipeline)
        _wait_gone(cluster.driver, name)
    image = images.post_training_image(settings.project, settings.region)
    files = {"chain.py": remote.text("chain"), "chain.json": json.dumps(data, sort_keys=True)}
    cluster.start_driver(jobset.driver(name, run.name, image), files)
    return name


def _driver_state(found: dict, pods: list[dict]) -> SliceJob:
    """A driver's state from its Job's conditions (Complete, Failed), its exit code its container's."""
    meta, status = found["metadata"], found.get("status", {})
    conditions = {c["type"] for c in status.get("conditions", []) if c.get("status") == "True"}
    ended = [
        container["state"]["terminated"].get("exitCode")
        for pod in pods
        for container in pod.get("status", {}).get("containerStatuses", [])
        if container.get("state", {}).get("terminated")
    ]
    if "Complete" in conditions:
        state, exit_code = "finished", 0
    elif "Failed" in conditions:
        state, exit_code = "failed", next((code for code in ended if code), 1)
    else:
        running = any(pod.get("status", {}).get("phase") == "Running" for pod in pods)
        state, exit_code = ("running" if running else "pending"), None
    labels = meta.get("labels", {})
    return SliceJob(
        meta["name"],
        CHAIN,
        labels.get(jobset.RUN_LABEL, "?"),
        state,
        exit_code,
        meta.get("creationTimestamp", ""),
        None,
    )


def drivers_on(cluster: Cluster) -> list[SliceJob]:
    return [_driver_state(found, cluster.driver_pods(found["metadata"]["name"])) for found in cluster.drivers()]


def driver_log(cluster: Cluster, name: str, pods: list[dict] | None = None) -> bytes:
    """The driver's lines so far (from its `pods`, when listed already)."""
    pods = cluster.driver_pods(name) if pods is None else pods
    return b"".join(cluster.log(pods[0]["metadata"]["name"], jobset.DRIVER_CONTAINER)) if pods else b""


def follow_chain(
    cluster: Cluster, name: str, console: Console, capacity: str, total_steps: int | None = None, verbose: bool = False
) -> tuple[int, list[dict]]:
    """Follow a driver to its end: each step's JobSet as its line names it (pipeline.CHAIN_LINE) through `follow`, a
    step it did not run said. Its exit code (errors.INTERRUPTED on Ctrl-C: it runs on) and what happened, by step."""
    from tpu_grpo.jobs import pipeline

    steps: list[dict] = []
    handled, lines = 0, []
    try:
        while (found := cluster.driver(name)) is not None:
            pods = cluster.driver_pods(name)
            job = _driver_state(found, pods)
            lines = driver_log(cluster, name, pods).decode(errors="replace").split("\n")[:-1]  # whole lines only
            for line in lines[handled:]:
                said = pipeline.CHAIN_LINE.fullmatch(line.strip())
                if said is None or said["what"] == "exit":
                    continue
                step, what = said["step"], said["what"]
                if what != "job":
                    console.print(f"{step}: {what} ({NOT_RUN[what]})")
                    steps.append({"step": step, "state": what, "job": None})
                    continue
                total = None
                if step == "train":  # the run's, else its JobSet's own (a follow that did not start the chain)
                    made = cluster.jobset(said["detail"])
                    total = total_steps or (_state(made, [], capacity).total_steps if made else None)
                code = follow(cluster, said["detail"], step, console, capacity, total, verbose, detach=False)
                state = "finished" if code == 0 else "failed"
                steps.append({"step": step, "state": state, "job": said["detail"], "exit_code": code})
            handled = len(lines)
            if job.exit_code is not None:
                if job.exit_code and not any(step["state"] == "failed" for step in steps):
                    console.print(f"the pipeline's driver {name} failed (exit {job.exit_code}); the end of its log:")
                    console.print("\n".join(lines[-LOG_TAIL_LINES:]), markup=False, highlight=False)
                return job.exit_code, steps
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        console.print(
            f"\ndetached: the pipeline keeps running on the cluster (job {name}); reattach: uv run invoke logs "
            f"--job {name} --follow; stop it: uv run invoke cancel --job {name}"
        )
        return INTERRUPTED, steps
    console.print(f"the pipeline's driver {name} is gone from the cluster (cancelled?)")
    return INTERRUPTED, steps


def pipeline(
    cluster: Cluster, settings: Settings, run: maxtext.Run, console: Console, verbose: bool = False
) -> tuple[int, dict]:
    """The run's pipeline by its driver on the cluster, which runs convert -> train -> export without this laptop
    (started, or followed when it runs already); the exit code and what happened, step by step."""
    name = driver_name(run)
    found = cluster.driver(name)
    if found and _driver_state(found, cluster.driver_pods(name)).state in ("pending", "running"):
        console.print(f"pipeline: run {run.name}'s driver {name} runs already on the cluster; following it")
    else:
        start_chain(cluster, settings, run)
        console.print(
            f"pipeline: job {name} created on the slice's CPU host (cluster {settings.vm_name}); it runs the steps "
            "in order, this laptop open or not"
        )
    code, steps = follow_chain(cluster, name, console, settings.capacity, run.train_steps, verbose)
    model = f"{maxtext.paths(run)['run_export']}/" if code == 0 else None
    return code, {"run": run.name, "steps": steps, "model": model}


def follow(
    cluster: Cluster,
    name: str,
    step: str,
    console: Console,
    capacity: str,
    total_steps: int | None = None,
    verbose: bool = False,
    detach: bool = True,
) -> int:
    """Follow a JobSet to its end: its script's log through the progress view, its trouble said once
    each; the exit code is the JobSet's verdict. Ctrl-C detaches (said here), or, not `detach`, is the caller's."""
    try:
        return _follow(cluster, name, step, console, capacity, total_steps, verbose)
    except KeyboardInterrupt:
        if not detach:
            raise
        console.print(
            f"\ndetached: job {name} keeps running on the cluster; reattach: uv run invoke logs --job {name} "
            f"--follow; stop it: uv run invoke cancel --job {name}"
        )
        return INTERRUPTED


def _follow(
    cluster: Cluster, name: str, step: str, console: Console, capacity: str, total_steps: int | None, verbose: bool
) -> int:
    said: set[str] = set()
    streamed = False
    with watch.JobView(console, name, step, total_steps, verbose) as view:
        while True:
            found = cluster.jobset(name)
            if found is None:
                view.note(f"job {name} is gone from the cluster (cancelled?)")
                code = INTERRUPTED
                break
            pods = cluster.pods(name)
            job, pod = _state(found, pods, capacity), _script_pod(pods)
            if job.problem and job.problem not in said:
                said.add(job.problem)
                view.note(job.problem)
            if job.state in ("finished", "failed"):
                assert job.exit_code is not None, "an ended JobSet's state carries its exit code"
                code = job.exit_code
                if not streamed and pod:
                    _stream(cluster, pod, view, follow_log=False)
                break
            if not streamed and pod and pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"):
                _stream(cluster, pod, view, follow_log=True)
                streamed = True
                continue
            time.sleep(POLL_SECONDS)
    verdict = "[green]finished[/]" if code == 0 else f"[red]failed (exit {code})[/]"
    console.print(styled("{} " + verdict + ": job {}, {} log lines (saved in {})", step, name, view.lines, view.path))
    return code


def _stream(cluster: Cluster, pod: dict, view: watch.JobView, follow_log: bool) -> None:
    for chunk in cluster.log(pod["metadata"]["name"], jobset.CONTAINER, follow=follow_log):
        view.feed(chunk)


def jobs_on(cluster: Cluster, capacity: str) -> list[SliceJob]:
    """tpu-grpo's jobs on the cluster, oldest first."""
    return [describe(cluster, found, capacity) for found in cluster.jobsets()]


def status(cluster: Cluster, capacity: str) -> list[JobRecord]:
    """Every job of tpu-grpo's on the cluster, its pipelines' drivers among them, oldest first."""
    found = jobs_on(cluster, capacity) + drivers_on(cluster)
    return [job.record() for job in sorted(found, key=lambda job: job.created)]


def cancel(cluster: Cluster, name: str | None, capacity: str) -> list[str]:
    """Delete the named job of tpu-grpo's (a driver: it and the steps of its run still pending or running), else every
    one of them still pending or running, the drivers first, which then start no next step; the names deleted.
    Another JobSet or Job in the cluster is never touched."""
    drivers = drivers_on(cluster)
    if name in {driver.name for driver in drivers}:
        [run] = [driver.run for driver in drivers if driver.name == name]
        cluster.delete_driver(name)
        return [name, *_delete_running(cluster, capacity, run)]
    if name:
        ours = {found["metadata"]["name"] for found in cluster.jobsets()}  # tpu-grpo's, by their run label
        if name not in ours or not cluster.delete(name):
            raise BadFlag(f"--job {name!r} is no job of tpu-grpo's on the cluster; fix: uv run invoke status")
        return [name]
    stopped = [driver.name for driver in drivers if driver.state in ("pending", "running")]
    for driver in stopped:
        cluster.delete_driver(driver)
    return stopped + _delete_running(cluster, capacity)


def _delete_running(cluster: Cluster, capacity: str, run: str | None = None) -> list[str]:
    """Delete the JobSets still pending or running (of `run`, else all of tpu-grpo's); their names."""
    running = [
        job.name for job in jobs_on(cluster, capacity) if job.state in ("pending", "running") and run in (None, job.run)
    ]
    for job in running:
        cluster.delete(job)
    return running


def find(cluster: Cluster, name: str | None, capacity: str) -> SliceJob:
    """The named job, else the running one, else the newest (a pipeline's driver among them)."""
    found = sorted(jobs_on(cluster, capacity) + drivers_on(cluster), key=lambda job: job.created)
    if name:
        chosen = next((job for job in found if job.name == name), None)
        if chosen is None:
            raise BadFlag(f"--job {name!r} is no job on the cluster; fix: uv run invoke status")
        return chosen
    if not found:
        raise NotReady("no jobs on the cluster yet; fix: uv run invoke pipeline --batches 50")
    return next((job for job in reversed(found) if job.state == "running"), found[-1])


def read_log(cluster: Cluster, name: str):
    """A job's script log as it stands (not followed)."""
    pod = _script_pod(cluster.pods(name))
    return cluster.log(pod["metadata"]["name"], jobset.CONTAINER) if pod else iter(())


def for_export(cluster: Cluster, run: maxtext.Run, capacity: str) -> maxtext.Run:
    """The run to export on the cluster (pipeline.export_choice), from its training JobSets' records and the
    training's log; its checkpoints are the bucket's."""
    from tpu_grpo.jobs import pipeline

    trained = [
        (job.run, maxtext.Run.from_record(job.trained) if job.trained else None)
        for job in jobs_on(cluster, capacity)
        if job.step == "train" and job.state == "finished"
    ]
    return pipeline.export_choice(
        run,
        trained,
        lambda name: train_log(cluster, name).decode(errors="replace").splitlines(),
        lambda chosen: pipeline.checkpoint_steps(None, chosen),
        "on the cluster",
    )


def progress_of(cluster: Cluster, records: list[JobRecord]) -> dict | None:
    """Where the running (else newest) training on the cluster stands, from its log: the curve so far and its best,
    as a VM's status says them (watch.log_progress)."""
    trains = [record for record in records if record.step == "train" and record.state != "pending"]
    if not trains:
        return None
    job = next((record for record in reversed(trains) if record.state == "running"), trains[-1])
    lines = train_log(cluster, job.run).decode(errors="replace").splitlines()
    year = int(job.started[:4]) if job.started[:4].isdigit() else time.gmtime().tm_year
    return {"job": job.id, "run": job.run, **watch.log_progress(lines, job.total_steps or 0, year)}


def trained(cluster: Cluster, run: str, capacity: str) -> maxtext.Run | None:
    """The run its newest training JobSet ran, from its record (None: no training, or one made before records)."""
    records = [job.trained for job in jobs_on(cluster, capacity) if job.step == "train" and job.run == run]
    return maxtext.Run.from_record(records[-1]) if records and records[-1] else None


def newest_run(cluster: Cluster, step: str, capacity: str) -> str:
    """The run of the newest job of `step` that finished on the cluster."""
    done = [job for job in jobs_on(cluster, capacity) if job.step == step and job.state == "finished"]
    if not done:
        raise NotReady(
            f"no finished {step} job on the cluster; fix: name the run (--run RUN), or run "
            f"it: uv run invoke pipeline --batches 50"
        )
    return done[-1].run


def train_log(cluster: Cluster, run: str) -> bytes:
    """A run's training log: the copy following it kept on this laptop, else the head pod's while it is there."""
    name = jobset.job_name("train", run)
    kept = watch.local_log(name)
    if kept.is_file() and kept.stat().st_size:
        return kept.read_bytes()
    return b"".join(read_log(cluster, name))


def next_start(settings: Settings) -> dict | None:
    """Whether the next training of the stack's settings on the slice starts warm: the entries of its compile cache in
    the bucket (one listing), in the folder of the image's MaxText and JAX (the pod names its libtpu); None when the
    bucket does not answer."""
    from tpu_grpo.host import gcs
    from tpu_grpo.host.remote.compile_cache import ENTRY

    run = maxtext.Run.of(settings.training)
    at = placement(settings)
    root = at.compile_cache_root(run)
    named = maxtext.compile_cache_name(run, "train", at.slice_shape)
    try:
        found = gcs.sizes(root)
    except gcs.StoreError:
        return None
    folders: dict[str, list[int]] = {}
    image = f"maxtext-{release.MAXTEXT_VERSION}_jax-{release.JAX_VERSION}_"
    for name, size in found.items():
        versions, _, rest = name.partition("/")
        if versions.startswith(image) and rest.startswith(f"{named}/") and rest.endswith(ENTRY):
            folders.setdefault(versions, []).append(size)
    versions = max(folders, key=lambda each: len(folders[each]), default="VERSIONS")
    entries = folders.get(versions, [])
    return {
        "warm": bool(entries),
        "entries": len(entries),
        "bytes": sum(entries),
        "folder": f"{root}/{versions}/{named}",
    }

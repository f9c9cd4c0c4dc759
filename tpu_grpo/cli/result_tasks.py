"""What a run leaves: runs, fetch, publish, metrics, tensorboard and timeline."""

from __future__ import annotations

import json

from invoke import Exit

from tpu_grpo.cli.checks import check_fetch, check_hosts, check_metrics, check_publish, check_tensorboard, check_vm
from tpu_grpo.cli.flags import HOST_FLAGS, checked, flag_help, one_line_errors, task
from tpu_grpo.config import laptop_paths
from tpu_grpo.config.errors import INTERRUPTED
from tpu_grpo.config.printing import styled, terminal


@task(iterable=["host"], check=check_hosts, help=flag_help(*HOST_FLAGS, "json"))
def runs(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """Every run in one table, newest first: what it was given, how it scored, what it cost, where its model is.

    From the host and this laptop's fetched copies, whichever answer (--json says which did)."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources
    from tpu_grpo.results.runs import show

    with one_line_errors():
        found, answered = sources.of(targets.pick(checked(check_hosts))).runs()
    if json_:
        print(json.dumps({"sources": answered, "runs": [row.to_json() for row in found]}, indent=2))
        return
    show(terminal(), found, answered)


@task(
    iterable=["host"],
    check=check_fetch,
    help=flag_help(
        *HOST_FLAGS,
        "json",
        run="the run whose saved model to fetch (default: the newest saved)",
        to="local folder (default: models/RUN)",
    ),
)
def fetch(c, run=None, to=None, host=None, identity=None, stack=None, wait=None, json_=False):
    """Download a run's exported model to this laptop: with progress, resumable, checksums verified."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    with one_line_errors():
        destination, where = checked(check_fetch)
        result = sources.of(targets.pick(where)).fetch(run, destination, terminal(stderr=json_))
    if json_:
        print(json.dumps(result.to_json(), indent=2))


@task(
    iterable=["host"],
    check=check_publish,
    help=flag_help(
        *HOST_FLAGS,
        "json",
        "verbose",
        repo="OWNER/NAME: the Hugging Face model repository (created if missing)",
        run="the run whose saved model to publish (default: the newest saved)",
        public="make a new repository public (default: private)",
    ),
)
def publish(
    c, repo=None, run=None, public=False, host=None, identity=None, stack=None, wait=None, json_=False, verbose=False
):
    """Upload a run's saved model to the Hugging Face Hub, with a model card; a re-run sends nothing twice."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results.publish import publish

    console = terminal(stderr=json_)
    with one_line_errors():
        where = checked(check_publish)
        session = vm_jobs.session(where.flags, where.settings)
        try:
            outcome = publish(session, run, repo, not public, console, verbose)
        except KeyboardInterrupt:
            console.print("\ndetached: the upload goes on on the host; reattach: uv run invoke logs --follow")
            raise Exit(code=INTERRUPTED) from None
    if json_:
        print(json.dumps(outcome.to_json(), indent=2))
        return
    sent = (
        f"{len(outcome.uploaded)} files ({outcome.bytes_uploaded} bytes) uploaded in commit {outcome.commit}"
        if outcome.uploaded
        else "nothing uploaded: the Hub already holds every file"
    )
    console.print(
        styled(
            "[green]published[/] run {} at {}: {}; {} already there; card: {}",
            outcome.run,
            outcome.url,
            sent,
            outcome.already_there,
            outcome.card,
        )
    )


@task(
    iterable=["host", "compare"],
    check=check_metrics,
    help=flag_help(
        *HOST_FLAGS,
        "json",
        run="run name (default: the newest trained run)",
        compare="RUN, repeatable: overlay two or more runs' reward, KL, completion length and eval accuracy in one PNG "
        "(default --out .tpu-grpo/compare.png), the legend naming the inputs in which they differ",
        out="PNG to write (default: .tpu-grpo/runs/RUN/metrics.png); an existing file only if tpu-grpo wrote it",
        force="let --out overwrite any existing file",
        events="read a local folder of TensorBoard events instead of the host's",
        log="with --events: the training's log (train_rl's output), whose evaluations the plot shows",
    ),
)
def metrics(
    c,
    run=None,
    out=None,
    events=None,
    log=None,
    force=False,
    host=None,
    identity=None,
    stack=None,
    wait=None,
    json_=False,
    compare=None,
):
    """Reward, loss, KL and completion length per step (TensorBoard) and eval accuracy (log): table and PNG."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import retrieval, sources
    from tpu_grpo.results.metrics import best_eval, plot, table

    with one_line_errors():
        path, where = checked(check_metrics)
        if compare:  # the runs of the host (or cluster), one plot
            source = sources.of(targets.pick(where))
            found = [source.metrics(name, None)[0] for name in compare]
            path = plot(found, path or laptop_paths.state() / laptop_paths.COMPARE_PLOT)
        elif events:  # a folder here: no host, no cluster
            found, path = retrieval.metrics_of_events(run, events, log, path)
        else:
            found, path = sources.of(targets.pick(where)).metrics(run, path)
    if json_:
        data = {"runs": [one.to_json() for one in found]} if compare else found.to_json()
        print(json.dumps({**data, "plot": str(path)}, indent=2))
        return
    console = terminal()
    for one in found if compare else [found]:
        console.print(table(one))
        if best := best_eval(one):
            console.print(f"best: {best['accuracy']:g}% at step {best['step']} (marked `best` in the plot)")
    console.print(f"plot: {path}")


@task(
    iterable=["host"],
    check=check_tensorboard,
    help=flag_help(
        *HOST_FLAGS,
        "json",
        run="one run to show (default: every run trained on the host, side by side)",
        port="the port TensorBoard listens on, on 127.0.0.1 (default 6006)",
        every="seconds between syncs of the events from the host (default 5)",
        once="sync the events once and exit, without serving",
    ),
)
def tensorboard(
    c, run=None, port=None, every=None, once=False, host=None, identity=None, stack=None, wait=None, json_=False
):
    """TensorBoard on this laptop over the runs' events, synced from the host while they train; Ctrl-C stops it."""
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results import tensorboard_sync

    console = terminal(stderr=json_)
    with one_line_errors():
        port_number, every_s, where = checked(check_tensorboard)
        session = vm_jobs.session(where.flags, where.settings)
        try:
            copied = tensorboard_sync.sync(session, run)
        except hosts.ConnectError as error:
            copied = dict.fromkeys(tensorboard_sync.local_runs(run, laptop_paths.state()), 0)
            if once or not copied:
                raise
            console.print(f"the host does not answer ({error}); serving the events already here")
    if once:
        if json_:
            print(
                json.dumps(
                    {
                        "runs": {
                            name: {"bytes_copied": count, "events": str(laptop_paths.events(name))}
                            for name, count in copied.items()
                        }
                    },
                    indent=2,
                )
            )
        for name, count in copied.items():
            console.print(f"{name}: {count} new bytes of events in {laptop_paths.events(name)}")
        return
    try:
        url = tensorboard_sync.serve(sorted(copied), port_number)
    except Exception as error:  # noqa: BLE001 - TensorBoard's own errors (a port in use): one line
        raise Exit(f"error: TensorBoard did not start ({error}); fix: --port another port", code=1) from None
    console.print(
        f"TensorBoard: {url} (runs: {', '.join(sorted(copied))}); syncing every {every_s:g} s; "
        f"Ctrl-C stops it, the events stay in {laptop_paths.runs()}",
        soft_wrap=True,
    )
    try:
        tensorboard_sync.keep_in_sync(session, run, every_s, console.print)
    except KeyboardInterrupt:
        console.print("stopped")
        raise Exit(code=INTERRUPTED) from None


@task(iterable=["host"], check=check_vm, help=flag_help(*HOST_FLAGS, "json"))
def timeline(c, host=None, identity=None, stack=None, wait=None, json_=False):
    """Where the VM's hours went since it booted: a table and a chart.

    Each phase (the search for chips that made it, provisioning, download, jobs, training steps, evals, saves,
    fetches, idle), the paid time and its training share; the chart is .tpu-grpo/timeline.png."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results.timeline import build, fetches, gather, plot, searches, show

    with one_line_errors():
        where = checked(check_vm)
        session = vm_jobs.session(where.flags, where.settings)
        found = gather(session.connection)
    built = build(session.host.name, found, fetches(), searches(where.settings.stack if where.settings else None))
    png = plot(built, laptop_paths.state() / laptop_paths.TIMELINE_PLOT)
    if json_:
        print(json.dumps({**built.to_json(), "chart": str(png)}, indent=2))
        return
    show(terminal(), built, png)

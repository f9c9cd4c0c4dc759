"""What a run leaves: runs, fetch, publish, metrics, tensorboard and timeline."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from invoke import Exit

from tpu_grpo.cli.checks import Fetch, Fetching, Metrics, Plotting, Publish, Runs, Serving, Tensorboard, Timeline
from tpu_grpo.cli.flags import one_line_errors, task
from tpu_grpo.config import laptop_paths
from tpu_grpo.config.errors import INTERRUPTED
from tpu_grpo.config.printing import styled, terminal

if TYPE_CHECKING:
    from tpu_grpo.jobs.targets import Where


@task(flags=Runs)
def runs(c, flags: Runs, where: Where):
    """Every run in one table, newest first: what it was given, how it scored, what it cost, where its model is.

    From the host and this laptop's fetched copies, whichever answer (--json says which did)."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources
    from tpu_grpo.results.runs import show

    with one_line_errors():
        found, answered = sources.of(targets.pick(where)).runs()
    if flags.json_:
        print(json.dumps({"sources": answered, "runs": [row.to_json() for row in found]}, indent=2))
        return
    show(terminal(), found, answered)


@task(flags=Fetch)
def fetch(c, flags: Fetch, checked: Fetching):
    """Download a run's exported model to this laptop: with progress, resumable, checksums verified."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    with one_line_errors():
        result = sources.of(targets.pick(checked.where)).fetch(
            flags.run, checked.destination, terminal(stderr=flags.json_)
        )
    if flags.json_:
        print(json.dumps(result.to_json(), indent=2))


@task(flags=Publish)
def publish(c, flags: Publish, where: Where):
    """Upload a run's saved model to the Hugging Face Hub, with a model card; a re-run sends nothing twice."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results.publish import publish

    console = terminal(stderr=flags.json_)
    with one_line_errors():
        session = vm_jobs.session(where.flags, where.settings)
        try:
            outcome = publish(session, flags.run, str(flags.repo), not flags.public, console, flags.verbose)
        except KeyboardInterrupt:
            console.print("\ndetached: the upload goes on on the host; reattach: uv run invoke logs --follow")
            raise Exit(code=INTERRUPTED) from None
    if flags.json_:
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


@task(flags=Metrics)
def metrics(c, flags: Metrics, checked: Plotting):
    """Reward, loss, KL and completion length per step (TensorBoard) and eval accuracy (log): table and PNG."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import retrieval, sources
    from tpu_grpo.results.metrics import best_eval, plot, table

    with one_line_errors():
        path, compare = checked.path, flags.compare
        if flags.events:  # a folder here: no host, no cluster
            one, path = retrieval.metrics_of_events(flags.run, flags.events, flags.log, path)
            found = [one]
        else:
            assert checked.where is not None, "the host is checked unless --events names a folder"
            source = sources.of(targets.pick(checked.where))
            if compare:  # the runs of the host (or cluster), one plot
                found = [source.metrics(name, None)[0] for name in compare]
                path = plot(found, path or laptop_paths.state() / laptop_paths.COMPARE_PLOT)
            else:
                one, path = source.metrics(flags.run, path)
                found = [one]
    if flags.json_:
        data = {"runs": [one.to_json() for one in found]} if compare else found[0].to_json()
        print(json.dumps({**data, "plot": str(path)}, indent=2))
        return
    console = terminal()
    for one in found:
        console.print(table(one))
        if best := best_eval(one):
            console.print(f"best: {best['accuracy']:g}% at step {best['step']} (marked `best` in the plot)")
    console.print(f"plot: {path}")


@task(flags=Tensorboard)
def tensorboard(c, flags: Tensorboard, checked: Serving):
    """TensorBoard on this laptop over the runs' events, synced from the host while they train; Ctrl-C stops it."""
    from tpu_grpo.host import hosts
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results import tensorboard_sync

    console = terminal(stderr=flags.json_)
    run, port_number, every_s, where = flags.run, checked.port, checked.every_s, checked.where
    with one_line_errors():
        session = vm_jobs.session(where.flags, where.settings)
        try:
            copied = tensorboard_sync.sync(session, run)
        except hosts.ConnectError as error:
            copied = dict.fromkeys(tensorboard_sync.local_runs(run, laptop_paths.state()), 0)
            if flags.once or not copied:
                raise
            console.print(f"the host does not answer ({error}); serving the events already here")
    if flags.once:
        if flags.json_:
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


@task(flags=Timeline)
def timeline(c, flags: Timeline, where: Where):
    """Where the VM's hours went since it booted: a table and a chart.

    Each phase (the search for chips that made it, provisioning, download, jobs, training steps, evals, saves,
    fetches, idle), the paid time and its training share; the chart is .tpu-grpo/timeline.png."""
    from tpu_grpo.jobs import vm_jobs
    from tpu_grpo.results.timeline import build, fetches, gather, plot, searches, show

    with one_line_errors():
        session = vm_jobs.session(where.flags, where.settings)
        found = gather(session.connection)
    built = build(session.host.name, found, fetches(), searches(where.settings.stack if where.settings else None))
    png = plot(built, laptop_paths.state() / laptop_paths.TIMELINE_PLOT)
    if flags.json_:
        print(json.dumps({**built.to_json(), "chart": str(png)}, indent=2))
        return
    show(terminal(), built, png)

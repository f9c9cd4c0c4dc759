"""The stack's tasks: plan, settings, up, image and down."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from invoke import Exit

from tpu_grpo.cli.checks import Down, Image, OnHost, Plan, SettingsFlags, Up
from tpu_grpo.cli.flags import exit_on_failure, one_line_errors, task
from tpu_grpo.config import keys, stack_file
from tpu_grpo.config.errors import INTERRUPTED, UserError
from tpu_grpo.config.printing import terminal
from tpu_grpo.config.settings import Settings

if TYPE_CHECKING:
    from tpu_grpo.jobs.targets import Where


@task(flags=Plan)
def plan(c, flags: Plan, chosen: Settings):
    """Show what `pulumi up` would create, what it costs and how a run goes (offline).

    One screen; --scripts adds every input and script. Exits 2 while a setting is still to set."""
    from tpu_grpo.cli.plan import build, render

    with one_line_errors():
        result = build(flags.stack)
    if flags.json_:
        print(json.dumps(result.to_json(), indent=2))
    else:
        render(result, terminal(), scripts=flags.scripts)
    if result.pending:
        still = ", ".join(item["key"] for item in result.pending)
        raise Exit(
            f"error: still to set before `pulumi up`: {still}; fix: the commands above, then uv run invoke plan",
            code=UserError.exit_code,
        )


@task(flags=SettingsFlags)
def settings(c, flags: SettingsFlags, chosen: Settings):
    """List every stack setting with its value and meaning, after validating them all."""
    with one_line_errors():
        values = stack_file.read_stack_file(chosen.stack, stack_file.project_root())
    if flags.json_:  # each key: what it comes to, and whence when the stack file does not set it (null: it does)

        def shown(key: keys.Key) -> dict:
            if values.get(key.name) is not None:
                return {"value": values[key.name], "default": None}
            value, whence = chosen.default(key) or (None, "unset")
            return {"value": value, "default": whence}

        said = {
            "settings": {key.name: shown(key) for key in keys.KEYS},
            "pending": [error.to_json() for error in chosen.pending],  # as plan --json says them
            "warnings": chosen.warnings,
        }
        print(json.dumps(said, indent=2))
        return
    from rich.table import Table

    table = Table("setting", "value", "meaning")
    table.columns[0].no_wrap = True
    for key in keys.KEYS:  # shown as written: `[/PREFIX]` or a value in brackets is no markup
        value = values.get(key.name)
        table.add_row(key.name, str(value) if value is not None else chosen.default_shown(key), key.help)
    console = terminal()
    console.print(table)
    for pending in chosen.pending:
        console.print(f"still to set before `pulumi up`: {pending}")
    for warning in chosen.warnings:
        console.print(f"warning: {warning}")


@task(flags=Up)
def up(c, flags: Up, chosen: Settings):
    """Create or update the TPU VM (or a slice's cluster) with `pulumi up`, after checking everything it needs.

    With tpu-grpo:fallback, the next place is tried when Google has no chips (docs/capacity.md). Refused while a
    change would delete the data disk (a new gcp:zone or vmName) with runs not yet fetched."""
    from tpu_grpo.cloud.search import find_chips
    from tpu_grpo.cloud.stack import missing_for_up, select_and_refresh
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    missing = missing_for_up(chosen)
    if missing:
        lines = "\n".join(f"  - {item}" for item in missing)
        raise Exit(
            f"error: `pulumi up` for stack '{chosen.stack}' cannot start; missing:\n{lines}\n"
            f"See what it would create, offline and with none of these: uv run invoke plan",
            code=2,
        )
    console = terminal()
    for warning in chosen.warnings:
        console.print(f"warning: {warning}")
    exit_on_failure(select_and_refresh(chosen))

    def keep_data(at: Settings) -> None:
        moved = f"pass --move-disk, which copies the disk to {at.zone}"
        if at.here.same(chosen.here):  # the stack file moved it (gcp:zone, vmName)
            unreachable = (
                f"undo the change to the stack file (or {moved}), `uv run invoke up` to bring the VM back, fetch the "
                "runs, then change it again"
            )
            unsaved = f"fetch them first, {moved}, or undo the change to the stack file"
        else:  # the search's next place: the stack file is as it was, and `up` where the VM was found no chips
            unreachable = f"{moved} (the search tries it again), or run `uv run invoke up` once {chosen.here} has chips"
            unsaved = f"{moved}, or fetch them first (once the VM answers)"
        sources.keep_what_only_the_data_disk_holds(
            sources.of(targets.pick(OnHost(stack=flags.stack).where())),
            chosen.stack,
            "update",
            "the update deletes the data disk, and ",
            unreachable,
            unsaved,
        )

    with one_line_errors():
        try:
            outcome = find_chips(
                chosen,
                yes=flags.yes,
                move=flags.move_disk,
                keep_data=keep_data,
                say=lambda line: console.print(line, soft_wrap=True),
            )
        except KeyboardInterrupt:  # between Pulumi's commands (a preview, the state's protect): none was updating
            raise Exit(
                "error: interrupted (Ctrl-C) between two of Pulumi's commands; no update had started; fix: run "
                "`uv run invoke up` again",
                code=INTERRUPTED,
            ) from None
    if outcome.explanations:
        raise Exit("\n".join(f"what went wrong: {line}" for line in outcome.explanations), code=outcome.code)
    exit_on_failure(outcome.code)


@task(flags=Image)
def image(c, flags: Image, chosen: Settings):
    """Build and push a slice's post-training image (MaxText and its post-training extra), tagged by MaxText version."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.provision import image_build

    with one_line_errors():
        if flags.dry_run:
            print(image_build.dockerfile())
            for command in image_build.commands(chosen, flags.builder, "CONTEXT"):
                print("$ " + " ".join(command))
            return
        pushed = image_build.build(chosen, image_build.choose(flags.builder))
        targets.SliceTarget(chosen).cluster.record_image(pushed)
    print(f"pushed {pushed}; the slice's jobs run it")


@task(flags=Down)
def down(c, flags: Down, where: Where):
    """`pulumi destroy` the stack, refused while a trained model is not yet on this laptop.

    The VM and its disks go; a slice's runs are in its bucket, which the destroy keeps."""
    from tpu_grpo.cloud import search
    from tpu_grpo.cloud.stack import destroy
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    why = "--force: deleting what only the data disk holds was asked for"
    chosen = where.stack_settings()
    with one_line_errors():
        if not flags.force:
            why = "every run it holds is fetched or published"
            sources.keep_what_only_the_data_disk_holds(
                sources.of(targets.pick(where)),
                chosen.stack,
                "destroy",
                "",
                "bring the VM back (`uv run invoke up`) and fetch the runs, or pass --force, which deletes the data "
                "disk and the models on it",
                "fetch them first, or pass --force, which deletes them with the VM's disks",
            )
        console = terminal()
        with search.updating(chosen.stack):  # not while an `up` or a recovery of this laptop updates it
            code = destroy(chosen.stack, why, yes=flags.yes, say=lambda line: console.print(line, soft_wrap=True))
            forgot = None if code else search.forget_place(chosen.stack)
        if forgot:
            console.print(forgot, soft_wrap=True)
    exit_on_failure(code)

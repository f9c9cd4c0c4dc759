"""The stack's tasks: plan, settings, up, image and down."""

from __future__ import annotations

import json

from invoke import Exit

from tpu_grpo.cli.checks import check_down, check_hosts, check_image, check_settings
from tpu_grpo.cli.flags import HOST_FLAGS, checked, exit_on_failure, flag_help, one_line_errors, task
from tpu_grpo.config import keys, stack_file
from tpu_grpo.config.errors import INTERRUPTED, UserError
from tpu_grpo.config.printing import terminal
from tpu_grpo.config.settings import Settings


@task(
    help=flag_help(
        "stack",
        json="print the plan as JSON",
        scripts="show every resource's inputs, the gcloud command, the provisioning steps and the MaxText scripts",
    ),
    check=check_settings,
)
def plan(c, stack=None, json_=False, scripts=False):
    """Show what `pulumi up` would create, what it costs and how a run goes (offline).

    One screen; --scripts adds every input and script. Exits 2 while a setting is still to set."""
    from tpu_grpo.cli.plan import build, render

    with one_line_errors():
        result = build(stack)
    if json_:
        print(json.dumps(result.to_json(), indent=2))
    else:
        render(result, terminal(), scripts=scripts)
    if result.pending:
        raise Exit(code=UserError.exit_code)


@task(help=flag_help("stack", json="print the settings as JSON"), check=check_settings)
def settings(c, stack=None, json_=False):
    """List every stack setting with its value and meaning, after validating them all."""
    chosen = checked(check_settings)
    with one_line_errors():
        values = stack_file.read_stack_file(chosen.stack, stack_file.project_root())
    if json_:  # each key: what it comes to, and whence when the stack file does not set it (null: it does)

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


@task(
    help=flag_help(
        "stack",
        yes="go ahead without Pulumi's preview and question (for scripts)",
        move_disk="when chips are found in another zone, move the data disk there (a snapshot, then a disk made "
        "from it) instead of making it anew",
    ),
    check=check_settings,
)
def up(c, stack=None, yes=False, move_disk=False):
    """Create or update the TPU VM (or a slice's cluster) with `pulumi up`, after checking everything it needs.

    With tpu-grpo:fallback, the next place is tried when Google has no chips (docs/capacity.md). Refused while a
    change would delete the data disk (a new gcp:zone or vmName) with runs not yet fetched."""
    from tpu_grpo.cloud.search import find_chips
    from tpu_grpo.cloud.stack import missing_for_up, select_and_refresh
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    chosen = checked(check_settings)
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
            sources.of(targets.pick(check_hosts(stack=stack))),
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
                yes=yes,
                move=move_disk,
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


@task(
    check=check_image,
    help=flag_help(
        "stack",
        builder="docker (a local Docker), cloud-build (gcloud builds submit) or auto (default: Docker when "
        "its daemon answers, else Cloud Build)",
        dry_run="print the Dockerfile and the commands, and exit",
    ),
)
def image(c, stack=None, builder="auto", dry_run=False):
    """Build and push a slice's post-training image (MaxText and its post-training extra), tagged by MaxText version."""
    from tpu_grpo.jobs import targets
    from tpu_grpo.provision import image_build

    with one_line_errors():
        chosen = checked(check_image)
        if dry_run:
            print(image_build.dockerfile())
            for command in image_build.commands(chosen, builder, "CONTEXT"):
                print("$ " + " ".join(command))
            return
        pushed = image_build.build(chosen, image_build.choose(builder))
        targets.SliceTarget(chosen).cluster.record_image(pushed)
    print(f"pushed {pushed}; the slice's jobs run it")


@task(
    iterable=["host"],
    check=check_down,
    help=flag_help(
        *HOST_FLAGS,
        force="destroy even if a trained model exists only on the VM: the data disk goes with it",
        yes="go ahead without Pulumi's preview and question (for scripts)",
    ),
)
def down(c, force=False, stack=None, host=None, identity=None, wait=None, yes=False):
    """`pulumi destroy` the stack, refused while a trained model is not yet on this laptop.

    The VM and its disks go; a slice's runs are in its bucket, which the destroy keeps."""
    from tpu_grpo.cloud import search
    from tpu_grpo.cloud.stack import destroy
    from tpu_grpo.jobs import targets
    from tpu_grpo.results import sources

    why = "--force: deleting what only the data disk holds was asked for"
    with one_line_errors():
        where = checked(check_down)
        if not force:
            why = "every run it holds is fetched or published"
            sources.keep_what_only_the_data_disk_holds(
                sources.of(targets.pick(where)),
                where.settings.stack,
                "destroy",
                "",
                "bring the VM back (`uv run invoke up`) and fetch the runs, or pass --force, which deletes the data "
                "disk and the models on it",
                "fetch them first, or pass --force, which deletes them with the VM's disks",
            )
        chosen = where.settings
        console = terminal()
        with search.updating(chosen.stack):  # not while an `up` or a recovery of this laptop updates it
            code = destroy(chosen.stack, why, yes=yes, say=lambda line: console.print(line, soft_wrap=True))
            forgot = None if code else search.forget_place(chosen.stack)
        if forgot:
            console.print(forgot, soft_wrap=True)
    exit_on_failure(code)

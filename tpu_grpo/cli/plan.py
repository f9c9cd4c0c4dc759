"""`invoke plan`: what `pulumi up` would create, worked out offline.

Runs the real Pulumi program in-process under mocks (no cloud account, no Pulumi CLI, no
network) and shows each resource with its inputs, the equivalent gcloud command, the
settings still to fill in, and what the machine costs per hour.
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tpu_grpo.catalog.accelerators import MACHINES, SLICES
from tpu_grpo.catalog.capacity import (
    CPU_HOST_USD_PER_HOUR,
    GKE_CLUSTER_USD_PER_HOUR,
    HYPERDISK_PRICE_SOURCE,
    PRICES_READ,
    SNAPSHOT_USD_PER_GB_MONTH,
)
from tpu_grpo.catalog.models import DEFAULT_MODEL
from tpu_grpo.config import costs, keys, stack_file
from tpu_grpo.config.printing import styled
from tpu_grpo.config.settings import Settings
from tpu_grpo.jobs.maxtext import Run

#: The tutorial's timing (its model, on a v6e-8, 50 batches): conversion about 5 minutes, training about 10. The only
#: durations measured: `plan` gives them only for that model on that machine.
TUTORIAL_MINUTES = {"conversion": 5, "training": 10}
TUTORIAL_BATCHES = 50
TUTORIAL_MACHINE = MACHINES[str(keys.KEY[f"{keys.PROJECT}:machineType"].default)].accelerator_type
HIDDEN_INPUTS = {"project", "name"}


@dataclass
class Cost:
    slice: str
    machine_type: str
    capacity: str
    zone: str
    chips: int
    usd_per_chip_hour: float
    usd_per_hour: float
    #: What the conversion downloads from the Hub: {"model": the Hub id, "gb": its size, "what": which files}.
    download: dict[str, Any]
    price_source: str
    quota: str
    note: str
    disks: list[dict[str, Any]]
    disks_usd_per_hour: float
    disks_price_source: str
    #: The chips and the disks together, while the VM runs.
    usd_per_hour_total: float


@dataclass
class Plan:
    stack: str
    #: What still blocks `pulumi up`: {key, problem, fix} each (plan exits 2 while there is any).
    pending: list[dict[str, str]]
    warnings: list[str]
    replaces: list[str]
    kept: list[str]
    access: list[str]
    resources: list[dict[str, Any]]
    outputs: dict[str, Any]
    gcloud: list[str]
    cost: Cost
    places: list[dict[str, Any]]
    provision: list[dict[str, Any]]
    jobs: list[dict[str, str]]
    compile_cache: str
    evaluation: dict[str, int]
    batches: int
    #: A run of the stack's batches, phase by phase: {phase, minutes (None: not measured), what}.
    estimate: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build(stack: str | None = None) -> Plan:
    """Run the program offline on the stack file; placeholders become `pending`, not errors."""
    from infra import offline
    from infra.common import access_to_grant
    from infra.tpu_host import gcloud_create_command
    from infra.tpu_slice import gcloud_node_pool_command
    from tpu_grpo.cloud.stack import describe, kept, preview, state_resources, stays

    root = stack_file.project_root()
    stack = stack_file.chosen_stack(stack, root)
    raw = stack_file.read_stack_file(stack, root)
    settings, resources, outputs = offline.run(raw, stack, lenient=True)
    machine, obtained, multi_host = settings.machine, settings.obtained, bool(settings.tpu_slice)
    paid_disks = costs.disks(settings)
    disks_usd_per_hour = sum(disk["usd_per_hour"] for disk in paid_disks)
    state = state_resources(stack)  # [] with no CLI or nothing made yet
    return Plan(
        stack=stack,
        pending=[error.to_json() for error in settings.pending],
        warnings=[*settings.warnings, *stays(state, resources)],
        replaces=[describe(change) for change in preview(settings, resources, state)],
        kept=kept(resources),
        access=access_to_grant(settings),
        resources=[
            asdict(r)
            for r in sorted(resources, key=lambda r: (r.type, r.name))  # the engine's order varies
            if not r.type.startswith(keys.PROJECT)
        ],
        outputs=outputs,
        gcloud=gcloud_node_pool_command(settings) if multi_host else gcloud_create_command(settings),
        cost=Cost(
            slice=settings.slice if settings.tpu_slice else settings.machine.accelerator_type,
            machine_type=machine.machine_type,
            capacity=settings.capacity,
            zone=settings.zone,
            chips=settings.chips,
            usd_per_chip_hour=obtained.usd_per_chip_hour,
            usd_per_hour=settings.usd_per_hour,
            download=download(settings),
            price_source=f"{obtained.price_source} (read {PRICES_READ})",
            quota=obtained.quota,
            note=cost_note(settings),
            disks=paid_disks,
            disks_usd_per_hour=round(disks_usd_per_hour, 3),
            disks_price_source=HYPERDISK_PRICE_SOURCE,
            usd_per_hour_total=round(settings.usd_per_hour + disks_usd_per_hour, 2),
        ),
        places=places(settings, raw, root),
        provision=[] if multi_host else provision_steps(settings),  # a slice's jobs run in its image
        jobs=[] if multi_host else job_scripts(settings),
        compile_cache=compile_cache_note(settings),
        evaluation=Run.of(settings.training).evaluation_load(),
        batches=settings.batches,
        estimate=estimate(settings),
    )


def estimate(settings: Settings) -> list[dict[str, Any]]:
    """A run of the stack's batches for its own model and machine, phase by phase: the tutorial's minutes where it
    measured them (its model, on its machine, 50 batches), and what each phase does where nothing was measured."""
    measured = (
        settings.model == DEFAULT_MODEL
        and not settings.tpu_slice
        and settings.machine.accelerator_type == TUTORIAL_MACHINE
        and settings.batches == TUTORIAL_BATCHES
    )
    where = "not measured for this model and machine"
    idle = settings.idle_stop_minutes
    row = settings.model_row
    phases = [
        (
            "provisioning",
            None,
            "apt, uv, Python 3.12, MaxText 0.2.3 and its dependencies, once per new VM; not measured",
        )
        if not settings.tpu_slice
        else ("provisioning", None, "none: a slice's jobs run in MaxText's image"),
        ("the download", None, f"{row.hf_id}, about {download(settings)['gb']:g} GB from the Hub; not measured"),
        ("compiling", None, "a first training of these settings compiles first (a cold start), later ones start warm"),
        *(
            (phase, TUTORIAL_MINUTES[phase] if measured else None, "the tutorial's" if measured else where)
            for phase in TUTORIAL_MINUTES
        ),
        ("export", None, f"the best checkpoint to Hugging Face format; {where}"),
        ("the idle stop", None, f"none on a slice: billed while {settings.obtained.slice_billing}")
        if settings.tpu_slice
        else (
            "the idle stop",
            idle or None,
            f"the VM runs {idle} idle minutes after the last job, then stops itself"
            if idle
            else "none: the VM runs until `invoke down` (tpu-grpo:idleStopMinutes 0)",
        ),
    ]
    return [{"phase": phase, "minutes": minutes, "what": what} for phase, minutes, what in phases]


def download(settings: Settings) -> dict[str, Any]:
    """What is downloaded from the Hub: on one VM `invoke provision` fetches the bf16 safetensors, which the conversion
    reads; a slice's conversion downloads the model itself (an eager one, the whole repository where it also holds
    the original checkpoint)."""
    row = settings.model_row
    gb = row.conversion_download_gb(settings.lazy_conversion) if settings.tpu_slice else row.weights_gb
    what = "bf16 safetensors" if gb == row.weights_gb else "the whole repository, which an eager conversion downloads"
    return {"model": row.hf_id, "gb": round(gb, 1), "what": what}


def places(chosen: Settings, raw: dict, root) -> list[dict[str, Any]]:
    """The stack's places to get chips, in the order `invoke up` tries them (tpu_grpo/cloud/search.py), each with
    its price, the quota or reservation it draws on, and what moving the data disk there costs."""
    from tpu_grpo.cloud.search import order
    from tpu_grpo.config.settings import every_place

    every = every_place(raw, chosen.stack, root, lenient=True)  # parsed once
    found = []
    for place in order(chosen.candidates, chosen.zone):
        at = every[place.zone, str(place.capacity)]
        moves = not chosen.tpu_slice and place.zone != chosen.zone
        found.append(
            {
                "zone": place.zone,
                "capacity": place.capacity,
                "usd_per_hour": at.usd_per_hour,
                "draws_on": f"reservation {at.reservation}" if at.reservation else at.obtained.quota_in(place.region),
                "here": place.same(chosen.here),
                # the chosen place's is the plan's own warning, said once
                "warning": at.warnings[0] if at.warnings and not place.same(chosen.here) else None,
                "move_snapshot_usd_per_month": round(chosen.data_disk_gb * SNAPSHOT_USD_PER_GB_MONTH, 2)
                if moves
                else None,
            }
        )
    return found


def compile_cache_note(settings) -> str:
    """Where the training's compiled programs are kept, and which starts will be warm."""
    from tpu_grpo.jobs import maxtext, pipeline, slice_jobs

    run = pipeline.build_run(settings)
    at = slice_jobs.placement(settings) if settings.tpu_slice else maxtext.VM
    where = "the store's bucket" if at.pod else "the data disk"
    named = maxtext.compile_cache_name(run, "train", at.slice_shape)
    folder = f"{at.compile_cache_root(run)}/MAXTEXT_JAX_LIBTPU_VERSIONS/{named}"
    return (
        f"compile cache: {folder}, on {where}. The first training of these settings compiles (a cold start); "
        "the next ones, a resumed run, a recovery and a VM created anew start warm, until a --set that changes "
        "what is compiled or another MaxText, JAX or libtpu; `invoke status` says which the next start is"
    )


def cost_note(settings) -> str:
    """When the chips cost money, for this capacity."""
    if settings.tpu_slice:
        return (
            f"Billed while {settings.obtained.slice_billing}; the price includes the CPU host "
            f"(${CPU_HOST_USD_PER_HOUR:.2f}/h) and GKE's cluster fee (${GKE_CLUSTER_USD_PER_HOUR:.2f}/h)."
        )
    obtained = settings.obtained
    if obtained.billed_when_stopped:
        when = (
            "A reservation-bound VM is billed through its reservation: the reserved chips cost the same "
            "whether or not the VM runs, until the reservation ends"
        )
    else:
        when = "Billed while the VM runs, training or not"
    idle = (
        f"it powers itself off after {settings.idle_stop_minutes} minutes without a job or a terminal (SSH "
        "login) session (tpu-grpo:idleStopMinutes)"
        if settings.idle_stop_minutes
        else "it never powers itself off (tpu-grpo:idleStopMinutes is 0)"
    )
    waits = f" {obtained.waits}" if obtained.waits else ""
    alone = (
        " A training alone (`invoke train`) is refused: the stop would empty /dev/shm, its checkpoints with it; "
        "`invoke pipeline` saves the model on the data disk before the VM can stop."
        if settings.idle_stop_minutes and settings.store.name == "shm"
        else ""
    )
    return f"{when}. {idle[0].upper()}{idle[1:]}. After a stop, {obtained.after_stop}.{waits}{alone}"


def job_scripts(settings: Settings) -> list[dict[str, str]]:
    """The remote script of each MaxText step with the stack's settings (run name: the start time)."""
    from tpu_grpo.jobs import maxtext, pipeline

    run = pipeline.build_run(settings).named(maxtext.timestamp_run_name())
    return [{"step": step, "script": maxtext.script(run, step)} for step in maxtext.STEPS]


def provision_steps(settings) -> list[dict[str, Any]]:
    """The playbook's steps with its default variables and the stack's: what `invoke provision` checks,
    and what it may run."""
    from tpu_grpo.provision import engine, playbook

    book = playbook.load()
    values = playbook.resolve(book, stack=playbook.stack_values(settings))
    here = {source for source, value in engine.local_secrets(book).items() if value is not None}
    row = settings.model_row

    def command(step: playbook.Step) -> str:
        if step.run:
            return playbook.render(step.run, values).strip()
        assert step.secret, "a step without run is a secret's copy"
        if step.secret["source"] in here:
            return f"copy {step.secret['source']} to ~/{step.secret['dest']} (mode 600, over SFTP)"
        needed = f"{row.hf_id} is gated: export HF_TOKEN=hf_... first" if row.gated else f"{row.hf_id} is public"
        return f"none: this laptop has no {step.secret['source']} ({needed})"

    return [
        {
            "step": step.name,
            "runs": playbook.applies(step, values) and (not step.secret or step.secret["source"] in here),
            "when": list(step.when),
            "as": "root" if step.become else "ssh user",
            "tags": list(step.tags),
            "command": command(step),
        }
        for step in book.steps
    ]


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [pair for key, item in value.items() for pair in _flatten(item, f"{prefix}{key}.")]
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        return [pair for i, item in enumerate(value) for pair in _flatten(item, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), value)]


def _short(value: Any, width: int = 72) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # the engine hands numbers over as floats
    text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def render_places(plan: Plan, console: Console) -> None:
    table = Table(
        title="Places to get chips, in the order `invoke up` tries them (tpu-grpo:fallback)", title_justify="left"
    )
    for column in ("", "place", "per hour", "draws on", "the data disk there"):
        table.add_column(column)
    for number, place in enumerate(plan.places, 1):
        snapshot = place["move_snapshot_usd_per_month"]
        disk = (
            "is there"
            if snapshot is None
            else f"made anew, or moved (--move-disk): a snapshot, ≤ ${snapshot:,.2f} per month while kept"
        )
        table.add_row(
            f"{number}{' (now)' if place['here'] else ''}",
            f"{place['capacity']} in {place['zone']}",
            f"${place['usd_per_hour']:.2f}",
            place["draws_on"],
            disk + (f"\nwarning: {place['warning']}" if place["warning"] else ""),
        )
    console.print(table)
    console.print(
        styled(
            "[dim]snapshot's price: ${} per GB-month, the size of the data disk at most[/]", SNAPSHOT_USD_PER_GB_MONTH
        )
    )


def evaluation_text(load: dict[str, int]) -> str:
    """What the run's evaluations generate beside its training, and what trades it."""
    share = load["eval_answers"] / (load["eval_answers"] + load["train_answers"])
    return (
        f"evaluation: {load['passes']} passes over the {load['choosing_examples']} examples that choose the checkpoint "
        f"and {load['report_examples']} that score it: {load['eval_answers']} greedy answers beside the training's "
        f"{load['train_answers']} sampled ones, {share:.0%} of what the run generates; fewer with "
        f"{keys.PROJECT}:testBatches, reportBatches, a longer checkpointPeriod or a smaller --set "
        "train:eval_batch_size (docs/training.md, Two sets)"
    )


def pending_panel(plan: Plan) -> Panel:
    return Panel(
        Text("\n").join(
            styled("[red]✗[/] {}: {}; fix: {}", item["key"], item["problem"], item["fix"]) for item in plan.pending
        ),
        title=f"Still to set before `pulumi up` ({len(plan.pending)})",
        border_style="red",
    )


def cost_line(cost: Cost) -> Text:
    """The hour of the stack, chips and disks together."""
    extra = " (CPU host and GKE fee included)" if cost.slice in SLICES else ""
    return styled(
        "per hour: {} v6e {} × ${} = ${}{}, + disks ${} = [bold]${} an hour[/] while it runs (the disks' ${} also "
        "while it does not, until `invoke down`)",
        cost.chips,
        "chip" if cost.chips == 1 else "chips",
        f"{cost.usd_per_chip_hour:.2f}",
        f"{cost.usd_per_hour:.2f}",
        extra,
        f"{cost.disks_usd_per_hour:.3f}",
        f"{cost.usd_per_hour_total:.2f}",
        f"{cost.disks_usd_per_hour:.3f}",
    )


def render(plan: Plan, console: Console, scripts: bool = False) -> None:
    """One screen: what is still to set, what `up` creates, the hour's cost, a run phase by phase, the next command.
    With `scripts`, every resource's inputs, the gcloud command, the provisioning steps and the MaxText scripts."""
    console.print(styled("[bold]Plan for stack [cyan]{}[/] (offline: nothing is created)[/]", plan.stack))
    if plan.replaces:  # infra/replacements.py's copy of the provider's rules, offline
        console.print("an estimate from the provider's rules; `invoke up` decides on Pulumi's own preview:")
    for line in plan.replaces:
        console.print(styled("[bold red]replaces:[/] {}", line))
    for line in plan.warnings:
        console.print(styled("[bold yellow]warning:[/] {}", line))
    for line in plan.kept:
        console.print(styled("[bold]kept by `invoke down`:[/] {}", line))
    for line in plan.access:
        console.print(styled("[bold yellow]access to grant:[/] {}", line))
    if plan.pending:
        console.print(pending_panel(plan))
    cost = plan.cost
    if scripts:
        render_scripts(plan, console)
    else:
        names = ", ".join(f"{r['type'].split(':')[-1]} {r['name']}" for r in plan.resources)
        console.print(Text(f"`pulumi up` creates {len(plan.resources)} resources: {names}"))
    what = f"{cost.slice} ({cost.machine_type} hosts)" if cost.slice in SLICES else cost.machine_type
    console.print(styled("[bold]{}[/], capacity {}, in {}", what, cost.capacity, cost.zone))
    console.print(cost_line(cost))
    console.print(Text(cost.note))
    if len(plan.places) > 1:
        render_places(plan, console)
    console.print(styled("[bold]A run of {} batches, phase by phase[/] (tpu-grpo:batches)", plan.batches))
    for item in plan.estimate:
        minutes = item["minutes"]
        said = f"≈ {minutes} min, ≈ ${cost.usd_per_hour_total * minutes / 60:.2f}: " if minutes else ""
        console.print(Text(f"  {item['phase']}: {said}{item['what']}"))
    if not plan.pending:  # else the task's refusal says what is still to set, last
        console.print(styled("next: [bold]uv run invoke up[/] (then provision, pipeline and fetch: the README)"))
    if not scripts:
        console.print(
            styled(
                "[dim]every input, the gcloud command, the provisioning steps and the MaxText scripts: "
                "uv run invoke plan --scripts[/]"
            )
        )


def render_scripts(plan: Plan, console: Console) -> None:
    """What `pulumi up`, `provision` and `pipeline` would do, in full."""
    from infra.tpu_host import render_command

    cost = plan.cost
    table = Table(
        title=f"`pulumi up` would create {len(plan.resources)} resources", show_lines=True, title_justify="left"
    )
    table.add_column("resource", style="cyan", no_wrap=True)
    table.add_column("inputs")
    for resource in plan.resources:
        kind = resource["type"].split(":")[-1]
        inputs = [
            f"{k} = {_short(v)}"
            for k, v in sorted(_flatten(resource["inputs"]))
            if k.split(".")[0] not in HIDDEN_INPUTS
        ]
        table.add_row(f"{kind}\n{resource['name']}", "\n".join(inputs))
    console.print(table)
    outputs = Table(title="Stack outputs", title_justify="left", show_header=False)
    for name, value in plan.outputs.items():
        outputs.add_row(name, str(value))
    console.print(outputs)
    multi_host = cost.slice in SLICES
    console.rule("The same TPU node pool with gcloud" if multi_host else "The same VM with gcloud", align="left")
    console.print(Text(render_command(plan.gcloud)), soft_wrap=True)
    if plan.provision:
        console.rule("`invoke provision`: playbooks/host.yml with its default variables", align="left")
        console.print("Every step's check runs first, all in one round trip; a step runs only where its check fails.")
    for number, step in enumerate(plan.provision, 1):
        if not step["runs"]:
            why = f"when: {', '.join(step['when'])}" if step["when"] else step["command"]
            console.print(styled("[dim]{}. {}: skipped ({})[/]", f"{number:2}", step["step"], why))
            continue
        console.print(styled("[bold]{}. {}[/] [dim](as {})[/]", f"{number:2}", step["step"], step["as"]))
        console.print(Text(textwrap.indent(step["command"], "      ")), soft_wrap=True)
    if plan.jobs:
        console.rule("`invoke pipeline`: the MaxText steps, each a detached job on the VM", align="left")
    for job in plan.jobs:
        console.print(Text(job["script"]), soft_wrap=True)
    console.print(Text(plan.compile_cache))
    for line in (
        f"the model's download: {cost.download['model']}, about {cost.download['gb']:g} GB ({cost.download['what']})",
        "disks: "
        + ", ".join(
            f"{disk['disk']} {disk['gb']} GB"
            + (
                f" ({disk['performance']}: ${disk['performance_usd_per_hour']:.3f} per hour of it)"
                if disk["performance_usd_per_hour"]
                else ""
            )
            for disk in cost.disks
        ),
        evaluation_text(plan.evaluation),
        f"quota: {cost.quota}",
        f"price: {cost.price_source}",
        f"disks' price: {cost.disks_price_source}",
    ):
        console.print(Text(line))

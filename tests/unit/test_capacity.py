"""`tpu-grpo:capacity`: each way of getting the chips, argument by argument under Pulumi's mocks,
flag by flag as gcloud, with its price; and a later `pulumi up` that never replaces the VM for a
newer image, but says so when a setting does."""

from __future__ import annotations

import json

import pulumi
import pytest

from infra import offline
from infra.tpu_host import TpuHost, gcloud_create_command
from tests.doubles.pulumi_cli import PulumiCli
from tests.support import FLEX, ON_DEMAND, SPOT, invoke
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.config.errors import SettingsError

SHARED = {"tpu-grpo:reservation": "projects/owner-project/reservations/v6e-shared"}


def instance(stack_values, **changes):
    values = {key: value for key, value in {**stack_values, **changes}.items() if value is not None}
    settings, resources, outputs = offline.run(values, "dev")
    [vm] = [r.inputs for r in resources if r.type == "gcp:compute/instance:Instance"]
    return settings, vm, outputs


@pytest.mark.parametrize(
    "changes, scheduling, affinity",
    [
        (
            {},
            {
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
                "provisioningModel": "RESERVATION_BOUND",
            },
            {
                "type": "SPECIFIC_RESERVATION",
                "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["v6e-8-calendar"]},
            },
        ),
        (
            SHARED,
            {
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
                "provisioningModel": "RESERVATION_BOUND",
            },
            {
                "type": "SPECIFIC_RESERVATION",
                "specificReservation": {
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["projects/owner-project/reservations/v6e-shared"],
                },
            },
        ),
        (
            SPOT,
            {
                "preemptible": True,
                "automaticRestart": False,
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
                "provisioningModel": "SPOT",
            },
            None,
        ),
        (
            FLEX,
            {
                "automaticRestart": False,
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
                "provisioningModel": "FLEX_START",
                "maxRunDuration": {"seconds": 86400},
            },
            {"type": "NO_RESERVATION"},
        ),
        (ON_DEMAND, {"onHostMaintenance": "TERMINATE", "provisioningModel": "STANDARD"}, None),
    ],
    ids=["reservation", "shared-reservation", "spot", "flex-start", "on-demand"],
)
def test_each_capacity_sends_its_scheduling_and_affinity(stack_values, changes, scheduling, affinity):
    _, vm, outputs = instance(stack_values, **changes)
    assert vm["scheduling"] == scheduling
    assert vm.get("reservationAffinity") == affinity
    assert "desiredStatus" not in vm and "allowStoppingForUpdate" not in vm  # a TPU VM is never started again
    assert outputs["capacity"] == (changes.get("tpu-grpo:capacity") or "reservation")


@pytest.mark.parametrize(
    "changes, flags",
    [
        (
            {},
            [
                "--maintenance-policy=TERMINATE",
                "--instance-termination-action=DELETE",
                "--provisioning-model=RESERVATION_BOUND",
                "--reservation-affinity=specific",
                "--reservation=v6e-8-calendar",
            ],
        ),
        (
            SHARED,
            [
                "--maintenance-policy=TERMINATE",
                "--instance-termination-action=DELETE",
                "--provisioning-model=RESERVATION_BOUND",
                "--reservation-affinity=specific",
                "--reservation=projects/owner-project/reservations/v6e-shared",
            ],
        ),
        (
            SPOT,
            [
                "--maintenance-policy=TERMINATE",
                "--instance-termination-action=DELETE",
                "--provisioning-model=SPOT",
                "--no-restart-on-failure",
            ],
        ),
        (
            FLEX,
            [
                "--maintenance-policy=TERMINATE",
                "--instance-termination-action=DELETE",
                "--provisioning-model=FLEX_START",
                "--no-restart-on-failure",
                "--max-run-duration=24h",
                "--reservation-affinity=none",
            ],
        ),
        (ON_DEMAND, ["--maintenance-policy=TERMINATE", "--provisioning-model=STANDARD"]),
    ],
    ids=["reservation", "shared-reservation", "spot", "flex-start", "on-demand"],
)
def test_each_capacity_has_its_gcloud_flags(stack_values, changes, flags):
    settings, _, _ = instance(stack_values, **changes)
    command = gcloud_create_command(settings)
    start = command.index("--boot-disk-size=200GB") + 1
    assert command[start : start + len(flags)] == flags
    assert command[start + len(flags)] == "--boot-disk-type=hyperdisk-balanced"


@pytest.mark.parametrize(
    "changes, key, problem",
    [
        ({"tpu-grpo:capacity": "preemptible"}, "tpu-grpo:capacity", "is not a capacity (reservation, spot, "),
        ({"tpu-grpo:capacity": "spot"}, "tpu-grpo:reservation", "is set, but capacity spot uses no reservation"),
        ({"tpu-grpo:reservation": None}, "tpu-grpo:reservation", "is not set, and capacity reservation needs it"),
        ({**FLEX, "tpu-grpo:maxRunHours": None}, "tpu-grpo:maxRunHours", "is not set, and a flex-start VM needs"),
        ({**FLEX, "tpu-grpo:maxRunHours": "0"}, "tpu-grpo:maxRunHours", "from 1 to 168 hours"),
        ({**FLEX, "tpu-grpo:maxRunHours": "169"}, "tpu-grpo:maxRunHours", "from 1 to 168 hours"),
        ({**SPOT, "tpu-grpo:maxRunHours": "24"}, "tpu-grpo:maxRunHours", "only flex-start VMs have a maximum run"),
        ({"tpu-grpo:maxRunHours": "24"}, "tpu-grpo:maxRunHours", "only flex-start VMs have a maximum run"),
        ({"tpu-grpo:idleStopMinutes": "-1"}, "tpu-grpo:idleStopMinutes", "from 0 to 10080 minutes; 0: never"),
        (
            {"tpu-grpo:reservation": "projects/owner-project/reservations/"},
            "tpu-grpo:reservation",
            "is not a reservation name",
        ),
    ],
)
def test_a_wrong_capacity_setting_is_one_line_before_anything_is_declared(stack_values, changes, key, problem):
    values = {k: v for k, v in {**stack_values, **changes}.items() if v is not None}
    mocks = offline.RecordingMocks()
    with pytest.raises(SettingsError) as raised:
        offline.run(values, "dev", mocks=mocks)
    assert mocks.resources == [] and raised.value.key == key
    assert problem in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "changes, minutes",
    [
        ({}, 0),
        (SPOT, 60),
        (FLEX, 60),
        (ON_DEMAND, 60),
        ({**SPOT, "tpu-grpo:idleStopMinutes": "15"}, 15),
        ({**SPOT, "tpu-grpo:idleStopMinutes": "0"}, 0),
        ({**FLEX, "tpu-grpo:idleStopMinutes": "0"}, 0),
        ({**ON_DEMAND, "tpu-grpo:idleStopMinutes": "0"}, 0),
    ],
)
def test_idle_stop_defaults_follow_the_capacity(stack_values, changes, minutes):
    """0 means never, on every capacity: the provisioning removes the timer rather than installing one."""
    from tpu_grpo.provision import playbook

    settings, _, _ = instance(stack_values, **changes)
    assert settings.idle_stop_minutes == minutes
    book = playbook.load()
    values = playbook.resolve(book, stack=playbook.stack_values(settings))
    applied = {step.name for step in book.steps if playbook.applies(step, values)}
    assert ("idle stop" in applied, "no idle stop" in applied) == (minutes > 0, minutes == 0)


@pytest.mark.parametrize("hours", ["1", "168"])
def test_flex_start_takes_one_hour_to_seven_days(stack_values, hours):
    _, vm, _ = instance(stack_values, **{**FLEX, "tpu-grpo:maxRunHours": hours})
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": int(hours) * 3600}


def test_a_newer_image_never_replaces_the_vm(stack_values):
    """The boot image is ignored after creation (the provider would otherwise replace the VM for every
    new image of the family); the image the VM booted is a stack output."""
    options = {}

    def record(args: pulumi.ResourceTransformationArgs):
        options[args.type_] = args.opts

    pulumi.runtime.set_mocks(offline.RecordingMocks(), project="tpu-grpo", stack="dev", preview=False)
    pulumi.runtime.set_all_config(offline.config_for_pulumi(stack_values))

    @pulumi.runtime.test
    def program():
        from infra.program import read_settings

        TpuHost(read_settings(configured=stack_values), pulumi.ResourceOptions(transformations=[record]))

    program()
    assert options["gcp:compute/instance:Instance"].ignore_changes == ["bootDisk.initializeParams.image"]
    # the data disk keeps every change but the snapshot it was made from, which only a move declares
    assert options["gcp:compute/disk:Disk"].ignore_changes == ["snapshot"]
    # No allow_stopping_for_update: what the provider changes only on a stopped VM (terraform-provider-google:
    # machine_type, service_account, scheduling, the network) replaces the VM instead.
    assert options["gcp:compute/instance:Instance"].replace_on_changes == [
        "machineType",
        "serviceAccount",
        "scheduling",
        "networkInterfaces[*].network",
        "networkInterfaces[*].subnetwork",
    ]


@pytest.mark.parametrize(
    "capacity, changes, per_hour",
    [
        ("reservation", {}, "= $21.60,"),
        ("spot", SPOT, "= $8.64,"),
        ("flex-start", FLEX, "= $10.80,"),
        ("on-demand", ON_DEMAND, "= $21.60,"),
    ],
)
def test_plan_shows_each_capacity_its_gcloud_and_price(stack_dir, stack_values, capacity, changes, per_hour):
    import yaml

    values = {k: v for k, v in {**stack_values, **changes}.items() if v is not None}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    text = invoke("plan", cwd=stack_dir)
    assert text.returncode == 0, text.stderr
    assert (
        f"ct6e-standard-8t, capacity {capacity}, in us-east5-b\nper hour: 8 v6e chips × " in text.stdout
        and per_hour in text.stdout
    )
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    assert plan["cost"]["capacity"] == capacity
    assert plan["cost"]["usd_per_chip_hour"] == CAPACITIES[capacity].usd_per_chip_hour
    assert "(read 2026-12-04)" in plan["cost"]["price_source"]
    assert f"--provisioning-model={CAPACITIES[capacity].provisioning_model}" in plan["gcloud"]
    scripts = invoke("plan", "--scripts", cwd=stack_dir).stdout
    assert plan["cost"]["quota"] == CAPACITIES[capacity].quota and f"quota: {plan['cost']['quota']}" in scripts
    waits = f" {CAPACITIES[capacity].waits}" if CAPACITIES[capacity].waits else ""
    # on-demand's defaults, /dev/shm and an idle stop, which would take a training no pipeline saved
    alone = (
        " A training alone (`invoke train`) is refused: the stop would empty /dev/shm, its checkpoints with it; "
        "`invoke pipeline` saves the model on the data disk before the VM can stop."
        if capacity == "on-demand"
        else ""
    )
    assert plan["cost"]["note"].endswith(f"After a stop, {CAPACITIES[capacity].after_stop}.{waits}{alone}")
    assert ("waits for capacity up to its valid-for duration (Google: at most two hours" in plan["cost"]["note"]) == (
        capacity == "flex-start"
    )
    stopped = "the reservation is still billed" if capacity == "reservation" else "the chips are no longer billed"
    assert stopped in plan["cost"]["note"] and "creates the VM anew around the same data disk" in plan["cost"]["note"]


def test_spot_and_flex_start_draw_on_the_preemptible_quota_the_others_on_the_on_demand_one():
    assert [name for name, row in CAPACITIES.items() if "preemptible" in row.quota] == ["spot", "flex-start"]
    assert all("preemptible" not in CAPACITIES[name].quota for name in ("reservation", "on-demand"))
    assert all(
        "Compute Engine's" in row.quota and "not the Cloud TPU API's" in row.quota  # Compute Engine, GKE
        for row in CAPACITIES.values()
    )


@pytest.mark.parametrize("zone, warned", [("us-east5-b", True), ("us-east5-a", False), ("asia-northeast1-b", False)])
def test_a_flex_start_stack_outside_its_zones_is_warned_not_refused(stack_dir, stack_values, tmp_path, zone, warned):
    """Google's Flex-start page lists v6e in asia-northeast1-b and us-east5-a (SkyPilot adds us-south1-ai1b): another
    zone gets one line from `settings`, `plan` and `up`, and goes on (the list grows)."""
    with_capacity(stack_dir, stack_values, {**FLEX, "gcp:zone": zone})
    line = (
        f"warning: gcp:zone {zone} is not among the zones known to offer v6e flex-start (asia-northeast1-b, "
        "us-east5-a, us-south1-ai1b"
    )
    cli = PulumiCli(tmp_path / "pulumi", {"capacity": "flex-start", "zone": zone}, "RUNNING")
    env = cli.env()
    for task in (["settings"], ["plan"], ["up", "--yes"]):
        result = invoke(*task, cwd=stack_dir, env=env)
        assert result.returncode == 0, result.stderr
        assert (line in " ".join(result.stdout.split())) == warned, task
    assert [line for line in cli.calls() if line.startswith("up ")]  # warned, not refused
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    assert len(plan["warnings"]) == warned
    with_capacity(stack_dir, stack_values, {**SPOT, "gcp:zone": zone})  # only flex-start has a list of zones
    assert json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["warnings"] == []


# ---------------------------------------------------------------- invoke up against a stand-in Pulumi CLI


def with_capacity(stack_dir, stack_values, changes):
    import yaml

    values = {k: v for k, v in {**stack_values, **changes}.items() if v is not None}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))


CAPACITY_CHANGES = {"reservation": {}, "spot": SPOT, "flex-start": FLEX, "on-demand": ON_DEMAND}


@pytest.mark.parametrize("capacity", list(CAPACITY_CHANGES))
@pytest.mark.parametrize("status, replaced", [("TERMINATED", True), ("STOPPED", True), ("RUNNING", False)])
def test_up_creates_a_stopped_vm_anew_whatever_its_capacity(
    stack_dir, stack_values, tmp_path, capacity, status, replaced
):
    """Compute Engine never starts a stopped TPU VM again (SkyPilot: "TPU VMs cannot be stopped. Delete them
    instead"): `invoke up` replaces it around the same data disk, for every capacity."""
    with_capacity(stack_dir, stack_values, CAPACITY_CHANGES[capacity])
    cli = PulumiCli(
        tmp_path / "pulumi", {"machine_type": "ct6e-standard-8t", "zone": "us-east5-b", "capacity": capacity}, status
    )
    env = cli.env()
    result = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    lines = cli.calls()
    assert "refresh --yes --skip-preview --stack dev" in lines and "stack export --stack dev" in lines
    [up] = [line for line in lines if line.startswith("up ")]
    assert up.startswith("up --stack dev --plan ")
    urn = "urn:pulumi:dev::tpu-grpo::tpu-grpo:index:TpuHost$gcp:compute/instance:Instance::tpu-grpo"
    assert (f"--replace {urn}" in up) == replaced
    assert (
        f"the {capacity} VM is {status} (stopped when idle, or preempted), and a TPU VM is never started again: "
        "creating it anew around the same data disk" in result.stdout
    ) == replaced


def test_plan_and_up_say_when_a_setting_replaces_the_vm(stack_dir, stack_values, tmp_path):
    cli = PulumiCli(
        tmp_path / "pulumi",
        {"machine_type": "ct6e-standard-8t", "zone": "us-east5-b", "capacity": "reservation"},
        "RUNNING",
    )
    cli.deployed(stack_values)
    with_capacity(stack_dir, stack_values, {"tpu-grpo:machineType": "ct6e-standard-4t", "tpu-grpo:model": "qwen3-4b"})
    env = cli.env()
    line = (
        "Instance tpu-grpo (machineType ct6e-standard-8t -> ct6e-standard-4t): a new VM and boot disk "
        "(provisioning again, /dev/shm emptied)"
    )
    up = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert up.returncode == 0 and f"replaces: {line}" in up.stdout
    assert "Disk" not in up.stdout  # the data disk stays
    cli.deployed(stack_values)
    plan = invoke("plan", "--json", cwd=stack_dir, env=env)
    assert json.loads(plan.stdout)["replaces"] == [line]
    unchanged = invoke("plan", "--json", cwd=stack_dir)  # no Pulumi CLI: nothing is known, nothing said
    assert json.loads(unchanged.stdout)["replaces"] == []


def test_up_explains_a_reservation_that_cannot_be_named(tmp_path):
    from tpu_grpo.cloud.stack import explain

    [meaning] = explain(["Error 400: Reservation r is not specificReservationRequired"])
    assert "--require-specific-reservation" in meaning


def test_no_code_branches_on_a_capacitys_name():
    """Every difference between capacities is a field of its row (tpu_grpo/catalog/capacity.py): no comparison with, and
    no table keyed by, a capacity's name anywhere else."""
    import re

    from tests.support import ROOT

    names = "|".join(re.escape(name) for name in CAPACITIES)
    # (`short == "reservation"` and `values["reservation"]` name the setting `tpu-grpo:reservation`, not a capacity)
    branch = re.compile(rf'(?<!short )[=!]=\s*"({names})"|"({names})"\s*:|\bin\s*\(\s*"({names})"')
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*(ROOT / "tpu_grpo").rglob("*.py"), *(ROOT / "infra").glob("*.py"), ROOT / "tasks.py"]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    "extra, disks",
    [
        ({}, [("boot disk", 200), ("data disk", 500)]),
        (
            {**SPOT, "tpu-grpo:dataDiskIops": "4000", "tpu-grpo:dataDiskThroughputMibps": "240"},
            [("boot disk", 200), ("data disk", 500)],
        ),
        (
            {
                "tpu-grpo:slice": "v6e-16",
                "tpu-grpo:usePathways": "true",
                "tpu-grpo:checkpointStore": "gs://grpo-runs/runs",
            },
            [("boot disks of the 4 TPU hosts", 800), ("boot disk of the CPU host", 100)],
        ),
    ],
)
def test_plan_prices_every_disk_beside_the_chips(stack_dir, stack_values, extra, disks):
    """Disks are billed while they exist, VM or not: `plan` shows each with its size and price, and the source: a
    TPU VM's and TPU host's are Hyperdisk Balanced ($0.08 a GiB-month), a slice's CPU host's a balanced persistent
    disk ($0.10 a GB-month), sized by the model (tests/unit/test_slices.py); the data disk's IOPS above 3,000
    ($0.005 an IOPS-month) and throughput above 140 MiB/s ($0.04 a MiB/s-month) are priced on top."""
    with_capacity(stack_dir, stack_values, extra)
    cost = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["cost"]
    assert [(disk["disk"], disk["gb"]) for disk in cost["disks"]] == disks
    price = {name: 0.10 if "CPU host" in name else 0.08 for name, _ in disks}
    iops, throughput = (
        int(extra.get("tpu-grpo:dataDiskIops", 3000)),
        int(extra.get("tpu-grpo:dataDiskThroughputMibps", 140)),
    )
    performance = {"data disk": (iops - 3000) * 0.005 + (throughput - 140) * 0.04}  # $ a month
    per_month = {name: gb * price[name] + performance.get(name, 0) for name, gb in disks}
    assert [disk["usd_per_hour"] for disk in cost["disks"]] == [round(per_month[name] / 730, 4) for name, _ in disks]
    assert cost["disks_usd_per_hour"] == round(sum(per_month.values()) / 730, 3)
    assert (
        "Hyperdisk Balanced $0.08 per GiB-month, $0.005 per provisioned IOPS-month above 3,000"
        in cost["disks_price_source"]
    )
    text = " ".join(invoke("plan", cwd=stack_dir).stdout.split())
    total = round(cost["usd_per_hour"] + sum(disk["usd_per_hour"] for disk in cost["disks"]), 2)
    assert f", + disks ${cost['disks_usd_per_hour']:.3f} = ${total:.2f} an hour while it runs" in text
    scripts = " ".join(invoke("plan", "--scripts", cwd=stack_dir).stdout.split())
    assert (
        f"{iops} IOPS, {throughput} MiB/s provisioned: ${performance['data disk'] / 730:.3f} per hour of it" in scripts
    ) == ("tpu-grpo:dataDiskIops" in extra)


@pytest.mark.parametrize(
    "extra, measured",
    [
        ({}, True),
        (ON_DEMAND, True),
        ({"tpu-grpo:machineType": "ct6e-standard-4t", "tpu-grpo:model": "qwen3-0.6b"}, False),
        ({"tpu-grpo:model": "qwen3-8b"}, False),
    ],
)
def test_plan_prices_a_run_only_by_a_time_measured_on_its_model_and_machine(stack_dir, stack_values, extra, measured):
    """The one duration known is the tutorial's (its 8B on a v6e-8): `plan` prices a run by it there, and elsewhere
    says a run's price per hour instead of multiplying another machine's time by this one's price. It shows what the
    conversion downloads, the model table's size."""
    from tpu_grpo.catalog.models import MODELS

    with_capacity(stack_dir, stack_values, extra)
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    cost = plan["cost"]
    text = " ".join(invoke("plan", cwd=stack_dir).stdout.split())
    scripts = " ".join(invoke("plan", "--scripts", cwd=stack_dir).stdout.split())
    minutes = {item["phase"]: item["minutes"] for item in plan["estimate"]}
    if measured:  # the tutorial's 5 and 10 minutes, at the hour of the chips and the disks
        assert (minutes["conversion"], minutes["training"]) == (5, 10)
        assert f"training: ≈ 10 min, ≈ ${cost['usd_per_hour_total'] / 6:.2f}: the tutorial's" in text
    else:
        assert minutes["conversion"] is minutes["training"] is None
        assert "training: not measured for this model and machine" in text
    assert minutes["provisioning"] is minutes["export"] is None  # never measured
    model = MODELS[extra.get("tpu-grpo:model", "llama3.1-8b-Instruct")]
    assert cost["download"]["model"] == model.hf_id and cost["download"]["gb"] >= round(model.weights_gb, 1)
    assert (
        f"the model's download: {model.hf_id}, about {cost['download']['gb']:g} GB ({cost['download']['what']})"
        in scripts
    )
    # on one VM, provisioning fetches the safetensors the conversion reads
    assert cost["download"] == {"model": model.hf_id, "gb": round(model.weights_gb, 1), "what": "bf16 safetensors"}


def test_plan_prices_a_moves_snapshot_beside_the_disks(stack_dir, stack_values):
    """A disk moved with --move-disk was made from a snapshot the stack keeps (protected) while placed says where it
    came from: plan adds it, at the data disk's size at most, to what the stack pays for while it exists."""
    from tpu_grpo.catalog.capacity import SNAPSHOT_USD_PER_GB_MONTH

    moved = {
        **stack_values,
        "tpu-grpo:fallback": [{"zone": "us-east5-a"}],
        "tpu-grpo:placed": {"zone": "us-east5-a", "capacity": "reservation", "movedFrom": "us-east5-b"},
    }
    with_capacity(stack_dir, moved, {})
    cost = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["cost"]
    [snapshot] = [disk for disk in cost["disks"] if "snapshot" in disk["disk"]]
    assert snapshot["gb"] == 500 and snapshot["usd_per_hour"] == round(500 * SNAPSHOT_USD_PER_GB_MONTH / 730, 4)
    assert cost["disks_usd_per_hour"] == round(sum(disk["usd_per_hour"] for disk in cost["disks"]), 3)

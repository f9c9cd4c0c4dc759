"""How the chips are obtained (`tpu-grpo:capacity`): one row per way, with its Compute Engine
scheduling arguments, the equivalent gcloud flags, its idle-stop and checkpoint-store defaults,
what a stopped VM still costs and its price. The Pulumi program, `invoke plan`, `invoke up` and the
cost line all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpu_grpo.catalog.stores import INCLUDED_IOPS, INCLUDED_THROUGHPUT_MIBPS

#: gcloud's and the API's names for the reservation the VM consumes.
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
#: The range of `tpu-grpo:maxRunHours`: flex-start VMs run for at most 7 days (Cloud TPU
#: documentation, "Request Cloud TPUs using Flex-start": "for a duration of up to 7 days").
MAX_RUN_HOURS = (1, 7 * 24)
#: The date the prices, zones and quotas below were read.
PRICES_READ = "2026-12-04"
#: Where Compute Engine offers v6e flex-start: Google's "Request Cloud TPUs using Flex-start" lists
#: asia-northeast1-b and us-east5-a; SkyPilot's Compute Engine TPU code adds us-south1-ai1b
#: (`_COMPUTE_TPU_FLEX_START_ZONES`, sky/clouds/gcp.py). The list grows: another zone is warned of, not refused.
FLEX_START_ZONES = ("asia-northeast1-b", "us-east5-a", "us-south1-ai1b")
#: Where GKE offers v6e flex-start node pools (a slice): GKE's flex-start page lists asia-northeast1-b, us-east5-a and
#: us-east5-b (GKE 1.33.0-gke.1712000 or later).
GKE_FLEX_START_ZONES = ("asia-northeast1-b", "us-east5-a", "us-east5-b")
#: Which quota a VM or node pool draws on. tpu-grpo makes its TPU VMs through Compute Engine (one VM) and GKE (a
#: slice), which draw on Compute Engine's quota for TPU v6e in the region, not on the Cloud TPU API's (Google's
#: "Cloud TPU consumption options": "If you use TPUs with GKE, you use Compute Engine API quota, a different
#: quota"); the Cloud TPU API's default of 64 preemptible v6e cores does not apply. Spot and flex-start draw on its
#: preemptible TPU quota, on-demand VMs and reservations on the other.
PREEMPTIBLE_QUOTA = (
    "Compute Engine's preemptible TPU v6e quota in gcp:zone's region (IAM & Admin > Quotas, service "
    "compute.googleapis.com; not the Cloud TPU API's)"
)
ON_DEMAND_QUOTA = (
    "Compute Engine's TPU v6e quota in gcp:zone's region (IAM & Admin > Quotas, service "
    "compute.googleapis.com; not the Cloud TPU API's)"
)


@dataclass(frozen=True)
class Capacity:
    name: str
    provisioning_model: str
    #: `scheduling` inputs besides the provisioning model (max_run_duration is added for flex-start).
    scheduling: dict = field(default_factory=dict)
    #: `reservation_affinity.type`, or None for no affinity block.
    affinity: str | None = None
    #: Minutes without a job or a terminal session before the VM powers itself off; 0: never.
    idle_stop_minutes: int = 60
    #: USD per v6e chip-hour, and where the figure comes from.
    usd_per_chip_hour: float = 0.0
    price_source: str = ""
    #: Billed whether or not the VM runs (the reservation's hours are paid anyway).
    billed_when_stopped: bool = False
    #: Where checkpoints go by default (tpu_grpo/catalog/stores.py); a VM that is taken away needs one
    #: that outlives it, and is refused /dev/shm.
    checkpoint_store: str = "shm"
    shm_refused_because: str = ""
    #: The quota a VM or node pool of this capacity draws on.
    quota: str = ON_DEMAND_QUOTA
    #: The zones that offer this capacity for v6e, where such a list exists (else any zone with v6e): for one VM, and
    #: for a slice's GKE node pools.
    zones: tuple[str, ...] = ()
    gke_zones: tuple[str, ...] = ()
    #: Runs at most `tpu-grpo:maxRunHours`, then is deleted (`max_run_duration`), which it then needs.
    run_limited: bool = False
    #: The GKE node_config switch of this capacity (`spot`, `flex_start`), whose gcloud flag is its name in
    #: kebab case; None: no switch.
    gke_switch: str | None = None
    #: A GKE node pool that starts empty: its autoscaler asks for all its hosts when a pod wants them and gives
    #: them back when none does (no idle hours, and a pod may wait a while to be scheduled).
    scales_to_zero: bool = False
    #: What the user sees while the request for the VM waits for capacity, where it may wait; "" where it does not.
    waits: str = ""
    #: How long Compute Engine may keep the request for the VM waiting for capacity, in minutes (0: it does not wait):
    #: the VM's create timeout is the provider's 20 minutes plus this.
    wait_minutes: int = 0
    #: How a VM of this capacity ends or stops besides an idle stop (its scheduling above says so).
    ends: str = "stopped at a host maintenance event"
    #: What Compute Engine's RESOURCE_POOL_EXHAUSTED means for this capacity, and what to do.
    no_capacity: str = (
        "no on-demand v6e capacity in gcp:zone right now: run `invoke up` again later, or use "
        "another zone with v6e (a reservation is what guarantees capacity)"
    )

    def quota_in(self, region: str) -> str:
        """The quota this capacity draws on in `region`, in a few words."""
        return f"{'preemptible ' if self.quota == PREEMPTIBLE_QUOTA else ''}TPU v6e quota of {region}"

    def cost_usd(self, chip_hours: float) -> float:
        """What these chip-hours cost at this capacity's price (its `price_source` says whence)."""
        return round(chip_hours * self.usd_per_chip_hour, 2)

    @property
    def needs_reservation(self) -> bool:
        return self.affinity == "SPECIFIC_RESERVATION"

    def zone_warning(self, zone: str, gke: bool = False, key: str = "gcp:zone") -> str | None:
        """One line when `zone` is not known to offer this capacity (on GKE: for a slice), or None; `key` is where
        the stack says the zone (a fallback entry's is `tpu-grpo:fallback[N].zone`)."""
        zones = self.gke_zones if gke else self.zones
        if not zones or zone in zones:
            return None
        whence = "GKE's flex-start page" if gke else "Google's Flex-start page and SkyPilot"
        command = f"pulumi config set {key} ZONE" if key == "gcp:zone" else f"pulumi config set --path '{key}' ZONE"
        return (
            f"{key} {zone} is not among the zones known to offer v6e {self.name}{' on GKE' if gke else ''} "
            f"({', '.join(zones)}: {whence}, read {PRICES_READ}); `pulumi up` may fail there with no capacity; "
            f"fix: {command}, one of those"
        )

    @property
    def after_stop(self) -> str:
        """What an idle stop (or any stop) means for this capacity. No stopped TPU VM is started again,
        whatever its capacity: SkyPilot refuses to stop Compute Engine TPU VMs ("TPU VMs cannot be stopped.
        Delete them instead", sky/clouds/gcp.py), after Google's "Manage TPUs on Compute Engine"; the next
        `invoke up` creates it anew around the same data disk."""
        billing = (
            "the reservation is still billed, powered off or not"
            if self.billed_when_stopped
            else "the chips are no longer billed (the disks are, until `invoke down`)"
        )
        return (
            f"{billing}; the next `invoke up` creates the VM anew around the same data disk (a stopped TPU VM "
            "is never started again), and `invoke provision` finds the caches, packages and kept conversion "
            "there"
        )

    def unreachable_fix(self, idle_stop_minutes: int) -> str:
        """What to do when the stack's VM does not answer: it may have stopped, and is then brought back, not
        started (`after_stop`); said where a task fails to connect, instead of a generic "is it running?"."""
        idle = (
            f"stopped itself after {idle_stop_minutes} idle minutes (tpu-grpo:idleStopMinutes), or "
            if idle_stop_minutes
            else ""
        )
        return (
            f"if the {self.name} VM {idle}was {self.ends}, `uv run invoke up` creates it anew around the same "
            "data disk, then `uv run invoke provision`"
        )

    def gcloud_flags(self, reservation: str | None, max_run_hours: int | None) -> list[str]:
        """This capacity's `gcloud compute instances create` flags, in the tutorial's order."""
        flags = [f"--maintenance-policy={self.scheduling['on_host_maintenance']}"]
        if "instance_termination_action" in self.scheduling:
            flags.append(f"--instance-termination-action={self.scheduling['instance_termination_action']}")
        flags.append(f"--provisioning-model={self.provisioning_model}")
        if self.scheduling.get("automatic_restart") is False:
            flags.append("--no-restart-on-failure")
        if max_run_hours is not None:
            flags.append(f"--max-run-duration={max_run_hours}h")
        if self.needs_reservation:
            flags += ["--reservation-affinity=specific", f"--reservation={reservation}"]
        elif self.affinity == "NO_RESERVATION":
            flags.append("--reservation-affinity=none")
        return flags

    def node_pool(self, reservation: str | None, max_run_hours: int | None, hosts: int) -> tuple[dict, dict]:
        """This capacity's GKE TPU node pool inputs (pulumi-gcp `container.NodePool`): the pool's own and its
        `node_config`'s, as xpk 1.16.0 asks for them: a pool holds the slice's hosts, or (`scales_to_zero`) starts
        empty, and GKE's autoscaler asks Dynamic Workload Scheduler for all its hosts at once when a pod wants
        them, and gives them back when none does. Queued provisioning is xpk's for GPUs only."""
        node_config: dict = {self.gke_switch: True} if self.gke_switch else {}
        if self.affinity:
            node_config["reservation_affinity"] = {"consume_reservation_type": self.affinity}
        if self.needs_reservation:
            node_config["reservation_affinity"].update(key=RESERVATION_KEY, values=[reservation])
        if max_run_hours is not None:
            node_config["max_run_duration"] = f"{max_run_hours * 3600}s"
        pool: dict = (
            {
                "initial_node_count": 0,
                "management": {"auto_repair": False},
                "autoscaling": {"location_policy": "ANY", "min_node_count": 0, "max_node_count": hosts},
            }
            if self.scales_to_zero
            else {"node_count": hosts}
        )
        return pool, node_config

    def gke_flags(self, reservation: str | None, max_run_hours: int | None, hosts: int) -> list[str]:
        """The same as `gcloud container node-pools create` flags, in xpk's order."""
        flags = [f"--{self.gke_switch.replace('_', '-')}"] if self.gke_switch else []
        if self.scales_to_zero:
            flags += ["--enable-autoscaling", "--location-policy=ANY"]
        if self.needs_reservation:
            flags += ["--reservation-affinity=specific", f"--reservation={reservation}"]
        elif self.affinity == "NO_RESERVATION":
            flags.append("--reservation-affinity=none")
        flags += (
            ["--no-enable-autorepair", f"--max-nodes={hosts}", "--num-nodes=0"]
            if self.scales_to_zero
            else [f"--num-nodes={hosts}"]
        )
        if max_run_hours is not None:
            flags.append(f"--max-run-duration={max_run_hours * 3600}s")
        return flags

    @property
    def slice_billing(self) -> str:
        """When a slice's TPU hosts are billed."""
        return (
            "a flex-start pool has hosts only while a job wants them (GKE's autoscaler gives them back)"
            if self.scales_to_zero
            else "its TPU node pools hold their hosts, training or not, until `invoke down`"
        )

    @property
    def unschedulable_note(self) -> str:
        """What a pod that cannot be scheduled yet means for this capacity, said after the fact."""
        return (
            f" ({self.name}: GKE is asking for the whole slice; this can take a while)" if self.scales_to_zero else ""
        )


#: A multi-host slice's other hourly costs (tpu_grpo/catalog/accelerators.py): its CPU host, an n2-standard-64 on demand
#: (64 vCPU x $0.031611 + 256 GB x $0.004237, Compute Engine's N2 list prices in us-central1), and GKE's
#: cluster management fee ($0.10 per cluster-hour; GKE's free tier credits one zonal cluster).
CPU_HOST_USD_PER_HOUR = 3.11
#: Hyperdisk Balanced, every disk of a TPU VM (v6e takes no other): provisioned capacity at $0.08 a GiB-month, and
#: provisioned performance above what a volume includes (tpu_grpo/catalog/stores.py's INCLUDED_*: Google's "About
#: Hyperdisk Balanced") at $0.005 an IOPS-month and $0.04 a MiB/s-month: the us-central1 list prices of its capacity,
#: IOPS and throughput SKUs as public cost notes quote them. Billed while the disk exists, VM or not.
HYPERDISK_USD_PER_GIB_MONTH = 0.08
HYPERDISK_USD_PER_IOPS_MONTH = 0.005
HYPERDISK_USD_PER_MIBPS_MONTH = 0.04
HYPERDISK_PRICE_SOURCE = (
    f"Hyperdisk Balanced ${HYPERDISK_USD_PER_GIB_MONTH:.2f} per GiB-month, ${HYPERDISK_USD_PER_IOPS_MONTH} per "
    f"provisioned IOPS-month above {INCLUDED_IOPS:,} and ${HYPERDISK_USD_PER_MIBPS_MONTH:.2f} per provisioned "
    f'MiB/s-month above {INCLUDED_THROUGHPUT_MIBPS} (what a volume includes, Google\'s "About Hyperdisk Balanced"), '
    f"us-central1 list prices (as quoted publicly, read {PRICES_READ}); a boot disk has Compute Engine's default "
    "performance, priced as included; a slice's CPU host boots from a balanced persistent disk, $0.10 per GB-month"
)
#: Balanced persistent disk, a slice's CPU host's boot disk (GKE's default node boot disk since 1.24, "Configuring a
#: custom boot disk"): $0.10 a GB-month, the us-central1 list price. Billed while the node exists.
PD_BALANCED_USD_PER_GB_MONTH = 0.10
HOURS_PER_MONTH = 730
#: A standard snapshot (the data disk's, when `invoke up` moves it to another zone): $0.065 per GB-month in a
#: multi-region, where Compute Engine keeps a snapshot by default (the nearest multi-region to its disk), billed for
#: at least an hour; $0.05 in one region (Google's "Disk and image pricing", the standard snapshot price since
#: 2023-04-01, us baselines). Billed for the bytes the snapshot holds: at most the disk's size.
SNAPSHOT_USD_PER_GB_MONTH = 0.065
GKE_CLUSTER_USD_PER_HOUR = 0.10

ON_DEMAND_SOURCE = (
    "on-demand v6e list price, $2.70 per chip-hour in us-east5 (Google's Cloud TPU pricing, "
    "as reported by secondary sources)"
)

CAPACITIES: dict[str, Capacity] = {
    c.name: c
    for c in (
        # The tutorial's: a VM bound to a (calendar-mode) reservation, deleted when it ends.
        Capacity(
            "reservation",
            "RESERVATION_BOUND",
            {"on_host_maintenance": "TERMINATE", "instance_termination_action": "DELETE"},
            affinity="SPECIFIC_RESERVATION",
            idle_stop_minutes=0,
            ends="deleted at its reservation's end or a host maintenance event",
            no_capacity="the zone has no capacity outside reservations: a reservation-bound VM must land in its "
            "reservation, so check that the reservation is active and in gcp:zone",
            usd_per_chip_hour=2.70,
            billed_when_stopped=True,
            price_source=f"{ON_DEMAND_SOURCE}; a reservation is billed at its own (committed-use) rate, "
            "at most this, whether the VM runs or not",
        ),
        # "Request TPU Spot VMs": a TPU Spot VM cannot be restarted after it stops; delete and create it.
        Capacity(
            "spot",
            "SPOT",
            {
                "preemptible": True,
                "automatic_restart": False,
                "on_host_maintenance": "TERMINATE",
                "instance_termination_action": "DELETE",
            },
            usd_per_chip_hour=1.08,
            checkpoint_store="disk",
            gke_switch="spot",
            ends="preempted (and deleted)",
            no_capacity="no spot v6e capacity in gcp:zone right now (spot capacity comes and goes): run `invoke up` "
            "again later, or use another zone with v6e",
            shm_refused_because="a preempted spot VM is deleted, and its /dev/shm with the whole run",
            quota=PREEMPTIBLE_QUOTA,
            price_source="upper bound: Compute Engine Spot VMs are 60-91% below on-demand (Google's Spot VM "
            "documentation); 60% off the on-demand $2.70; the real price varies by region and day",
        ),
        # Dynamic Workload Scheduler: runs at most max_run_duration, then is deleted.
        Capacity(
            "flex-start",
            "FLEX_START",
            {"automatic_restart": False, "on_host_maintenance": "TERMINATE", "instance_termination_action": "DELETE"},
            affinity="NO_RESERVATION",
            usd_per_chip_hour=1.35,
            checkpoint_store="disk",
            ends="deleted at tpu-grpo:maxRunHours",
            shm_refused_because="a flex-start VM is deleted at its maximum run time, and its /dev/shm with the "
            "whole run",
            quota=PREEMPTIBLE_QUOTA,
            zones=FLEX_START_ZONES,
            gke_zones=GKE_FLEX_START_ZONES,
            run_limited=True,
            gke_switch="flex_start",
            # Compute Engine's "About Flex-start VMs" and the Flex-start VMs launch post: a request waits in a queue
            # up to its valid-for duration (at most two hours), then fails if no capacity came.
            waits="A flex-start request waits for capacity up to its valid-for duration (Google: at most two hours; "
            "pulumi-gcp's Instance has no field for it, so Compute Engine's default applies): `invoke up` "
            "shows Pulumi creating the VM all that time (its create timeout is set to outlast the wait), "
            "then the VM, or a failure to run `invoke up` again later. Interrupting it does not cancel the "
            "request: a VM that comes later is outside Pulumi's state, and the next `invoke up` says so. "
            "Unconfirmed: no Google page says how a single ct6e VM's flex-start request is made; tpu-grpo "
            "inserts the instance with provisioningModel FLEX_START, SkyPilot uses a managed instance group "
            "(docs/capacity.md).",
            wait_minutes=120,
            scales_to_zero=True,
            no_capacity="no flex-start capacity in gcp:zone right now: run `invoke up` again later, in a zone that "
            f"offers v6e flex-start ({', '.join(FLEX_START_ZONES)})",
            price_source=f"estimate: half the on-demand price, as SkyPilot prices Compute Engine TPU flex-start "
            f"(`_COMPUTE_TPU_FLEX_START_PRICE_FACTOR` 0.5, after Google's published Dynamic Workload "
            f"Scheduler price); {ON_DEMAND_SOURCE}",
        ),
        Capacity(
            "on-demand",
            "STANDARD",
            {"on_host_maintenance": "TERMINATE"},
            usd_per_chip_hour=2.70,
            price_source=ON_DEMAND_SOURCE,
        ),
    )
}
DEFAULT = "reservation"

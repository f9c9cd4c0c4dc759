"""`tpu-grpo:slice`: a multi-host v6e slice on GKE, every shape and capacity argument by argument
under Pulumi's mocks, its settings' refusals, and `invoke plan` with its cost."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from infra import offline
from infra.tpu_host import SCOPES
from tests.doubles.pulumi_cli import PulumiCli
from tests.support import invoke
from tpu_grpo.catalog.accelerators import SLICES
from tpu_grpo.catalog.capacity import CAPACITIES, CPU_HOST_USD_PER_HOUR, GKE_CLUSTER_USD_PER_HOUR
from tpu_grpo.config.errors import SettingsError

SLICE = {
    "tpu-grpo:slice": "v6e-16",
    "tpu-grpo:usePathways": "true",
    "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs",
    "tpu-grpo:bucket": "true",
}
CAPACITY_VALUES = {
    "reservation": {},
    "spot": {"tpu-grpo:capacity": "spot", "tpu-grpo:reservation": None},
    "flex-start": {"tpu-grpo:capacity": "flex-start", "tpu-grpo:reservation": None, "tpu-grpo:maxRunHours": "24"},
    "on-demand": {"tpu-grpo:capacity": "on-demand", "tpu-grpo:reservation": None},
}
LABELS = {"app": "tpu-grpo", "stack": "dev"}
#: Each capacity's node pool inputs for a pool of `hosts` hosts, as xpk 1.16.0 makes it.
CAPACITY_INPUTS = {
    "reservation": lambda hosts: (
        {"nodeCount": hosts},
        {
            "reservationAffinity": {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": ["v6e-8-calendar"],
            }
        },
    ),
    "spot": lambda hosts: ({"nodeCount": hosts}, {"spot": True}),
    "flex-start": lambda hosts: (
        {
            "initialNodeCount": 0,
            "management": {"autoRepair": False},
            "autoscaling": {"locationPolicy": "ANY", "minNodeCount": 0, "maxNodeCount": hosts},
        },
        {
            "flexStart": True,
            "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"},
            "maxRunDuration": "86400s",
        },
    ),
    "on-demand": lambda hosts: ({"nodeCount": hosts}, {}),
}


def declared(stack_values, **changes):
    values = {key: value for key, value in {**stack_values, **SLICE, **changes}.items() if value is not None}
    settings, resources, outputs = offline.run(values, "dev")
    by_type: dict[str, list] = {}
    for resource in resources:
        by_type.setdefault(resource.type, []).append(resource)
    return settings, by_type, outputs


@pytest.mark.parametrize("capacity", CAPACITY_VALUES)
@pytest.mark.parametrize("shape", SLICES)
def test_every_shape_and_capacity_declares_its_cluster_pools_and_jobset(stack_values, shape, capacity):
    settings, by_type, outputs = declared(stack_values, **{"tpu-grpo:slice": shape}, **CAPACITY_VALUES[capacity])
    hosts = SLICES[shape].hosts
    [cluster] = by_type["gcp:container/cluster:Cluster"]
    assert cluster.inputs == {
        "name": "tpu-grpo",
        "location": "us-east5-b",
        "project": "grpo-lab-123",
        "network": "(id of tpu-grpo-net)",
        "subnetwork": "(id of tpu-grpo-subnet)",
        "ipAllocationPolicy": {"stackType": "IPV4"},
        "datapathProvider": "ADVANCED_DATAPATH",
        "enableMultiNetworking": True,
        "releaseChannel": {"channel": "RAPID"},
        "removeDefaultNodePool": True,
        "initialNodeCount": 1,
        "deletionProtection": False,
        "resourceLabels": LABELS,
    }
    cpu, tpu = sorted(by_type["gcp:container/nodePool:NodePool"], key=lambda r: r.name)
    assert cpu.name == "tpu-grpo-cpu-np" and cpu.inputs == {
        "name": "cpu-np",
        "cluster": "tpu-grpo",
        "location": "us-east5-b",
        "project": "grpo-lab-123",
        "nodeCount": 1,
        "nodeConfig": {
            "machineType": "n2-standard-64",
            "oauthScopes": list(SCOPES),
            "resourceLabels": LABELS,
            "diskSizeGb": 100,
        },
    }
    pool, node_config = CAPACITY_INPUTS[capacity](hosts)
    assert tpu.name == "tpu-grpo-np-0" and tpu.inputs == {
        "name": "tpu-grpo-np-0",
        "cluster": "tpu-grpo",
        "location": "us-east5-b",
        "nodeLocations": ["us-east5-b"],
        "project": "grpo-lab-123",
        "placementPolicy": {"type": "COMPACT", "tpuTopology": SLICES[shape].topology},
        "maxPodsPerNode": 15,
        "networkConfig": {"acceleratorNetworkProfile": "auto"},
        "nodeConfig": {
            "machineType": "ct6e-standard-4t",
            "diskSizeGb": 200,
            "gvnic": {"enabled": True},
            "labels": {"cloud.google.com/gke-networking-dra-driver": "true"},
            "hostMaintenancePolicy": {"maintenanceInterval": "AS_NEEDED"},
            "oauthScopes": list(SCOPES),
            "resourceLabels": LABELS,
            **node_config,
        },
        **pool,
    }
    [repository] = by_type["gcp:artifactregistry/repository:Repository"]
    assert repository.inputs == {
        "repositoryId": "tpu-grpo",
        "location": "us-east5",
        "format": "DOCKER",
        "project": "grpo-lab-123",
        "labels": LABELS,
        "description": "tpu-grpo's MaxText post-training image (invoke image)",
    }
    [release] = by_type["kubernetes:helm.sh/v3:Release"]
    assert {k: v for k, v in release.inputs.items() if k != "compat"} == {
        "name": "jobset",
        "chart": "oci://registry.k8s.io/jobset/charts/jobset",
        "version": "0.10.1",
        "namespace": "jobset-system",
        "createNamespace": True,
    }
    # the pipeline driver's account, allowed to run and follow JobSets in the jobs' namespace and nothing more
    metadata = {"name": "tpu-grpo-pipeline", "namespace": "default", "labels": {"app": "tpu-grpo"}}
    [account] = by_type["kubernetes:core/v1:ServiceAccount"]
    assert account.inputs == {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}
    [role] = by_type["kubernetes:rbac.authorization.k8s.io/v1:Role"]
    assert role.inputs == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata,
        "rules": [
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get", "list", "delete"]},
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
        ],
    }
    [binding] = by_type["kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"]
    assert binding.inputs == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tpu-grpo-pipeline"},
        "subjects": [{"kind": "ServiceAccount", "name": "tpu-grpo-pipeline", "namespace": "default"}],
    }
    [provider] = by_type["pulumi:providers:kubernetes"]
    assert "command: gke-gcloud-auth-plugin" in provider.inputs["kubeconfig"]
    [bucket] = by_type["gcp:storage/bucket:Bucket"]
    assert bucket.inputs["name"] == "grpo-lab-runs" and bucket.inputs["forceDestroy"] is False
    assert not set(by_type) & {
        "gcp:compute/instance:Instance",
        "gcp:compute/disk:Disk",
        "gcp:compute/firewall:Firewall",
    }  # nothing of the one VM, no port 22
    assert outputs == {
        "name": "tpu-grpo",
        "zone": "us-east5-b",
        "project": "grpo-lab-123",
        "endpoint": offline.UNKNOWN,
        "cluster_ca_certificate": offline.UNKNOWN,
        "slice": shape,
        "num_slices": 1,
        "topology": SLICES[shape].topology,
        "hosts": hosts,
        "chips": SLICES[shape].chips,
        "machine_type": "ct6e-standard-4t",
        "capacity": capacity,
        "checkpoint_store": "gs://grpo-lab-runs/runs",
        "image": "us-east5-docker.pkg.dev/grpo-lab-123/tpu-grpo/maxtext-post-training:0.2.3",
        "jobset_version": "0.10.1",
    }
    assert settings.usd_per_hour == round(
        SLICES[shape].chips * CAPACITIES[capacity].usd_per_chip_hour + CPU_HOST_USD_PER_HOUR + GKE_CLUSTER_USD_PER_HOUR,
        2,
    )


def test_each_slice_gets_its_own_node_pool(stack_values):
    settings, by_type, outputs = declared(stack_values, **{"tpu-grpo:numSlices": "3", "tpu-grpo:slice": "v6e-32"})
    pools = {r.inputs["name"]: r.inputs for r in by_type["gcp:container/nodePool:NodePool"]}
    assert sorted(pools) == ["cpu-np", "tpu-grpo-np-0", "tpu-grpo-np-1", "tpu-grpo-np-2"]
    assert {pools[f"tpu-grpo-np-{i}"]["placementPolicy"]["tpuTopology"] for i in range(3)} == {"4x8"}
    assert (outputs["hosts"], outputs["chips"], settings.chips) == (24, 96, 96)


def test_a_slices_chips_found_in_another_zone_of_its_region_move_only_its_tpu_pools(stack_values):
    """tpu-grpo:placed in a fallback zone: the TPU pools' nodes go there (node_locations, as a zonal cluster's pool
    may), while the cluster, its CPU host, the bucket and the image stay in gcp:zone and its region."""
    spot = {**CAPACITY_VALUES["spot"], "tpu-grpo:fallback": [{"zone": "us-east5-a"}]}
    settings, by_type, outputs = declared(
        stack_values, **spot, **{"tpu-grpo:placed": {"zone": "us-east5-a", "capacity": "spot"}}
    )
    pools = {r.inputs["name"]: r.inputs for r in by_type["gcp:container/nodePool:NodePool"]}
    assert pools["tpu-grpo-np-0"]["location"] == pools["cpu-np"]["location"] == "us-east5-b"
    assert pools["tpu-grpo-np-0"]["nodeLocations"] == ["us-east5-a"] and "nodeLocations" not in pools["cpu-np"]
    [cluster] = by_type["gcp:container/cluster:Cluster"]
    assert cluster.inputs["location"] == "us-east5-b"
    [bucket] = by_type["gcp:storage/bucket:Bucket"]
    assert bucket.inputs["location"] == "US-EAST5"
    assert outputs["zone"] == "us-east5-a"
    from infra.tpu_slice import gcloud_node_pool_command

    command = gcloud_node_pool_command(settings)
    assert "--location=us-east5-b" in command and "--node-locations=us-east5-a" in command
    # back home, the pools name the home zone: node_locations is Optional and Computed, so a pool that named none
    # would keep its nodes in us-east5-a (resource_container_node_pool.go)
    _, at_home, _ = declared(stack_values, **spot)
    tpu_pools = [r for r in at_home["gcp:container/nodePool:NodePool"] if r.inputs["name"] != "cpu-np"]
    assert [r.inputs["nodeLocations"] for r in tpu_pools] == [["us-east5-b"]]
    assert "--node-locations" not in " ".join(gcloud_node_pool_command(declared(stack_values, **spot)[0]))


def test_back_home_the_engine_moves_the_tpu_pools_home_as_the_program_names_the_zone(stack_values):
    """The engine double keeps an Optional and Computed field the program leaves unset (tests/doubles/provider.py,
    from the provider's schema): a pool declared with no node_locations would stay in the fallback zone. The program
    names the home zone, so an update back home moves the pools' nodes there."""
    import dataclasses

    from tests.doubles.cloud import Cloud, Engine

    spot = {**CAPACITY_VALUES["spot"], "tpu-grpo:fallback": [{"zone": "us-east5-a"}]}
    away = declared(stack_values, **spot, **{"tpu-grpo:placed": {"zone": "us-east5-a", "capacity": "spot"}})[1]
    home = declared(stack_values, **spot)[1]

    def flat(by_type: dict) -> list:
        return [resource for resources in by_type.values() for resource in resources]

    def pool_zones(engine: Engine) -> list:
        pools = [e for e in engine.state.values() if e.type.endswith("NodePool") and e.inputs["name"] != "cpu-np"]
        return [e.inputs.get("nodeLocations") for e in pools]

    engine = Engine(Cloud())
    assert not engine.up(flat(away)).error and pool_zones(engine) == [["us-east5-a"]]
    unnamed = [
        dataclasses.replace(r, inputs={k: v for k, v in r.inputs.items() if k != "nodeLocations"}) for r in flat(home)
    ]
    kept = Engine(Cloud(set(engine.cloud.resources)), dict(engine.state))
    assert not kept.up(unnamed).error and pool_zones(kept) == [["us-east5-a"]]  # a pool named no zone: it stays
    assert not engine.up(flat(home)).error and pool_zones(engine) == [["us-east5-b"]]


def test_a_slices_fallback_stays_in_its_region(stack_values):
    with pytest.raises(SettingsError) as refused:
        declared(stack_values, **CAPACITY_VALUES["spot"], **{"tpu-grpo:fallback": [{"zone": "us-central1-b"}]})
    assert str(refused.value).startswith(
        "tpu-grpo:fallback[0]='spot in us-central1-b' is outside gcp:zone's region us-east5, where a slice's cluster,"
    )
    declared(stack_values, **CAPACITY_VALUES["spot"], **{"tpu-grpo:fallback": [{"zone": "us-east5-a"}]})


def test_a_slice_needs_no_ssh_key_nor_vm_settings(stack_values, tmp_path):
    values = {
        **stack_values,
        "tpu-grpo:sshPublicKeyPath": str(tmp_path / "missing.pub"),
        "tpu-grpo:sshSourceRanges": ["YOUR_PUBLIC_IP/32"],
        "tpu-grpo:machineType": "ct6e-standard-8t",
    }
    settings, _, _ = declared(values)
    assert settings.machine_type == "ct6e-standard-4t" and settings.pending == ()


def test_a_slice_stack_needs_only_what_a_slice_uses(stack_values):
    """No boot disk size (default: the tutorial's 200 GB a host), data disk, SSH user, key or ranges."""
    vm_only = (
        "tpu-grpo:bootDiskGb",
        "tpu-grpo:dataDiskGb",
        "tpu-grpo:sshUser",
        "tpu-grpo:sshPublicKeyPath",
        "tpu-grpo:sshSourceRanges",
        "tpu-grpo:machineType",
    )
    values = {key: value for key, value in stack_values.items() if key not in vm_only}
    settings, by_type, _ = declared(values)
    assert settings.boot_disk_gb == 200 and settings.pending == ()
    tpu = [pool for pool in by_type["gcp:container/nodePool:NodePool"] if pool.name == "tpu-grpo-np-0"]
    assert tpu[0].inputs["nodeConfig"]["diskSizeGb"] == 200


def test_a_slices_own_service_account_can_pull_the_image_and_run_gke_nodes(stack_values):
    """A fresh account on every node: it reads the stack's image repository, holds GKE's node role (logging,
    monitoring) and gets object access to the bucket the stack declares."""
    account = "trainer@grpo-lab-123.iam.gserviceaccount.com"
    _, by_type, _ = declared(stack_values, **{"tpu-grpo:serviceAccount": account})
    member = f"serviceAccount:{account}"
    [reader] = by_type["gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"]
    assert reader.name == "images-reader" and reader.inputs == {
        "repository": "tpu-grpo",
        "location": "us-east5",
        "project": "grpo-lab-123",
        "role": "roles/artifactregistry.reader",
        "member": member,
    }
    [node] = by_type["gcp:projects/iAMMember:IAMMember"]
    assert node.name == "tpu-grpo-node-role" and node.inputs == {
        "project": "grpo-lab-123",
        "role": "roles/container.defaultNodeServiceAccount",
        "member": member,
    }
    stores = by_type["gcp:storage/bucketIAMMember:BucketIAMMember"]
    assert sorted(store.inputs["role"] for store in stores) == [
        "roles/storage.legacyBucketReader",
        "roles/storage.objectAdmin",
    ]
    assert all(
        store.inputs == {"bucket": "grpo-lab-runs", "role": store.inputs["role"], "member": member} for store in stores
    )
    assert all(
        pool.inputs["nodeConfig"]["serviceAccount"] == account for pool in by_type["gcp:container/nodePool:NodePool"]
    )
    _, default, _ = declared(stack_values)  # no Editor assumed: the default account gets the same roles
    default_member = "serviceAccount:PROJECT_NUMBER-compute@developer.gserviceaccount.com"
    granted = [m for t, found in default.items() if "IAMMember" in t or "IamMember" in t for m in found]
    assert len(granted) == 4 and {m.inputs["member"] for m in granted} == {default_member}


@pytest.mark.parametrize("slice_values", [SLICE, {}], ids=["slice", "one-vm"])
def test_plan_says_what_an_undeclared_bucket_must_grant_the_stacks_own_account(
    stack_dir, stack_values, home, slice_values
):
    import yaml

    account = "trainer@grpo-lab-123.iam.gserviceaccount.com"
    values = {
        **stack_values,
        **slice_values,
        "tpu-grpo:checkpointStore": "gs://shared-runs/grpo",
        "tpu-grpo:serviceAccount": account,
    }
    values.pop("tpu-grpo:bucket", None)
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    plan = json.loads(invoke("plan", "--json", cwd=stack_dir, env=home).stdout)
    assert plan["access"] == [
        f"{account} needs {role} on gs://shared-runs, which this stack does not declare: gcloud "
        f"storage buckets add-iam-policy-binding gs://shared-runs --member=serviceAccount:{account} "
        f"--role={role}"
        for role in ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")
    ]
    text = invoke("plan", cwd=stack_dir, env=home).stdout
    assert "access to grant: " in text and "gcloud storage buckets add-iam-policy-binding" in text
    values.pop("tpu-grpo:serviceAccount")  # the default compute account: named with the command for its number
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    default = json.loads(invoke("plan", "--json", cwd=stack_dir, env=home).stdout)["access"][0]
    assert default.startswith(
        "PROJECT_NUMBER-compute@developer.gserviceaccount.com needs roles/storage.objectAdmin "
        "on gs://shared-runs, which this stack does not declare (PROJECT_NUMBER: gcloud projects "
        "describe grpo-lab-123 --format='value(projectNumber)'): "
    )
    values["tpu-grpo:bucket"] = "true"  # declared here: the stack grants it itself
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    assert json.loads(invoke("plan", "--json", cwd=stack_dir, env=home).stdout)["access"] == []


@pytest.mark.parametrize(
    "changes, key, problem",
    [
        ({"tpu-grpo:slice": "v6e-12"}, "tpu-grpo:slice", "is not a slice (v6e-8, the one VM, or v6e-16, v6e-32, "),
        ({"tpu-grpo:numSlices": "5"}, "tpu-grpo:numSlices", "from 1 to 4 slices"),
        (
            {
                "tpu-grpo:slice": "v6e-8",
                "tpu-grpo:checkpointStore": "disk",
                "tpu-grpo:bucket": None,
                "tpu-grpo:numSlices": "2",
            },
            "tpu-grpo:numSlices",
            "is set, but slice v6e-8 is one VM",
        ),
        ({"tpu-grpo:usePathways": "false"}, "tpu-grpo:usePathways", "but slice v6e-16 has several hosts"),
        (
            {"tpu-grpo:checkpointStore": "disk", "tpu-grpo:bucket": None},
            "tpu-grpo:checkpointStore",
            "is not a bucket, and the pods of slice v6e-16 share no disk",
        ),
    ],
    ids=["unknown-shape", "too-many-slices", "count-on-one-vm", "no-pathways", "no-bucket"],
)
def test_bad_slice_settings_are_refused_before_anything_is_declared(stack_values, changes, key, problem):
    with pytest.raises(SettingsError) as refused:
        declared(stack_values, **changes)
    assert refused.value.key == key and problem in str(refused.value)
    assert "fix: " in str(refused.value)


def test_a_slice_stack_shows_no_data_disk_and_no_data_disk_setting_applies(stack_dir, stack_values, home):
    """A slice has no VM to attach a data disk to: `invoke settings` gives none of the data disk's settings a value
    (not the disk store's IOPS and throughput either), and `plan` shows no data disk."""
    import yaml

    data_disk = ("tpu-grpo:dataDiskGb", "tpu-grpo:dataDiskIops", "tpu-grpo:dataDiskThroughputMibps")
    values = {k: v for k, v in {**stack_values, **SLICE}.items() if v is not None and k not in data_disk}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    said = json.loads(invoke("settings", "--json", cwd=stack_dir, env=home).stdout)["settings"]
    assert {key: said[key] for key in data_disk} == dict.fromkeys(data_disk, {"value": None, "default": "unset"})
    plan = invoke("plan", cwd=stack_dir, env=home)
    assert plan.returncode == 0, plan.stderr
    assert "data disk" not in plan.stdout.lower()


@pytest.mark.parametrize(
    "capacity, flags",
    [
        ("reservation", ["--reservation-affinity=specific", "--reservation=v6e-8-calendar", "--num-nodes=16"]),
        ("spot", ["--spot", "--num-nodes=16"]),
        (
            "flex-start",
            [
                "--flex-start",
                "--enable-autoscaling",
                "--location-policy=ANY",
                "--reservation-affinity=none",
                "--no-enable-autorepair",
                "--max-nodes=16",
                "--num-nodes=0",
                "--max-run-duration=86400s",
            ],
        ),
        ("on-demand", ["--num-nodes=16"]),
    ],
)
def test_plan_shows_the_node_pool_as_gcloud_and_the_slice_cost(stack_dir, stack_values, home, capacity, flags):
    import yaml

    values = {
        k: v
        for k, v in {**stack_values, **SLICE, "tpu-grpo:slice": "v6e-64", **CAPACITY_VALUES[capacity]}.items()
        if v is not None
    }
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    result = invoke("plan", "--json", cwd=stack_dir, env=home)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    command = plan["gcloud"]
    # --host-maintenance-interval and --accelerator-network-profile are flags of gcloud's beta track (xpk runs it too)
    assert command[:6] == ["gcloud", "beta", "container", "node-pools", "create", "tpu-grpo-np-0"]
    start = command.index("--host-maintenance-interval=AS_NEEDED") + 1
    assert command[start : start + len(flags)] == flags
    assert command[-3:] == ["--placement-type=COMPACT", "--tpu-topology=8x8", "--max-pods-per-node=15"]
    assert plan["cost"]["chips"] == 64 and plan["cost"]["slice"] == "v6e-64"
    assert plan["cost"]["usd_per_hour"] == round(64 * CAPACITIES[capacity].usd_per_chip_hour + 3.21, 2)
    assert plan["provision"] == [] and plan["jobs"] == []
    bucket = values["tpu-grpo:checkpointStore"].rstrip("/")
    assert plan["compile_cache"].startswith(
        f"compile cache: {bucket}/compile-cache/MAXTEXT_JAX_LIBTPU_VERSIONS/v6e-64x1/llama3.1-8b-Instruct/train-"
    )


def test_provisioning_refuses_a_slice_stack_in_one_line(stack_dir, stack_values, home):
    import yaml

    values = {k: v for k, v in {**stack_values, **SLICE}.items() if v is not None}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    result = invoke("provision", cwd=stack_dir, env=home)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: stack 'dev' is slice v6e-16 on GKE, which has no VM to log into; fix: run this task on a one-VM stack "
        "(docs/slices.md)"
    ]


def test_plan_and_up_say_which_change_replaces_a_slices_node_pools(stack_dir, stack_values, tmp_path):
    import yaml

    values = {
        k: v
        for k, v in {**stack_values, **SLICE, "tpu-grpo:slice": "v6e-32", **CAPACITY_VALUES["spot"]}.items()
        if v is not None
    }
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli = PulumiCli(
        tmp_path / "pulumi",
        {"slice": "v6e-16", "zone": "us-east5-b", "capacity": "reservation", "machine_type": "ct6e-standard-4t"},
        None,
    )
    cli.deployed({k: v for k, v in {**stack_values, **SLICE}.items() if v is not None})
    env = cli.env()
    system = tmp_path / "system"  # this machine's /usr/bin may hold the plugin: the stand-in pulumi needs only cat
    system.mkdir()
    (system / "cat").symlink_to(shutil.which("cat"))
    env["PATH"] = ":".join([*env["PATH"].split(":")[:2], str(system)])
    [line] = json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)["replaces"]
    assert line.startswith("NodePool tpu-grpo-np-0 (") and line.endswith(
        "): new TPU hosts (a running job stops); the runs stay in the bucket"
    )
    assert "placementPolicy.tpuTopology 4x4 -> 4x8" in line and "nodeConfig.spot (unset) -> True" in line
    refused = invoke("up", cwd=stack_dir, env=env)
    assert (
        refused.returncode == 2
        and "  - GKE's credential plugin, with which Pulumi and the tasks reach the "
        "slice's cluster: gcloud components install gke-gcloud-auth-plugin"
        in refused.stderr
    )
    plugin = Path(env["PATH"].split(":")[0]) / "gke-gcloud-auth-plugin"
    plugin.write_text("#!/bin/sh\nexit 0\n")
    plugin.chmod(0o755)
    up = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert up.returncode == 0, up.stderr
    # the engine's own diff (the double's, from the provider's schemas) names a block that went as one change
    [said] = [said for said in up.stdout.splitlines() if said.startswith("replaces: NodePool tpu-grpo-np-0 (")]
    assert "placementPolicy.tpuTopology 4x4 -> 4x8" in said and "nodeConfig.spot (unset) -> True" in said
    assert "nodeConfig.reservationAffinity {" in said and said.endswith(line[line.index("): new TPU hosts") :])


def test_plan_and_up_say_gke_recreates_the_nodes_of_a_pool_whose_machine_type_changes(
    stack_dir, stack_values, tmp_path
):
    """A node pool's machine type is updated in place, and GKE applies it by making the pool's nodes anew (infra/
    replacements.RECREATES_NODES): an upgrade over a stack whose CPU pool an earlier release made of another machine
    type says so in `plan` and `up`, as what stops a job, not as nothing."""
    import yaml

    values = {k: v for k, v in {**stack_values, **SLICE}.items() if v is not None}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    cli = PulumiCli(tmp_path / "pulumi")
    cli.deployed(values)
    state = json.loads((cli.folder / "state.json").read_text())
    [pool] = [r for r in state["deployment"]["resources"] if r["urn"].endswith("NodePool::tpu-grpo-cpu-np")]
    pool["inputs"]["nodeConfig"]["machineType"] = "n2-standard-32"  # what the earlier release declared
    (cli.folder / "state.json").write_text(json.dumps(state))
    env = cli.env()
    plugin = Path(env["PATH"].split(":")[0]) / "gke-gcloud-auth-plugin"
    plugin.write_text("#!/bin/sh\nexit 0\n")
    plugin.chmod(0o755)
    said = (
        "NodePool tpu-grpo-cpu-np (nodeConfig.machineType n2-standard-32 -> n2-standard-64): updated in place, and "
        "GKE makes its nodes anew to apply it (a job running on them stops; the runs stay in the bucket)"
    )
    assert json.loads(invoke("plan", "--json", cwd=stack_dir, env=env).stdout)["replaces"] == [said]
    up = invoke("up", "--yes", cwd=stack_dir, env=env)
    assert up.returncode == 0, up.stderr
    assert f"replaces: {said}" in up.stdout.splitlines()


@pytest.mark.parametrize(
    "model, shape, disk_gb, lazy",
    [
        ("llama3.1-8b-Instruct", "v6e-16", 100, False),  # 16 GB to download, 32 GB eagerly in memory
        ("qwen3-30b-a3b", "v6e-32", 122, False),  # MaxText's "approximately 62 GB of free disk space", 122 GB in memory
        ("llama3.1-70b", "v6e-64", 202, True),
    ],
)  # 141 GB to download; 282 GB eagerly, more than the pod holds
def test_the_cpu_host_is_sized_for_the_models_conversion(stack_dir, stack_values, model, shape, disk_gb, lazy):
    """The conversion downloads the model's safetensors onto the CPU host's boot disk (GKE's default: 100 GB) and,
    loaded eagerly, holds them and their converted copy in its pod's memory: the disk grows with the model, and a
    model the pod cannot hold is loaded lazily."""
    import yaml

    values = {
        k: v
        for k, v in {**stack_values, **SLICE, "tpu-grpo:slice": shape, "tpu-grpo:model": model}.items()
        if v is not None
    }
    settings, resources, _ = offline.run(values, "dev")
    [cpu] = [r for r in resources if r.type == "gcp:container/nodePool:NodePool" and r.name.endswith("cpu-np")]
    assert cpu.inputs["nodeConfig"]["diskSizeGb"] == disk_gb == settings.cpu_pool_disk_gb
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    dry = invoke("convert", "--dry-run", cwd=stack_dir)
    assert dry.returncode == 0, dry.stderr
    pod = yaml.safe_load(dry.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["memory"] == "230G"
    assert f"LAZY_LOAD_TENSORS={'True' if lazy else 'False'}" in container["command"][2]
    download = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)["cost"]["download"]  # plan says it too
    assert download["gb"] == round(settings.model_row.conversion_download_gb(lazy), 1)


def test_the_kubeconfig_of_a_slices_stack_reaches_the_gke_endpoint_over_https(tmp_path, monkeypatch):
    """What tpu-grpo writes from the stack's outputs (the endpoint, GKE's CA), as the Kubernetes client reads it: the
    API server at https://ENDPOINT (GKE serves its API on 443 only), the token from gke-gcloud-auth-plugin. The
    plugin's stand-in prints what the Kubernetes docs' "client-go credential plugins" page says an exec plugin prints
    (an ExecCredential of client.authentication.k8s.io/v1beta1), as gke-gcloud-auth-plugin does."""
    import base64

    import yaml

    from tpu_grpo.cloud.kube import Cluster
    from tpu_grpo.config.kubeconfig import AUTH_PLUGIN, kubeconfig

    plugin = tmp_path / AUTH_PLUGIN
    plugin.write_text(
        '#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": '
        '"ExecCredential", "status": {"token": "ya29.stand-in"}}\'\n'
    )
    plugin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    cluster = Cluster(yaml.safe_load(kubeconfig("tpu-grpo", "34.118.0.5", ca)))
    assert cluster.server == "https://34.118.0.5"
    assert cluster.api.configuration.api_key == {"BearerToken": "Bearer ya29.stand-in"}

"""A multi-host v6e slice as a Pulumi ComponentResource: a GKE cluster, a CPU node pool for the
Pathways head and the conversion and export jobs, one TPU node pool per slice with the stack's
capacity, an Artifact Registry repository for the post-training image, the checkpoint bucket, and
JobSet from its pinned Helm chart.

Modelled on what `xpk cluster create-pathways` 1.16.0 runs (its `--dry-run` prints the gcloud
commands), with these differences: the cluster is zonal (xpk's is regional with one node
location; one zone is all a slice uses, and GKE's free tier covers one zonal cluster), has no
default pool (xpk keeps an e2-standard-16 pool of 6 nodes for its Kueue and system pods; GKE's
system pods fit on the CPU pool), installs JobSet from its Helm chart, not Kueue (tpu-grpo runs one
workload at a time and needs no queue), and gives nodes the one VM's scopes (Cloud Storage
read-write, logging, monitoring) rather than cloud-platform.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.common import (
    HOST_COMPONENT,
    IMAGE_ROLE,
    NODE_ROLE,
    SLICE_COMPONENT,
    account_member,
    declare_bucket,
    declare_network,
    labels,
    named,
    switched_from,
)
from infra.tpu_host import SCOPES
from tpu_grpo.catalog import images
from tpu_grpo.catalog.accelerators import CPU_MACHINE_TYPE, CPU_POOL, HOST_MACHINE_TYPE
from tpu_grpo.catalog.release import (
    JOBS_NAMESPACE,
    JOBSET_CHART,
    JOBSET_NAMESPACE,
    JOBSET_VERSION,
    PIPELINE_ACCOUNT,
    PIPELINE_RULES,
)
from tpu_grpo.config.kubeconfig import kubeconfig
from tpu_grpo.config.settings import Settings

RELEASE_CHANNEL = "RAPID"  # xpk's: the newest GKE versions, which new TPU features need
#: xpk's TPU pool flags: --max-pods-per-node 15, --host-maintenance-interval=AS_NEEDED, --enable-gvnic and,
#: for v6e, --accelerator-network-profile=auto with the node label that enables the DRA network driver.
TPU_MAX_PODS_PER_NODE = 15
TPU_NODE_LABELS = {"cloud.google.com/gke-networking-dra-driver": "true"}
#: A slice of another shape is new hosts: terraform-provider-google neither forces a new pool for a changed
#: `placement_policy.tpu_topology` (resource_container_node_pool.go: not ForceNew) nor sends it in an update, so
#: without this a new `tpu-grpo:slice` would change the state and leave the pool as it was.
POOL_REPLACED_ON_CHANGES = ["placementPolicy.tpuTopology"]


class TpuSlice(pulumi.ComponentResource):
    """A GKE cluster holding `settings.num_slices` slices of `settings.slice`, ready for JobSets."""

    def __init__(self, settings: Settings, opts: pulumi.ResourceOptions | None = None):
        super().__init__(SLICE_COMPONENT, settings.vm_name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        shared = pulumi.ResourceOptions.merge(child, switched_from(settings, HOST_COMPONENT))
        shape, obtained, name = settings.tpu_slice, settings.obtained, settings.vm_name
        assert shape, "a slice's stack"
        resource_labels = labels(settings)
        network, subnetwork = declare_network(settings, shared)
        self.cluster = gcp.container.Cluster(
            name,
            name=name,
            location=settings.home.zone,
            project=settings.project,
            network=network,
            subnetwork=subnetwork,
            ip_allocation_policy={"stack_type": "IPV4"},  # VPC-native, ranges chosen by GKE
            datapath_provider="ADVANCED_DATAPATH",  # xpk's --enable-dataplane-v2
            enable_multi_networking=True,  # xpk's; the TPU pools' accelerator network profile needs it
            release_channel={"channel": RELEASE_CHANNEL},
            remove_default_node_pool=True,
            initial_node_count=1,
            deletion_protection=False,  # `pulumi destroy` removes it; the runs are in the bucket
            resource_labels=resource_labels,
            opts=child,
        )
        node_config: dict[str, Any] = {
            "oauth_scopes": list(SCOPES),
            "resource_labels": resource_labels,
            "service_account": settings.service_account,
        }
        pool_options = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(replace_on_changes=POOL_REPLACED_ON_CHANGES)
        )
        self.cpu_pool = gcp.container.NodePool(
            f"{name}-{CPU_POOL}",
            name=CPU_POOL,
            cluster=self.cluster.name,
            location=settings.home.zone,
            project=settings.project,
            node_count=1,
            node_config=cast(
                gcp.container.NodePoolNodeConfigArgsDict,
                {**node_config, "machine_type": CPU_MACHINE_TYPE, "disk_size_gb": settings.cpu_pool_disk_gb},
            ),
            opts=pool_options,
        )
        self.tpu_pools = []
        capacity, capacity_config = obtained.node_pool(settings.reservation, settings.max_run_hours, shape.hosts)
        # Chips found in another zone of the cluster's region (tpu-grpo:fallback): the pools' nodes go there, as a
        # zonal cluster's node pool may ("in the same region as their cluster's zone", node_locations of
        # terraform-provider-google's container_node_pool); the cluster and its CPU host stay. Always said, the home
        # zone too: node_locations is Optional and Computed, so a pool that no longer names it keeps where it was.
        for index in range(settings.num_slices):
            pool = shape.pool(name, index)
            self.tpu_pools.append(
                gcp.container.NodePool(
                    pool,
                    name=pool,
                    cluster=self.cluster.name,
                    location=settings.home.zone,
                    node_locations=[settings.zone],
                    project=settings.project,
                    placement_policy={"type": "COMPACT", "tpu_topology": shape.topology},
                    max_pods_per_node=TPU_MAX_PODS_PER_NODE,
                    network_config={"accelerator_network_profile": "auto"},
                    node_config=cast(
                        gcp.container.NodePoolNodeConfigArgsDict,
                        {
                            **node_config,
                            "machine_type": HOST_MACHINE_TYPE,
                            "disk_size_gb": settings.boot_disk_gb,
                            "gvnic": {"enabled": True},
                            "labels": TPU_NODE_LABELS,
                            "host_maintenance_policy": {"maintenance_interval": "AS_NEEDED"},
                            **capacity_config,
                        },
                    ),
                    **capacity,
                    opts=pool_options,
                )
            )
        # The project's one repository of the image (images.REPOSITORY), whatever the cluster is called: named apart
        # from vmName, so that another cluster name neither makes it again (its id is taken) nor deletes the old
        # name's grant, which is the same binding as the new one's (tpgiamresource/resource_iam_member.go).
        self.repository = gcp.artifactregistry.Repository(
            "images",
            repository_id=images.REPOSITORY,
            location=settings.region,
            format="DOCKER",
            description="tpu-grpo's MaxText post-training image (invoke image)",
            labels=resource_labels,
            project=settings.project,
            opts=named(settings, "images", child),
        )
        nodes = account_member(settings)
        gcp.artifactregistry.RepositoryIamMember(
            "images-reader",
            repository=self.repository.repository_id,
            location=settings.region,
            role=IMAGE_ROLE,
            member=nodes,
            project=settings.project,
            opts=named(settings, "images-reader", child),
        )
        # Project-wide, and not the stack's own: the default compute account may run other clusters' nodes, which
        # rely on it too (a second stack declares the same binding). Retained: `pulumi destroy` leaves it.
        gcp.projects.IAMMember(
            f"{name}-node-role",
            project=settings.project,
            role=NODE_ROLE,
            member=nodes,
            opts=named(settings, f"{name}-node-role", child, retain_on_delete=True),
        )
        if settings.bucket:
            self.bucket = declare_bucket(settings, shared, nodes)
        config = pulumi.Output.all(self.cluster.endpoint, self.cluster.master_auth.cluster_ca_certificate).apply(
            lambda parts: kubeconfig(name, parts[0], parts[1])
        )
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=config, opts=child)
        self.jobset = k8s.helm.v3.Release(
            f"{name}-jobset",
            name="jobset",
            chart=JOBSET_CHART,
            version=JOBSET_VERSION,
            namespace=JOBSET_NAMESPACE,
            create_namespace=True,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.cpu_pool]),
        )
        self.declare_pipeline_account(name, provider)
        self.outputs = {
            "name": self.cluster.name,
            "zone": settings.zone,
            "project": settings.project,
            "endpoint": self.cluster.endpoint,
            "cluster_ca_certificate": self.cluster.master_auth.cluster_ca_certificate,
            "slice": shape.name,
            "num_slices": settings.num_slices,
            "topology": shape.topology,
            "hosts": shape.hosts * settings.num_slices,
            "chips": settings.chips,
            "machine_type": HOST_MACHINE_TYPE,
            "capacity": settings.capacity,
            "checkpoint_store": settings.store.root,
            "image": images.post_training_image(settings.project, settings.region),
            "jobset_version": JOBSET_VERSION,
        }
        self.register_outputs(self.outputs)

    def declare_pipeline_account(self, name: str, provider: k8s.Provider) -> None:
        """The service account a pipeline's driver Job runs as, and the Role that lets it create, follow and delete
        the steps' JobSets and read their pods' logs, in the jobs' namespace and nowhere else."""
        opts = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.jobset])
        metadata: Any = {"name": PIPELINE_ACCOUNT, "namespace": JOBS_NAMESPACE, "labels": {"app": "tpu-grpo"}}
        account = k8s.core.v1.ServiceAccount(f"{name}-pipeline-account", metadata=metadata, opts=opts)
        role = k8s.rbac.v1.Role(
            f"{name}-pipeline-role", metadata=metadata, rules=cast(Any, list(PIPELINE_RULES)), opts=opts
        )
        k8s.rbac.v1.RoleBinding(
            f"{name}-pipeline-binding",
            metadata=metadata,
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="Role", name=role.metadata["name"]
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata["name"], namespace=JOBS_NAMESPACE)
            ],
            opts=opts,
        )


def gcloud_node_pool_command(settings: Settings, index: int = 0) -> list[str]:
    """The `gcloud beta container node-pools create` that makes the same TPU node pool (xpk's flags, in its order):
    `--host-maintenance-interval` and `--accelerator-network-profile` exist only in gcloud's beta track, which is
    why xpk runs it too."""
    shape, name = settings.tpu_slice, settings.vm_name
    assert shape, "a slice's stack"
    service_account = [f"--service-account={settings.service_account}"] if settings.service_account else []
    return [
        "gcloud",
        "beta",
        "container",
        "node-pools",
        "create",
        shape.pool(name, index),
        f"--location={settings.home.zone}",
        *([f"--node-locations={settings.zone}"] if settings.zone != settings.home.zone else []),
        f"--cluster={name}",
        f"--project={settings.project}",
        f"--machine-type={HOST_MACHINE_TYPE}",
        "--host-maintenance-interval=AS_NEEDED",
        *settings.obtained.gke_flags(settings.reservation, settings.max_run_hours, shape.hosts),
        "--enable-gvnic",
        "--accelerator-network-profile=auto",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in TPU_NODE_LABELS.items()),
        f"--disk-size={settings.boot_disk_gb}",
        "--scopes=" + ",".join(SCOPES),
        *service_account,
        "--placement-type=COMPACT",
        f"--tpu-topology={shape.topology}",
        f"--max-pods-per-node={TPU_MAX_PODS_PER_NODE}",
    ]

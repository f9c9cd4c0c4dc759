"""What the one VM and a slice's GKE cluster both declare: a network of their own (unless the stack
names one) and the checkpoint store's bucket."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from tpu_grpo.settings import PROJECT, Settings
from tpu_grpo.stores import bucket_of

SUBNET_RANGE = "10.130.0.0/24"
#: What a service account of the stack's own (`tpu-grpo:serviceAccount`) needs; the project's default compute
#: account has it all through its project Editor role. Object access to the checkpoint store; on a slice, to
#: pull the post-training image, and GKE's own role for a node's account (logging, monitoring: GKE's
#: "Use least privilege IAM service accounts").
BUCKET_ROLE = "roles/storage.objectAdmin"
IMAGE_ROLE = "roles/artifactregistry.reader"
NODE_ROLE = "roles/container.defaultNodeServiceAccount"


def labels(settings: Settings) -> dict[str, str]:
    return {"app": PROJECT, "stack": settings.stack, **settings.labels}


def declare_network(settings: Settings, child: pulumi.ResourceOptions) -> tuple:
    """The stack's network and subnetwork: the ones it names, or its own with Private Google Access."""
    if settings.network:
        return settings.network, settings.subnetwork
    net = gcp.compute.Network(
        f"{settings.vm_name}-net", name=f"{settings.vm_name}-net",
        auto_create_subnetworks=False, project=settings.project, opts=child,
    )
    subnet = gcp.compute.Subnetwork(
        f"{settings.vm_name}-subnet", name=f"{settings.vm_name}-subnet",
        network=net.id, region=settings.region, ip_cidr_range=SUBNET_RANGE,
        private_ip_google_access=True, project=settings.project, opts=child,
    )
    return net.id, subnet.id


def declare_bucket(settings: Settings, child: pulumi.ResourceOptions) -> gcp.storage.Bucket:
    """The checkpoint store's bucket: in the stack's region (no cross-region traffic or charges),
    uniform bucket-level access (IAM only, no object ACLs), public access prevention enforced.
    Retained on delete: `pulumi destroy` (and `invoke down`) leave it and what it holds, and
    never force-destroy it. A service account named in the stack gets object access to it; the
    project's default compute account has it through its project role."""
    bucket = gcp.storage.Bucket(
        f"{settings.vm_name}-store", name=bucket_of(settings.store), location=settings.region.upper(),
        uniform_bucket_level_access=True, public_access_prevention="enforced", force_destroy=False,
        labels=labels(settings), project=settings.project,
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(retain_on_delete=True)),
    )
    if settings.service_account:
        gcp.storage.BucketIAMMember(
            f"{settings.vm_name}-store-access", bucket=bucket.name, role=BUCKET_ROLE,
            member=member(settings), opts=child,
        )
    return bucket


def member(settings: Settings) -> str:
    return f"serviceAccount:{settings.service_account}"


def access_to_grant(settings: Settings) -> list[str]:
    """What the stack's own service account needs and the stack cannot grant, as the command that grants it:
    object access to a checkpoint bucket the stack does not declare."""
    if not (settings.service_account and settings.store.name == "gs" and not settings.bucket):
        return []
    bucket = bucket_of(settings.store)
    return [f"{settings.service_account} needs {BUCKET_ROLE} on gs://{bucket}, which this stack does not declare: "
            f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member={member(settings)} "
            f"--role={BUCKET_ROLE}"]

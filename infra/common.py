"""What the one VM and a slice's GKE cluster both declare: a network of their own (unless the stack
names one) and the checkpoint store's bucket."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from tpu_grpo.settings import PROJECT, Settings
from tpu_grpo.stores import bucket_of

SUBNET_RANGE = "10.130.0.0/24"


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
            f"{settings.vm_name}-store-access", bucket=bucket.name, role="roles/storage.objectAdmin",
            member=f"serviceAccount:{settings.service_account}", opts=child,
        )
    return bucket

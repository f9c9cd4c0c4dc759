"""What the one VM and a slice's GKE cluster both declare: a network of their own (unless the stack
names one) and the checkpoint store's bucket."""

from __future__ import annotations

import re
import shlex

import pulumi
import pulumi_gcp as gcp

from tpu_grpo.catalog.stores import bucket_of
from tpu_grpo.config.keys import DEFAULT_ACCOUNT, PROJECT
from tpu_grpo.config.settings import Settings

SUBNET_RANGE = "10.130.0.0/24"
#: What the account the VM (or a slice's nodes) runs as needs, granted to it whichever it is: the stack's own
#: (`tpu-grpo:serviceAccount`) or the project's default compute account, which organisations created since May 2024
#: no longer give Editor (Artifact Registry's "Integrate with GKE": `iam.automaticIamGrantsForDefaultServiceAccounts`
#: is enforced by default). The checkpoint store: objects, and the bucket itself, which JAX/TensorStore read
#: (MaxText 0.2.3's rl_on_multi_host.md: objectAdmin "alone will cause a misleading 'bucket not found' error";
#: Storage Legacy Bucket Reader gives storage.buckets.get). On a slice: pulling the post-training image, and GKE's
#: own role for a node's account (logging, monitoring: GKE's "Use least privilege IAM service accounts").
BUCKET_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")
IMAGE_ROLE = "roles/artifactregistry.reader"
NODE_ROLE = "roles/container.defaultNodeServiceAccount"
#: The names an earlier release declared a resource under, by its name now (`{vm}`: tpu-grpo:vmName), given to Pulumi
#: as aliases. Without one, `pulumi up` creates the resource under its new name and deletes the old one last, and
#: deleting an IAM member removes the role binding itself (tpgiamresource/resource_iam_member.go,
#: subtractFromBindings): the very grant the new name holds. tests/data/released-resources.txt lists every name a
#: release has declared; a test holds each to be declared or aliased still. The bucket and the image repository
#: outlive a VM (their ids are the store's and images.REPOSITORY), so their names no longer follow vmName: another
#: vmName would make them again (the id is taken) and delete the old names' grants, the same bindings as the new.
RENAMED = {
    "store": ("{vm}-store",),
    "store-objectAdmin": ("{vm}-store-objectAdmin", "{vm}-store-access"),
    "store-legacyBucketReader": ("{vm}-store-legacyBucketReader",),
    "images": ("{vm}-images",),
    "images-reader": ("{vm}-images-reader",),
}


#: The two components a stack declares: one VM, or a slice's cluster (tpu-grpo:slice).
HOST_COMPONENT = f"{PROJECT}:index:TpuHost"
SLICE_COMPONENT = f"{PROJECT}:index:TpuSlice"


def switched_from(settings: Settings, component: str) -> pulumi.ResourceOptions:
    """An alias under the other component, for what both declare (the network, the bucket and its grants): a
    resource's URN holds its parent's type, so a stack switched between one VM and a slice would otherwise make them
    anew under the same names (a 409) and delete the old ones, grants included (Pulumi's "Resource option: aliases":
    a parent's URN)."""
    parent = f"urn:pulumi:{pulumi.get_stack()}::{pulumi.get_project()}::{component}::{settings.vm_name}"
    return pulumi.ResourceOptions(aliases=[pulumi.Alias(parent=parent)])


def named(settings: Settings, name: str, child: pulumi.ResourceOptions, **options) -> pulumi.ResourceOptions:
    """The options of a resource declared as `name`: `child`'s, its aliases (RENAMED) and any `options` given."""
    vm = settings.vm_name
    earlier = next((olds for now, olds in RENAMED.items() if now.format(vm=vm) == name), ())
    aliases = [pulumi.Alias(name=old.format(vm=vm)) for old in earlier]
    return pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(aliases=aliases or None, **options))


def labels(settings: Settings) -> dict[str, str]:
    """tpu-grpo's two labels and the stack's own. A Pulumi stack name may hold capitals, `.` and 100 characters, a
    label's value none of them (Compute Engine's "Requirements for labels": lowercase letters, digits, `_` and `-`,
    at most 63): the stack's label is its name made one."""
    stack = re.sub(r"[^a-z0-9_-]", "-", settings.stack.lower())[:63]
    return {"app": PROJECT, "stack": stack, **settings.labels}


def declare_network(settings: Settings, child: pulumi.ResourceOptions) -> tuple:
    """The stack's network and subnetwork: the ones it names, or its own with Private Google Access."""
    if settings.network:
        return settings.network, settings.subnetwork
    net = gcp.compute.Network(
        f"{settings.vm_name}-net",
        name=f"{settings.vm_name}-net",
        auto_create_subnetworks=False,
        project=settings.project,
        opts=child,
    )
    subnet = gcp.compute.Subnetwork(
        f"{settings.vm_name}-subnet",
        name=f"{settings.vm_name}-subnet",
        network=net.id,
        region=settings.region,
        ip_cidr_range=SUBNET_RANGE,
        private_ip_google_access=True,
        project=settings.project,
        opts=child,
    )
    return net.id, subnet.id


def account_member(settings: Settings) -> pulumi.Output:
    """`serviceAccount:EMAIL` of the account the VM or the slice's nodes run as: the stack's own, or the project's
    default compute account (the provider's getDefaultServiceAccount reads it from the Compute API's project)."""
    if settings.service_account:
        return pulumi.Output.from_input(member(settings.service_account))
    return gcp.compute.get_default_service_account_output(project=settings.project).email.apply(member)


def declare_bucket(settings: Settings, child: pulumi.ResourceOptions, account: pulumi.Output) -> gcp.storage.Bucket:
    """The checkpoint store's bucket: in the stack's region (no cross-region traffic or charges),
    uniform bucket-level access (IAM only, no object ACLs), public access prevention enforced.
    Retained on delete: `pulumi destroy` (and `invoke down`) leave it and what it holds, and
    never force-destroy it. The account the machines run as gets BUCKET_ROLES on it. Its location is where it was
    first made: a bucket cannot move, and a new location would force a new bucket of the same global name (a 409),
    so a stack whose gcp:zone moves to another region keeps its bucket where it is (`invoke plan` says so)."""
    bucket = gcp.storage.Bucket(
        "store",
        name=bucket_of(settings.store),
        location=settings.home.region.upper(),  # gcp:zone's, wherever tpu-grpo:fallback found chips
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        force_destroy=False,
        labels=labels(settings),
        project=settings.project,
        opts=named(settings, "store", child, retain_on_delete=True, ignore_changes=["location"]),
    )
    for role in BUCKET_ROLES:
        name = f"store-{role.rsplit('.', 1)[-1]}"
        gcp.storage.BucketIAMMember(
            name, bucket=bucket.name, role=role, member=account, opts=named(settings, name, child)
        )
    return bucket


def member(email: str) -> str:
    return f"serviceAccount:{email}"


def access_to_grant(settings: Settings) -> list[str]:
    """What the machines' account needs and the stack cannot grant, as the commands that grant it: the bucket
    roles on a checkpoint bucket the stack does not declare."""
    if not (settings.store.name == "gs" and not settings.bucket):
        return []
    bucket, account = bucket_of(settings.store), settings.service_account or DEFAULT_ACCOUNT
    number = (
        ""
        if settings.service_account
        else f" (PROJECT_NUMBER: gcloud projects describe {settings.project} --format='value(projectNumber)')"
    )
    return [
        f"{account} needs {role} on gs://{bucket}, which this stack does not declare{number}: "
        + shlex.join(
            [
                "gcloud",
                "storage",
                "buckets",
                "add-iam-policy-binding",
                f"gs://{bucket}",
                f"--member={member(account)}",
                f"--role={role}",
            ]
        )
        for role in BUCKET_ROLES
    ]

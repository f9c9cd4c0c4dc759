"""Why Google refused to make the stack's VM or node pool, and which places that rules out for a search for chips
(issue 64's first part: the classifier; the search that uses it comes next). Each marker is quoted from a cited
source, never from memory:

- GCE-RESOURCE: Compute Engine's "Troubleshoot resource availability errors" (cloud.google.com/compute/docs/
  resource-error), the stockout codes and messages.
- GKE-POOLS: GKE's "Troubleshoot node pools" (kubernetes-engine/docs/troubleshooting/node-pools): a node pool's
  stockout and a machine type the zone does not have.
- GKE-TPU: GKE's "Troubleshoot TPUs in GKE" (kubernetes-engine/docs/troubleshooting/tpus): the quota message.
- GOOGLE-SKILLS: google/skills' gke-ai-troubleshooting-tpu-reservation-stockout: GKE's GCE_STOCKOUT.
- SKYPILOT: SkyPilot's FailoverCloudErrorHandlerV2._gcp_handler (sky/backends/cloud_vm_ray_backend.py), which
  rules out a zone on a stockout, a region on a regional quota, every place on a global quota or a permission
  error, and the zone on an error it does not know; its comments quote the TPU API's codes 8 and 9.
- RESERVATION: Compute Engine's refusals of a reservation-bound VM seen by tpu-grpo, with what to do about each
  (RESERVATION_ERRORS, which `up` explains: tpu_grpo/cloud/stack.py).
"""

from __future__ import annotations

from dataclasses import dataclass

#: What a refusal rules out: the zone tried, its whole region, the capacity tried (a reservation's trouble is the
#: reservation's, in any zone), or every place (nothing else can succeed until the user fixes it).
ZONE, REGION, CAPACITY, EVERYWHERE = "zone", "region", "capacity", "everywhere"


@dataclass(frozen=True)
class Marker:
    kind: str  # stockout, quota, reservation, permission, invalid
    rules_out: str
    text: str  # found in Google's message as it is
    source: str  # one of the module docstring's names


@dataclass(frozen=True)
class Refusal:
    """One refusal, classified: its kind, what it rules out, and the message of Google's that said it."""

    kind: str  # a Marker's kinds, or "unknown"
    rules_out: str
    message: str


#: Compute Engine's refusals of a reservation-bound VM, and what to do about each.
RESERVATION_ERRORS = (
    (
        "does not have sufficient capacity",
        "the reservation has no free chips: another VM already uses them, or it reserves fewer "
        "than this machine type has (gcloud compute reservations describe RESERVATION --zone ZONE)",
    ),
    (
        "is incorrect for the requested resources",
        "the reservation is for another machine type or zone: match tpu-grpo:machineType and gcp:zone to it",
    ),
    (
        "Could not find the given reservation",
        "no reservation of that name in this project and zone: check tpu-grpo:reservation and gcp:zone "
        "(gcloud compute reservations list)",
    ),
    (
        "requires reservation to be in READY state",
        "the reservation is not active yet (a calendar-mode reservation starts at its start time): "
        "run `invoke up` again once it is READY",
    ),
    (
        "must exist in the same project as the instance",
        "the reservation belongs to another project: set gcp:project to the reservation's project",
    ),
    (
        "specificReservationRequired",
        "the reservation was not created with specificReservationRequired (--require-specific-reservation): "
        "only such a reservation can be named by a VM; create it so, or ask its owner to",
    ),
)

MARKERS = (
    Marker("stockout", ZONE, "ZONE_RESOURCE_POOL_EXHAUSTED", "GCE-RESOURCE"),  # and ..._WITH_DETAILS
    Marker("stockout", ZONE, "does not have enough resources available to fulfill the request", "GCE-RESOURCE"),
    Marker("stockout", ZONE, "is currently unavailable in the", "GCE-RESOURCE"),
    Marker("stockout", ZONE, "resource pool exhausted", "GKE-POOLS"),
    Marker("stockout", ZONE, "GCE_STOCKOUT", "GOOGLE-SKILLS"),
    Marker("stockout", ZONE, "insufficientCapacity", "SKYPILOT"),
    Marker("stockout", ZONE, "There is no more capacity in the zone", "SKYPILOT"),  # the TPU API's code 8
    Marker("reservation", CAPACITY, "Insufficient reserved capacity", "SKYPILOT"),  # the TPU API's code 9
    *(Marker("reservation", CAPACITY, text, "RESERVATION") for text, _ in RESERVATION_ERRORS),
    Marker("quota", EVERYWHERE, "_ALL_REGIONS' exceeded", "SKYPILOT"),  # a global quota: no region has room
    Marker("quota", ZONE, "PerProjectPerZone", "SKYPILOT"),  # a TPU quota of one zone, by its name
    Marker("quota", REGION, "QUOTA_EXCEEDED", "SKYPILOT"),
    Marker("quota", REGION, "' exceeded.  Limit:", "SKYPILOT"),
    Marker("quota", REGION, "' exhausted. Limit", "SKYPILOT"),
    Marker("quota", REGION, "quotaExceeded", "SKYPILOT"),
    Marker("quota", REGION, "Insufficient quota to satisfy the request", "GKE-TPU"),
    Marker("permission", EVERYWHERE, "IAM_PERMISSION_DENIED", "SKYPILOT"),
    Marker("permission", EVERYWHERE, "Policy update access denied.", "SKYPILOT"),
    Marker("permission", ZONE, "is not found or access is unauthorized", "SKYPILOT"),  # a location not open to you
    Marker("invalid", ZONE, "does not exist in zone", "GKE-POOLS"),  # a machine type that zone has not
    Marker("invalid", EVERYWHERE, "Requested disk size cannot be smaller than the image size", "SKYPILOT"),
)


def classify(message: str) -> Refusal:
    """The first marker found in `message`, in MARKERS' order (a global quota before a regional one); a message no
    marker knows rules out its zone, as SkyPilot does with an error it cannot parse."""
    for marker in MARKERS:
        if marker.text in message:
            return Refusal(marker.kind, marker.rules_out, message)
    return Refusal("unknown", ZONE, message)

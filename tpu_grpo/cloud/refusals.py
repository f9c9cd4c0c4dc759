"""Why Google refused to make the stack's VM or node pool, and which places that rules out for a search for chips
(tpu_grpo/cloud/search.py tries the stack's places with it). Each marker is quoted from a cited
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
  (RESERVATION_ERRORS).
- PULUMI-ENGINE: the engine's refusal to delete or replace a protected resource (pkg/resource/deploy/
  step_generator.go: "unable to replace resource %q\nas it is currently marked for protection"; step.go's
  DeleteStep: "unable to delete resource %q\nas it is currently marked for protection").

A marker with a `fix` is also what a failed `up` explains (tpu_grpo/cloud/stack.py's explain): one list of Google's and
Pulumi's words, read by the search and by `up` alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: What a refusal rules out: the zone tried (a reservation's trouble too: a reservation is zonal), its whole region,
#: the capacity tried (a reservation of another project, in any zone), or every place (nothing else can succeed until
#: the user fixes it).
ZONE, REGION, CAPACITY, EVERYWHERE = "zone", "region", "capacity", "everywhere"
#: The kinds of refusal, and what each means in plain words.
STOCKOUT, QUOTA, RESERVATION, PERMISSION, INVALID, UNKNOWN = (
    "stockout",
    "quota",
    "reservation",
    "permission",
    "invalid",
    "unknown",
)
MEANINGS = {
    STOCKOUT: "no chips there now",
    QUOTA: "a quota of the project is too low",
    RESERVATION: "the reservation cannot give them",
    PERMISSION: "not allowed",
    INVALID: "this machine cannot be had there",
    UNKNOWN: "failed",
}


@dataclass(frozen=True)
class Marker:
    kind: str  # stockout, quota, reservation, permission, invalid
    rules_out: str
    text: str  # found in Google's message as it is
    source: str  # one of the module docstring's names
    fix: str = ""  # what a failed `up` says to do about it, where the kind alone does not say


@dataclass(frozen=True)
class Refusal:
    """One refusal, classified: its kind, what it rules out, and the message of Google's that said it."""

    kind: str  # a Marker's kinds, or "unknown"
    rules_out: str
    message: str
    marker: str = ""  # the words of Google's that classified it
    fix: str = ""  # its marker's

    @property
    def said(self) -> str:
        """What to quote of it in one line: its marker when that is a code (ZONE_RESOURCE_POOL_EXHAUSTED), else
        Google's message without the provider's `creating Instance: googleapi: Error 403: `, cut short."""
        if self.marker.replace("_", "").isalnum():
            return self.marker
        quota = re.search(r"Quota '(\w+)'", self.message)
        if quota:  # the metric, which says which quota to raise
            return f"quota {quota[1]}"
        lines = self.message.strip().splitlines()
        text = re.split(r"Error \d+: ", lines[-1])[-1] if lines else "no error message"
        inner = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', text)
        if text.lstrip().startswith("{") and inner:  # an API's error as JSON: its message, not the blob
            text = inner[1]
        return text if len(text) <= 160 else text[:160].rsplit(" ", 1)[0] + " …"  # cut between words


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

#: What to do about any of the quota markers.
QUOTA_FIX = "a project quota is too low for this VM or its disks: raise it under IAM & Admin > Quotas"
#: Pulumi's engine refusing to lose what tpu-grpo protects (PULUMI-ENGINE), and what to do.
PROTECTED = "as it is currently marked for protection"
PROTECTED_FIX = (
    "the update would delete or replace what tpu-grpo protects (the data disk, or a moved disk's snapshot while it is "
    "the only copy) and none of its checks released it, so Pulumi's engine refused: undo the change to the stack "
    "file, or fetch the runs the disk holds (`uv run invoke fetch`) and run `uv run invoke up` again, which releases "
    "the disk once nothing is only on it"
)

MARKERS = (
    Marker(STOCKOUT, ZONE, "ZONE_RESOURCE_POOL_EXHAUSTED", "GCE-RESOURCE"),  # and ..._WITH_DETAILS
    Marker(STOCKOUT, ZONE, "does not have enough resources available to fulfill the request", "GCE-RESOURCE"),
    Marker(STOCKOUT, ZONE, "is currently unavailable in the", "GCE-RESOURCE"),
    Marker(STOCKOUT, ZONE, "resource pool exhausted", "GKE-POOLS"),
    Marker(STOCKOUT, ZONE, "GCE_STOCKOUT", "GOOGLE-SKILLS"),
    Marker(STOCKOUT, ZONE, "insufficientCapacity", "SKYPILOT"),
    Marker(STOCKOUT, ZONE, "There is no more capacity in the zone", "SKYPILOT"),  # the TPU API's code 8
    # a reservation is zonal: its trouble rules out that reservation in that zone, where the same name may exist in
    # another (Compute Engine's "Reservations of Compute Engine zonal resources"); but another project's is so anywhere
    Marker(RESERVATION, ZONE, "Insufficient reserved capacity", "SKYPILOT"),  # the TPU API's code 9
    *(
        Marker(RESERVATION, CAPACITY if "same project" in text else ZONE, text, "RESERVATION", fix)
        for text, fix in RESERVATION_ERRORS
    ),
    Marker(QUOTA, EVERYWHERE, "_ALL_REGIONS' exceeded", "SKYPILOT", QUOTA_FIX),  # a global quota: no region has room
    Marker(QUOTA, ZONE, "PerProjectPerZone", "SKYPILOT", QUOTA_FIX),  # a TPU quota of one zone, by its name
    Marker(QUOTA, REGION, "QUOTA_EXCEEDED", "SKYPILOT", QUOTA_FIX),
    Marker(QUOTA, REGION, "' exceeded.  Limit:", "SKYPILOT", QUOTA_FIX),
    Marker(QUOTA, REGION, "' exhausted. Limit", "SKYPILOT", QUOTA_FIX),
    Marker(QUOTA, REGION, "quotaExceeded", "SKYPILOT", QUOTA_FIX),
    Marker(QUOTA, REGION, "Insufficient quota to satisfy the request", "GKE-TPU", QUOTA_FIX),
    Marker(PERMISSION, EVERYWHERE, "IAM_PERMISSION_DENIED", "SKYPILOT"),
    Marker(PERMISSION, EVERYWHERE, "Policy update access denied.", "SKYPILOT"),
    Marker(PERMISSION, ZONE, "is not found or access is unauthorized", "SKYPILOT"),  # a location not open to you
    Marker(INVALID, ZONE, "does not exist in zone", "GKE-POOLS"),  # a machine type that zone has not
    Marker(INVALID, EVERYWHERE, "Requested disk size cannot be smaller than the image size", "SKYPILOT"),
    # not Google's: nothing in another place would differ, as for any error no marker knows
    Marker(UNKNOWN, EVERYWHERE, PROTECTED, "PULUMI-ENGINE", PROTECTED_FIX),
)


def classify(message: str) -> Refusal:
    """The first marker found in `message`, in MARKERS' order (a global quota before a regional one). A message no
    marker knows rules out every place, where SkyPilot rules out only its zone: SkyPilot's provisioner makes one VM,
    while an `up` runs the whole program (a setting the provider refuses, a program error, a lost network, an update
    declined), which would fail again in each place, making or moving resources each time."""
    flat = " ".join(message.split())  # Google's pages quote "exceeded.  Limit:" with one space or two
    for marker in MARKERS:
        if " ".join(marker.text.split()) in flat:
            return Refusal(marker.kind, marker.rules_out, message, marker.text, marker.fix)
    return Refusal(UNKNOWN, EVERYWHERE, message)

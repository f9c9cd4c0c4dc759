"""Google's refusals, classified by what they rule out for a search for chips (tpu_grpo/cloud/refusals.py). Every
message here is quoted from the source its marker names, with only its placeholders filled in."""

from __future__ import annotations

import pytest

from tpu_grpo.cloud import refusals

CASES = [
    # Compute Engine's "Troubleshoot resource availability errors"
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "stockout", "zone"),
    ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "stockout", "zone"),
    (
        "The zone 'projects/grpo-lab-123/zones/us-east5-b' does not have enough resources available to fulfill the "
        "request. Try a different zone, or try again later.",
        "stockout",
        "zone",
    ),
    (
        "A ct6e-standard-8t VM instance with 8 TPU v6e is currently unavailable in the us-east5-b zone. Capacity "
        "changes frequently, so try your request in a different zone, with a different VM hardware configuration, or "
        "at a later time. For more options, see troubleshooting documentation.",
        "stockout",
        "zone",
    ),
    # GKE's "Troubleshoot node pools"
    ("resource pool exhausted", "stockout", "zone"),
    ("Machine type with name 'ct6e-standard-4t' does not exist in zone 'us-central1-f'", "invalid", "zone"),
    # GKE's "Troubleshoot TPUs in GKE"; google/skills' GKE TPU stockout page
    ("Insufficient quota to satisfy the request", "quota", "region"),
    ("GCE_STOCKOUT", "stockout", "zone"),
    # SkyPilot's _gcp_handler and the examples in its comments
    ("Quota 'CPUS' exceeded.  Limit: 24.0 in region us-west1.", "quota", "region"),
    ("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 1.0 globally.", "quota", "everywhere"),
    (
        "Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in region europe-west4",
        "quota",
        "region",
    ),
    (
        "Quota 'TPUV2sPreemptiblePodPerProjectPerZoneForTPUAPI' exhausted. Limit 32 in zone europe-west4-a",
        "quota",
        "zone",
    ),
    (
        'There is no more capacity in the zone "europe-west4-a"; you can try in another zone where Cloud TPU Nodes '
        "are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1bc8f9d790be9142]",
        "stockout",
        "zone",
    ),
    (
        "Insufficient reserved capacity. Contact customer support to increase your reservation. "
        "[EID: 0x2f8bc266e74261a]",
        "reservation",
        "zone",  # a reservation is zonal: the same name may hold chips in another zone
    ),
    # Compute Engine's refusals of a reservation-bound VM (RESERVATION)
    ("Could not find the given reservation", "reservation", "zone"),
    ("must exist in the same project as the instance", "reservation", "capacity"),
    # SkyPilot's quota line above as some of Google's pages quote it, with one space before "Limit"
    ("Quota 'CPUS' exceeded. Limit: 24.0 in region us-west1.", "quota", "region"),
    ("Location us-east1-d is not found or access is unauthorized.", "permission", "zone"),
    ("Policy update access denied.", "permission", "everywhere"),
    ("Requested disk size cannot be smaller than the image size", "invalid", "everywhere"),
]


@pytest.mark.parametrize("message, kind, rules_out", CASES, ids=[case[0][:40] for case in CASES])
def test_each_cited_refusal_is_classified_by_what_it_rules_out(message, kind, rules_out):
    found = refusals.classify(f"error: creating Instance: googleapi: Error 503: {message}")
    assert (found.kind, found.rules_out) == (kind, rules_out)
    assert message in found.message


def test_a_refusal_no_marker_knows_ends_the_search():
    """SkyPilot blocks only the zone of an error it cannot parse; an `up` that fails for a reason no marker knows
    (the program, a setting, the network) would fail in each place, so the search stops (refusals.classify)."""
    assert refusals.classify("error: something new").rules_out == refusals.EVERYWHERE
    assert refusals.classify("").kind == "unknown"


def test_every_marker_names_a_source_the_module_cites():
    cited = refusals.__doc__ or ""
    assert all(f"- {marker.source}:" in cited for marker in refusals.MARKERS)
    # a reservation is zonal: its refusals rule out that zone, but one of another project rules out the capacity
    assert {marker.text: marker.rules_out for marker in refusals.MARKERS if marker.rules_out == refusals.CAPACITY} == {
        "must exist in the same project as the instance": refusals.CAPACITY
    }


@pytest.mark.parametrize(
    "message, said",
    [
        (  # an API's error as JSON (googleapi's body when it has no parsed form): its message
            'error: creating Instance: googleapi: Error 400: {"error": {"code": 400, "message": "Invalid value for '
            'field \'resource.machineType\'.", "status": "INVALID_ARGUMENT"}}',
            "Invalid value for field 'resource.machineType'.",
        ),
        ("error: " + "word " * 60, ("error: " + "word " * 30).strip() + " …"),  # cut between words, never mid-word
        ("Quota 'CPUS' exceeded.  Limit: 24.0 in region us-west1.", "quota CPUS"),  # the metric to raise
        ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED"),  # a code is said as is
    ],
)
def test_a_refusal_is_said_in_a_few_words_of_googles(message, said):
    assert refusals.classify(message).said == said

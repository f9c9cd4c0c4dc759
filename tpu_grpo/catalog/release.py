"""The MaxText release tpu-grpo runs, in one place: the one VM's playbook installs its spec, the slice's image
is built from that spec and tagged with its version, and the pipeline's preflight refuses a host with another.

Pathways' server and proxy images are built for a JAX version: Google's "Introduction to Pathways on Cloud" names
them `pathways/server:jax-<jax-version>` and `pathways/proxy_server:jax-<jax-version>`, and a PathwaysJob's
`pathwaysVersion` is that JAX version. MaxText 0.2.3's tpu-post-train extra asks for jax>=0.10.1
(src/dependencies/requirements/generated_requirements/tpu-post-train-requirements.txt at the maxtext-v0.2.3 tag), and
the slice's image pins JAX_VERSION, so the images are Google's for that JAX. MaxText's own CI at that tag
(.github/workflows/run_pathways_tests.yml) pins `server:20260413-jax_0.9.2` while it installs the client with
`--resolution=lowest` (jax 0.10.0): no source says how closely the two must match, so tpu-grpo takes Google's rule.
"""

from __future__ import annotations

import re

MAXTEXT_VERSION = "0.2.3"
MAXTEXT_SPEC = f"maxtext[tpu-post-train]=={MAXTEXT_VERSION}"
JAX_VERSION = "0.10.1"
PATHWAYS_TAG = f"jax-{JAX_VERSION}"
#: JobSet, which a slice's cluster runs its steps with, and its Helm chart (JobSet's README: `helm install jobset
#: oci://registry.k8s.io/jobset/charts/jobset --version $VERSION --create-namespace --namespace=jobset-system`).
JOBSET_VERSION = "0.10.1"
JOBSET_CHART = "oci://registry.k8s.io/jobset/charts/jobset"
JOBSET_NAMESPACE = "jobset-system"
#: The namespace a slice's jobs run in, and the service account a slice's pipeline driver runs as (a Job on the CPU pool
#: that creates each step's JobSet in turn: tpu_grpo/host/remote/chain.py), with what its Role lets it do.
JOBS_NAMESPACE = "default"
PIPELINE_ACCOUNT = "tpu-grpo-pipeline"
PIPELINE_RULES = (
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
)
_SPEC = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==(?P<version>\S+)")


def other_maxtext(spec: str) -> str | None:
    """The version a requirement pins MaxText to when it is not this release's, else None. A requirement of
    another distribution (a wheel of your own standing in for MaxText) is taken as it is."""
    match = _SPEC.fullmatch(spec)
    if not match or re.sub(r"[-_.]+", "-", match["name"]).lower() != "maxtext":
        return None
    return None if match["version"] == MAXTEXT_VERSION else match["version"]

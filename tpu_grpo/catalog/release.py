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

import difflib
import re
from pathlib import Path

MAXTEXT_VERSION = "0.2.3"
MAXTEXT_SPEC = f"maxtext[tpu-post-train]=={MAXTEXT_VERSION}"
#: Every key MaxText's config takes on a command line (`learning_rate`, `rl.num_generations`): its pyconfig refuses
#: any other when the job starts. tests/maxtext/config_keys.py writes the list from the installed package, and the
#: real-MaxText tier holds it to that package.
MAXTEXT_KEYS = frozenset(
    line
    for line in (Path(__file__).parent / "maxtext_keys.txt").read_text().splitlines()
    if line and not line.startswith("#")
)
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


def nearest_key(key: str) -> str | None:
    """The MaxText key a mistyped one most likely meant: the same but for case, else the closest spelling."""
    same = [known for known in sorted(MAXTEXT_KEYS) if known.lower() == key.lower()]
    close = same or difflib.get_close_matches(key, sorted(MAXTEXT_KEYS), n=1)
    return close[0] if close else None

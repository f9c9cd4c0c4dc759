"""JobSet, the Kubernetes API a slice's jobs run as: its pinned release, and the manifests tpu-grpo
renders for it."""

from __future__ import annotations

#: JobSet's release and its Helm chart (JobSet's README: `helm install jobset
#: oci://registry.k8s.io/jobset/charts/jobset --version $VERSION --create-namespace --namespace=jobset-system`).
JOBSET_VERSION = "0.10.1"
JOBSET_CHART = "oci://registry.k8s.io/jobset/charts/jobset"
JOBSET_NAMESPACE = "jobset-system"
API_VERSION = "jobset.x-k8s.io/v1alpha2"

"""A GKE cluster's kubeconfig, as the cluster's Pulumi outputs and the tasks both make it: the endpoint, its CA,
and GKE's credential plugin. Plain data, so the Pulumi program and `invoke up`'s checks need no Kubernetes client."""

from __future__ import annotations

import yaml

AUTH_PLUGIN = "gke-gcloud-auth-plugin"


def kubeconfig(cluster: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig for the cluster at `endpoint` (its CA as GKE gives it, base64 PEM)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": cluster,
            "preferences": {},
            "clusters": [
                {
                    "name": cluster,
                    "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca_certificate},
                }
            ],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
            "users": [
                {
                    "name": cluster,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": AUTH_PLUGIN,
                            "provideClusterInfo": True,
                            "installHint": f"gcloud components install {AUTH_PLUGIN} (or apt-get install "
                            f"google-cloud-cli-{AUTH_PLUGIN})",
                        }
                    },
                }
            ],
        },
        sort_keys=False,
    )

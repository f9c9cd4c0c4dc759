"""The container images a multi-host slice runs: the MaxText post-training image `invoke image`
builds into the stack's Artifact Registry repository, tagged by MaxText version, and Pathways'
own images, pinned by tag (never `latest`, which xpk defaults to).

Pathways' server and proxy must speak the JAX version of the trainer that connects to them:
MaxText 0.2.3's tpu-post-train extra asks for jax>=0.10.1, so the image pins JAX_VERSION and the
Pathways images are the ones built for it (the tag MaxText's own RL workflows use with 0.10.1).
"""

from __future__ import annotations

MAXTEXT_VERSION = "0.2.3"
JAX_VERSION = "0.10.1"
#: The Artifact Registry repository the stack declares (its id) and the image in it.
REPOSITORY = "tpu-grpo"
POST_TRAINING = "maxtext-post-training"
PATHWAYS_TAG = f"20260623-jax_{JAX_VERSION}"
PATHWAYS_SERVER = f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:{PATHWAYS_TAG}"
PATHWAYS_PROXY = f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:{PATHWAYS_TAG}"


def repository_url(project: str, region: str) -> str:
    return f"{region}-docker.pkg.dev/{project}/{REPOSITORY}"


def post_training_image(project: str, region: str) -> str:
    """The image every slice job runs: MaxText with its post-training extra, tagged by MaxText version."""
    return f"{repository_url(project, region)}/{POST_TRAINING}:{MAXTEXT_VERSION}"

"""The container images a multi-host slice runs: the MaxText post-training image `invoke image`
builds into the stack's Artifact Registry repository, tagged by MaxText version, and Pathways'
own images, pinned by tag (never `latest`, which xpk defaults to) for the release's JAX
(tpu_grpo/catalog/release.py).
"""

from __future__ import annotations

from tpu_grpo.catalog import release

#: The Artifact Registry repository the stack declares (its id) and the image in it.
REPOSITORY = "tpu-grpo"
POST_TRAINING = "maxtext-post-training"
PATHWAYS_SERVER = f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:{release.PATHWAYS_TAG}"
PATHWAYS_PROXY = f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:{release.PATHWAYS_TAG}"


def repository_url(project: str, region: str) -> str:
    return f"{region}-docker.pkg.dev/{project}/{REPOSITORY}"


def post_training_image(project: str, region: str) -> str:
    """The image every slice job runs: MaxText with its post-training extra, tagged by MaxText version."""
    return f"{repository_url(project, region)}/{POST_TRAINING}:{release.MAXTEXT_VERSION}"

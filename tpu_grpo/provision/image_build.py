"""`invoke image`: the post-training image a slice's pods run, built and pushed into the stack's
Artifact Registry repository, tagged by MaxText version, with a local Docker when there is one (and
its daemon answers), else with Cloud Build.

MaxText documents `build_maxtext_docker_image WORKFLOW=post-training` from a MaxText checkout; this
image installs the same release the one VM's playbook does (playbooks/host.yml: uv, the pinned
`maxtext_spec` with `--resolution=lowest`, then `install_tpu_post_train_extra_deps`), so both paths
run the same MaxText, with JAX pinned to what the Pathways images are built for (tpu_grpo/catalog/release.py).
Once pushed, the image is recorded in a ConfigMap of the cluster, and a slice's jobs refuse to start
until it names the image they run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tpu_grpo.catalog import images, release
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.settings import Settings
from tpu_grpo.provision import playbook

BUILDERS = ("auto", "docker", "cloud-build")
BASE_IMAGE = "python:3.12-slim-bookworm"  # MaxText's own Dockerfile starts from python:3.12-slim


class ImageError(UserError):
    exit_code = 1


def dockerfile() -> str:
    defaults = {name: var.default for name, var in playbook.load().vars.items()}
    return "\n".join(
        [
            f"FROM {BASE_IMAGE}",
            "RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates "
            "&& rm -rf /var/lib/apt/lists/*",
            f"RUN pip install --no-cache-dir uv=={defaults['uv_version']}",
            "ENV VIRTUAL_ENV=/opt/maxtext_venv PATH=/opt/maxtext_venv/bin:$PATH PYTHONUNBUFFERED=1",
            f'RUN uv venv $VIRTUAL_ENV && UV_TORCH_BACKEND=cpu uv pip install "{release.MAXTEXT_SPEC}" '
            f"jax=={release.JAX_VERSION} jaxlib=={release.JAX_VERSION} --resolution=lowest",
            "RUN install_tpu_post_train_extra_deps",
            "",
        ]
    )


def check_builder(builder: str) -> None:
    if builder not in BUILDERS:
        raise UserError(f"--builder {builder!r} is not a builder; fix: one of {', '.join(BUILDERS)}")


def choose(builder: str) -> str:
    """The builder asked for (checked by check_builder), or (auto) a local Docker whose daemon answers, else
    Cloud Build; refused when the one asked for cannot run here."""
    docker_ready = (
        bool(shutil.which("docker"))
        and subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    )
    if builder == "docker" and not docker_ready:
        raise UserError(
            "--builder docker, but no Docker daemon answers `docker info`; fix: start Docker, or --builder cloud-build"
        )
    chosen = builder if builder != "auto" else ("docker" if docker_ready else "cloud-build")
    if chosen == "cloud-build" and not shutil.which("gcloud"):
        raise UserError(
            "no Docker daemon here and no gcloud for Cloud Build; fix: install Docker, or the Google "
            "Cloud CLI (cloud.google.com/sdk)"
        )
    if chosen == "cloud-build" and not gcloud_logged_in():
        raise UserError(
            "Cloud Build needs a gcloud login, and gcloud has none (no credentials.db in its "
            "configuration folder); fix: gcloud auth login (or start Docker: --builder docker)"
        )
    return chosen


def gcloud_logged_in() -> bool:
    """Whether gcloud has credentials to run `gcloud builds submit` with, read from its files as the Google Cloud
    CLI keeps them (`credentials.db` in $CLOUDSDK_CONFIG or ~/.config/gcloud, or a credential file or token it is
    pointed at), without running gcloud, which would write its configuration folder."""
    if os.environ.get("CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE") or os.environ.get("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"):
        return True
    folder = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    return (folder / "credentials.db").is_file()


def commands(settings: Settings, builder: str, context: str) -> list[list[str]]:
    image = images.post_training_image(settings.project, settings.region)
    if builder == "docker":
        return [["docker", "build", "--platform=linux/amd64", "-t", image, context], ["docker", "push", image]]
    return [
        [
            "gcloud",
            "builds",
            "submit",
            f"--project={settings.project}",
            f"--region={settings.region}",
            f"--tag={image}",
            "--machine-type=e2-highcpu-32",
            "--timeout=3600s",
            context,
        ]
    ]


def build(settings: Settings, builder: str, say=print) -> str:
    """Build and push the image; returns its name. Each command's output goes to the terminal as it comes."""
    image = images.post_training_image(settings.project, settings.region)
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-image-") as context:
        (Path(context) / "Dockerfile").write_text(dockerfile())
        for command in commands(settings, builder, context):
            say(f"$ {' '.join(command)}")
            if subprocess.run(command).returncode:
                fix = (
                    f"gcloud auth configure-docker {settings.region}-docker.pkg.dev (then run this again)"
                    if command[:2] == ["docker", "push"]
                    else "read the output above"
                )
                raise ImageError(f"`{' '.join(command[:3])}` failed building {image}; fix: {fix}")
    return image

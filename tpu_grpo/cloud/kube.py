"""The laptop's side of a multi-host slice: the GKE cluster's Kubernetes API, through the official
Python client. Objects travel as the API's own JSON (plain dicts), as `kubectl get -o json` shows
them."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from tpu_grpo.catalog.release import JOBS_NAMESPACE, PIPELINE_ACCOUNT
from tpu_grpo.cloud.jobset import API_VERSION, RUN_LABEL, TOKEN_KEY, TOKEN_SECRET
from tpu_grpo.config.errors import UserError
from tpu_grpo.config.kubeconfig import kubeconfig

#: GKE's credential plugin (gcloud's gke-gcloud-auth-plugin component), as `gcloud container clusters
#: get-credentials` writes it: the kubeconfig holds no token.
#: A kubeconfig to use instead of the one made from the stack's outputs (a cluster reached another way).
KUBECONFIG_ENV = "TPU_GRPO_KUBECONFIG"
NAMESPACE = JOBS_NAMESPACE
GROUP, VERSION = API_VERSION.split("/")
PLURAL = "jobsets"
#: The ConfigMap in which `invoke image` records the image it pushed.
IMAGE_RECORD = "tpu-grpo-image"


class ClusterError(UserError):
    """The cluster refused or could not be reached; one line with the fix."""

    exit_code = 1


def _stack_kubeconfig(stack: str) -> dict:
    from tpu_grpo.cloud.stack import outputs, require_cli

    require_cli()
    made = outputs(stack)
    if not made.get("endpoint"):
        raise ClusterError(f"stack '{stack}' has no cluster (no endpoint output); fix: uv run invoke up")
    return yaml.safe_load(kubeconfig(made["name"], made["endpoint"], made["cluster_ca_certificate"]))


class KubeconfigError(UserError):
    """$TPU_GRPO_KUBECONFIG names no kubeconfig the client can use: bad input, nothing done (exit 2)."""


#: What a refused $TPU_GRPO_KUBECONFIG's line ends with.
KUBECONFIG_FIX = f"fix: point {KUBECONFIG_ENV} at a kubeconfig (kubectl config view --raw > FILE), or unset it"


def given_kubeconfig(path: str) -> dict:
    """The kubeconfig $TPU_GRPO_KUBECONFIG names, checked as the Kubernetes client reads one: a YAML mapping whose
    current context names a cluster with a server."""
    fix = KUBECONFIG_FIX
    said = f"{KUBECONFIG_ENV}={path!r}"
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise KubeconfigError(f"{said} cannot be read ({error.__class__.__name__}); {fix}") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise KubeconfigError(f"{said} is not YAML{line}; {fix}") from None
    except RecursionError:
        raise KubeconfigError(f"{said} is nested too deep to be a kubeconfig; {fix}") from None
    if not isinstance(config, dict):
        raise KubeconfigError(f"{said} is not a kubeconfig (no mapping of clusters, contexts, users); {fix}")
    contexts, clusters = _by_name(config.get("contexts"), "context"), _by_name(config.get("clusters"), "cluster")
    context = contexts.get(_text(config.get("current-context")))
    cluster = clusters.get(_text(context.get("cluster"))) if isinstance(context, dict) else None
    if not isinstance(cluster, dict) or not _text(cluster.get("server")):
        raise KubeconfigError(
            f"{said} has no current context naming a cluster with a server "
            f"({len(clusters)} clusters, current-context {config.get('current-context')!r}); {fix}"
        )
    return config


def _by_name(entries: object, part: str) -> dict[str, object]:
    """A kubeconfig's list of named entries (contexts, clusters) as name -> its `part`: an entry that is no mapping
    named by text (`contexts: 5`, `name: [a]`) names nothing, as the client finds nothing by it."""
    if not isinstance(entries, list):
        return {}
    return {entry["name"]: entry.get(part) for entry in entries if isinstance(entry, dict) and _text(entry.get("name"))}


def _text(value: object) -> str:
    """A kubeconfig's name or server, or '' when it is not text (a list, a number): no name the client looks up."""
    return value if isinstance(value, str) else ""


class Cluster:
    """The JobSets, the pipelines' driver Jobs, pods, logs and the token Secret of one namespace."""

    def __init__(self, config: dict, namespace: str = NAMESPACE):
        from kubernetes import client
        from kubernetes.config import new_client_from_config_dict

        self.api = new_client_from_config_dict(config)
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.namespace = namespace
        self.server = self.api.configuration.host

    @classmethod
    def of_stack(cls, stack: str) -> Cluster:
        from kubernetes.config import ConfigException

        path = os.environ.get(KUBECONFIG_ENV)
        if not path:
            return cls(_stack_kubeconfig(stack))
        try:  # the client's own reading: a file it names that is not there, a part of another type (`users: 5`)
            return cls(given_kubeconfig(path))
        except (ConfigException, TypeError, AttributeError, ValueError, KeyError) as error:
            raise KubeconfigError(
                f"{KUBECONFIG_ENV}={path!r} is refused by the Kubernetes client ({error.__class__.__name__}: "
                f"{error}); {KUBECONFIG_FIX}"
            ) from None

    def _request(
        self,
        method,
        *args,
        what: str | None = None,
        absent: tuple[int, ...] = (404,),
        refused: dict[int, str] | None = None,
        fix: str = "check the cluster (kubectl get jobsets, pods)",
        **kwargs,
    ):
        """One API call's raw response; None when its status is in `absent`; else a ClusterError: the line
        `refused` has for the status, or one naming `what` (default: the call) and `fix`."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return method(*args, _preload_content=False, **kwargs)
        except ApiException as error:
            if error.status in absent:
                return None
            raise ClusterError(
                (refused or {}).get(error.status)
                or (
                    f"the cluster at {self.server} refused {what or method.__name__} ({error.status} "
                    f"{_reason(error.body)}); fix: {fix}"
                )
            ) from None
        except HTTPError as error:
            raise ClusterError(
                f"the cluster at {self.server} cannot be reached ({type(error).__name__}); fix: "
                "check that the stack is up (uv run invoke up) and your network"
            ) from None

    def _call(self, method, *args, **kwargs):
        """One API call, its JSON body as a dict, or None (see _request)."""
        response = self._request(method, *args, **kwargs)
        return None if response is None else json.loads(response.data or b"{}")

    # -- JobSets
    def create(self, manifest: dict) -> dict:
        name = manifest["metadata"]["name"]
        return self._call(
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            manifest,
            what=f"job {name}",
            absent=(),
            refused={
                409: f"job {name} exists already on the cluster; fix: wait for it (uv run invoke "
                f"status) or cancel it (uv run invoke cancel {name})"
            },
            fix=f"check JobSet {VERSION} is installed (uv run invoke up)",
        )

    def jobset(self, name: str) -> dict | None:
        return self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name)

    def jobsets(self) -> list[dict]:
        listed = self._call(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, label_selector=RUN_LABEL
        )
        return sorted((listed or {}).get("items", []), key=lambda item: item["metadata"].get("creationTimestamp", ""))

    def delete(self, name: str) -> bool:
        """Delete a JobSet and (in the foreground) its jobs and pods; False when there was none."""
        return (
            self._call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                propagation_policy="Foreground",
            )
            is not None
        )

    # -- pods and logs
    def pods(self, jobset_name: str) -> list[dict]:
        listed = self._call(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset_name}",
        )
        return (listed or {}).get("items", [])

    def log(self, pod: str, container: str, follow: bool = False) -> Iterator[bytes]:
        """A container's log, as the kubelet hands it over (followed to the container's end)."""
        from urllib3.exceptions import HTTPError

        response = self._request(
            self.core.read_namespaced_pod_log,
            pod,
            self.namespace,
            container=container,
            follow=follow,
            what=f"the log of {pod}",
            absent=(400, 404),  # not started, or gone
            fix="uv run invoke status",
        )
        if response is None:
            return
        try:
            yield from response.stream(64 * 1024)
        except HTTPError as error:
            raise ClusterError(
                f"the log of {pod} broke off ({type(error).__name__}); fix: uv run invoke logs "
                "--follow (the job goes on)"
            ) from None
        finally:
            response.release_conn()

    # -- a pipeline's driver: a Job, its ConfigMap, its service account
    def has_pipeline_account(self) -> bool:
        return self._call(self.core.read_namespaced_service_account, PIPELINE_ACCOUNT, self.namespace) is not None

    def driver(self, name: str) -> dict | None:
        return self._call(self.batch.read_namespaced_job, name, self.namespace)

    def drivers(self) -> list[dict]:
        """tpu-grpo's pipeline drivers (Jobs with its run label), oldest first."""
        listed = self._call(self.batch.list_namespaced_job, self.namespace, label_selector=RUN_LABEL)
        return sorted((listed or {}).get("items", []), key=lambda item: item["metadata"].get("creationTimestamp", ""))

    def driver_pods(self, name: str) -> list[dict]:
        listed = self._call(
            self.core.list_namespaced_pod, self.namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
        )
        return (listed or {}).get("items", [])

    def start_driver(self, manifest: dict, files: dict[str, str]) -> None:
        """The driver's ConfigMap of `files` (its program and data, replaced when there), then its Job."""
        name = manifest["metadata"]["name"]
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": manifest["metadata"]["labels"]},
            "data": files,
        }
        if self._call(self.core.read_namespaced_config_map, name, self.namespace) is None:
            self._call(self.core.create_namespaced_config_map, self.namespace, body)
        else:
            self._call(self.core.replace_namespaced_config_map, name, self.namespace, body)
        self._call(
            self.batch.create_namespaced_job,
            self.namespace,
            manifest,
            what=f"job {name}",
            absent=(),
            refused={409: f"job {name} exists already on the cluster; fix: uv run invoke status"},
        )

    def delete_driver(self, name: str) -> bool:
        """Delete a driver Job and (in the foreground) its pod; False when there was none."""
        return (
            self._call(self.batch.delete_namespaced_job, name, self.namespace, propagation_policy="Foreground")
            is not None
        )

    # -- the post-training image `invoke image` pushed
    def image_record(self) -> dict:
        found = self._call(self.core.read_namespaced_config_map, IMAGE_RECORD, self.namespace)
        return (found or {}).get("data", {})

    def record_image(self, image: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": IMAGE_RECORD, "labels": {"app": "tpu-grpo"}},
            "data": {"image": image, "pushed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        }
        if self.image_record():
            self._call(self.core.replace_namespaced_config_map, IMAGE_RECORD, self.namespace, body)
        else:
            self._call(self.core.create_namespaced_config_map, self.namespace, body)

    # -- the Hugging Face token
    def has_token(self) -> bool:
        return self._call(self.core.read_namespaced_secret, TOKEN_SECRET, self.namespace) is not None

    def put_token(self, token: str) -> None:
        """The token as a Secret the pods read as HF_TOKEN: sent in a request body, never on a command line."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": TOKEN_SECRET, "labels": {"app": "tpu-grpo"}},
            "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
        }
        if self.has_token():
            self._call(self.core.replace_namespaced_secret, TOKEN_SECRET, self.namespace, body)
        else:
            self._call(self.core.create_namespaced_secret, self.namespace, body)


def _reason(body) -> str:
    """The message of a Kubernetes Status body, else its text."""
    try:
        return json.loads(body).get("message", "")
    except (TypeError, ValueError):
        return str(body or "")[:200]

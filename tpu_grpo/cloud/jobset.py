"""JobSet, the Kubernetes API a slice's jobs run as: its pinned release, and the manifests tpu-grpo
renders for it."""

from __future__ import annotations

import hashlib
import re

from tpu_grpo.catalog import images, release
from tpu_grpo.catalog.accelerators import CHIPS_PER_HOST, CPU_POD_MEMORY_GB, CPU_POOL, GKE_ACCELERATOR, Accelerator

API_VERSION = "jobset.x-k8s.io/v1alpha2"  # of JobSet's release (release.JOBSET_VERSION)

#: The user container's name (xpk's default docker name) and the ports of Pathways' parts (xpk's).
CONTAINER = "jax-tpu"
#: The pipeline driver's container (driver).
DRIVER_CONTAINER = "driver"
PROXY_PORT, RESOURCE_MANAGER_PORT, WORKER_PORT = 29000, 29001, 29005
COORDINATOR = "metadata.labels['jobset.sigs.k8s.io/coordinator']"
#: The Secret holding the Hugging Face token; pods read it as HF_TOKEN (never a command line).
TOKEN_SECRET, TOKEN_KEY = "tpu-grpo-hf-token", "token"
#: Labels tpu-grpo finds its jobs by.
RUN_LABEL, STEP_LABEL = "tpu-grpo/run", "tpu-grpo/step"
#: xpk's: a JobSet's pods are named after it, and 40 characters leave room for the suffixes.
MAX_NAME = 40
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def job_name(step: str, run_name: str) -> str:
    """A JobSet name for a step of a run: a DNS label, readable, unique per run (a digest of the run name)."""
    digest = hashlib.sha256(run_name.encode()).hexdigest()[:6]
    slug = _NOT_DNS.sub("-", run_name.lower()).strip("-")
    return f"{step}-{slug}"[: MAX_NAME - 7].rstrip("-") + f"-{digest}"


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(**values) -> list[dict]:
    return [
        {"name": name, **(value if isinstance(value, dict) else {"value": value})} for name, value in values.items()
    ]


#: Optional: a public model's pods run without the Secret (HF_TOKEN then unset); a gated model's job is refused without
#: one before it is created (slice_jobs.put_token), and its script stops at once (maxtext.POD_TOKEN_CHECK).
TOKEN_ENV = {"valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": TOKEN_KEY, "optional": True}}}
_SHARED_TMP = (
    {"name": "shared-tmp", "mountPath": "/tmp"},
    {"name": "shared-tmp", "hostPath": {"path": "/tmp", "type": "DirectoryOrCreate"}},
)


def _metadata(name: str, step: str, run_name: str) -> dict:
    return {"name": name, "labels": {RUN_LABEL: run_name, STEP_LABEL: step}}


def _user_container(image: str, script: str, env: list[dict], limits: dict) -> dict:
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "Always",
        "env": env,
        "command": ["bash", "-c", script],
        "resources": {"limits": limits},
        "volumeMounts": [dict(_SHARED_TMP[0])],
    }


def pathways(
    name: str, step: str, run_name: str, image: str, script: str, shape: Accelerator, num_slices: int, scratch: str
) -> dict:
    """A Pathways JobSet as xpk 1.16.0 renders `workload create-pathways` (v6e, not headless): a head on the
    CPU pool running Pathways' proxy and resource manager beside `script`, and one worker job per slice,
    one pod per host. Differences from xpk's: pinned Pathways images; Pathways' scratch in the stack's
    bucket (xpk's default is Google's own staging bucket); no Kueue queue label and no priority class
    (the cluster has neither: tpu-grpo runs one workload at a time); the token from a Secret and
    ENABLE_PATHWAYS_PERSISTENCE=1 (MaxText's multi-host tutorial) in the user container's environment;
    tpu-grpo's labels; and `script` as the command, without xpk's wrapper around it (the script passes a
    SIGTERM on to MaxText itself, as the wrapper does, and exits with MaxText's exit code: tpu_grpo/jobs/maxtext.py)."""
    head_env = _env(
        PATHWAYS_HEAD=_field(COORDINATOR),
        JAX_PLATFORMS="proxy",
        XCLOUD_ENVIRONMENT="GCP",
        JAX_BACKEND_TARGET=f"grpc://$(PATHWAYS_HEAD):{PROXY_PORT}",
        ENABLE_PATHWAYS_PERSISTENCE="1",
        HF_TOKEN=TOKEN_ENV,
    )
    scratch_arg = f"--gcs_scratch_location={scratch}"
    proxy = {
        "name": "pathways-proxy",
        "image": images.PATHWAYS_PROXY,
        "imagePullPolicy": "Always",
        "args": [
            f"--server_port={PROXY_PORT}",
            f"--resource_manager_address=$(PATHWAYS_HEAD):{RESOURCE_MANAGER_PORT}",
            scratch_arg,
        ],
        "env": _env(PATHWAYS_HEAD=_field(COORDINATOR)),
        "ports": [{"containerPort": PROXY_PORT, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "16", "memory": "100G"}},
        "restartPolicy": "Always",
    }
    resource_manager = {
        "name": "pathways-rm",
        "image": images.PATHWAYS_SERVER,
        "imagePullPolicy": "Always",
        "args": [
            f"--server_port={RESOURCE_MANAGER_PORT}",
            scratch_arg,
            "--node_type=resource_manager",
            f"--instance_count={num_slices}",
            f"--instance_type={shape.pathways_instance_type}",
        ],
        "env": _env(
            REPLICATED_JOB_NAME=_field("metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"),
            JOBSET_NAME=_field("metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
            HOST_ADDRESS=_field(COORDINATOR),
            TPU_SKIP_MDS_QUERY="true",
        ),
        "ports": [
            {"containerPort": RESOURCE_MANAGER_PORT, "protocol": "TCP"},
            {"containerPort": RESOURCE_MANAGER_PORT + 1, "protocol": "TCP"},
        ],
        "resources": {"limits": {"cpu": "8", "memory": "32G"}},
        "restartPolicy": "Always",
    }
    head = {
        "name": "pathways-head",
        "replicas": 1,
        "template": {
            "metadata": {"annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname"}},
            "spec": {
                "backoffLimit": 0,
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "template": {
                    "spec": {
                        "hostNetwork": True,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "nodeSelector": {"cloud.google.com/gke-nodepool": CPU_POOL},
                        "initContainers": [proxy, resource_manager],
                        "containers": [_user_container(image, script, head_env, {"cpu": "24", "memory": "100G"})],
                        "restartPolicy": "Never",
                        "volumes": [dict(_SHARED_TMP[1])],
                    }
                },
            },
        },
    }
    worker_container = {
        "name": "pathways-worker",
        "image": images.PATHWAYS_SERVER,
        "imagePullPolicy": "Always",
        "args": [
            f"--server_port={WORKER_PORT}",
            f"--resource_manager_address=$(PATHWAYS_HEAD):{RESOURCE_MANAGER_PORT}",
            scratch_arg,
        ],
        "env": _env(
            TPU_MIN_LOG_LEVEL="0",
            TF_CPP_MIN_LOG_LEVEL="0",
            XCLOUD_ENVIRONMENT="GCP",
            MEGASCALE_GRPC_ENABLE_XOR_TRACER="false",
            MEGASCALE_NUM_SLICES=_field("metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"),
            JOBSET_NAME=_field("metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
            REPLICATED_JOB_NAME=_field("metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"),
            MEGASCALE_SLICE_ID=_field("metadata.labels['jobset.sigs.k8s.io/job-index']"),
            PATHWAYS_HEAD=_field(COORDINATOR),
            MEGASCALE_COORDINATOR_ADDRESS=_field(COORDINATOR),
        ),
        "ports": [{"containerPort": port, "protocol": "TCP"} for port in (WORKER_PORT, WORKER_PORT + 1, 8471, 8080)],
        "resources": {"limits": {"google.com/tpu": str(CHIPS_PER_HOST)}},
        "volumeMounts": [dict(_SHARED_TMP[0])],
    }
    worker = {
        "name": "worker",
        "replicas": num_slices,
        "template": {
            "metadata": {
                "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
            },
            "spec": {
                "backoffLimit": shape.hosts * 4,
                "completionMode": "Indexed",
                "completions": shape.hosts,
                "parallelism": shape.hosts,
                "template": {
                    "metadata": {"labels": {RUN_LABEL: run_name}},
                    "spec": {
                        "hostNetwork": True,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "terminationGracePeriodSeconds": 30,
                        "nodeSelector": {
                            "cloud.google.com/gke-tpu-accelerator": GKE_ACCELERATOR,
                            "cloud.google.com/gke-tpu-topology": shape.topology,
                        },
                        "containers": [worker_container],
                        "restartPolicy": "OnFailure",
                        "tolerations": [{"operator": "Exists", "key": "google.com/tpu"}],
                        "volumes": [dict(_SHARED_TMP[1])],
                    },
                },
            },
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(name, step, run_name),
        "spec": {
            "coordinator": {"replicatedJob": "pathways-head"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {"restartStrategy": "Recreate"},
            "replicatedJobs": [head, worker],
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["pathways-head"]},
            "suspend": False,
        },
    }


def cpu(name: str, step: str, run_name: str, image: str, script: str) -> dict:
    """A one-pod JobSet on the CPU pool: the conversion and the export, which MaxText runs on CPU
    (`hardware=cpu` for the conversion), so they hold no TPU host."""
    env = _env(JAX_PLATFORMS="cpu", HF_TOKEN=TOKEN_ENV)
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(name, step, run_name),
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "main",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": 1,
                            "parallelism": 1,
                            "template": {
                                "spec": {
                                    "nodeSelector": {"cloud.google.com/gke-nodepool": CPU_POOL},
                                    "containers": [
                                        _user_container(
                                            image, script, env, {"cpu": "48", "memory": f"{CPU_POD_MEMORY_GB}G"}
                                        )
                                    ],
                                    "restartPolicy": "Never",
                                    "volumes": [dict(_SHARED_TMP[1])],
                                }
                            },
                        }
                    },
                }
            ],
            "suspend": False,
        },
    }


#: Where the driver's ConfigMap (its program and the pipeline's data) is mounted.
CHAIN_MOUNT = "/tpu-grpo"


def driver(name: str, run_name: str, image: str) -> dict:
    """The Job that runs a slice's pipeline (tpu_grpo/host/remote/chain.py) on the CPU pool, as the service account
    whose Role lets it create and follow JobSets: its program and data from the ConfigMap of its name. It runs once:
    a lost driver is started again by the next `invoke pipeline`, which skips what is done."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(name, "pipeline", run_name),
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {RUN_LABEL: run_name, STEP_LABEL: "pipeline"}},
                "spec": {
                    "serviceAccountName": release.PIPELINE_ACCOUNT,
                    "nodeSelector": {"cloud.google.com/gke-nodepool": CPU_POOL},
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": DRIVER_CONTAINER,
                            "image": image,
                            "imagePullPolicy": "Always",
                            "command": ["python3", f"{CHAIN_MOUNT}/chain.py", f"{CHAIN_MOUNT}/chain.json"],
                            "resources": {"limits": {"cpu": "1", "memory": "2G"}},
                            "volumeMounts": [{"name": "chain", "mountPath": CHAIN_MOUNT, "readOnly": True}],
                        }
                    ],
                    "volumes": [{"name": "chain", "configMap": {"name": name}}],
                },
            },
        },
    }


def to_yaml(manifests: list[dict]) -> str:
    """Manifests as `kubectl apply -f` takes them, a script shown as the block of lines it is, and every value
    written out where it stands (no `&id001` anchors and `*id001` aliases for values that repeat)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return "---\n".join(yaml.dump(manifest, Dumper=Dumper, sort_keys=False) for manifest in manifests)

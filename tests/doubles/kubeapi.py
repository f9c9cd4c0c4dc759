"""A stand-in of the Kubernetes API server for one namespace, at the HTTP layer, with JobSet's CRD.

No kube-apiserver can run on these machines: Debian 12 packages etcd and kubectl but not the API
server, and neither PyPI nor npm carries its binary (envtest's setup downloads it from Google's
storage, which is out of reach). So this server answers the requests the official Python client
sends, as the API documents them: JSON objects with metadata (uid, resourceVersion,
creationTimestamp), `Status` bodies for errors (404 NotFound, 409 AlreadyExists, 422 Invalid), label
selectors (`key` and `key=value`), foreground deletion, and pod logs streamed with chunked transfer
while `follow=true`. A JobSet is checked against JobSet v0.10.1's CRD schema, strictly, as the API
server's strict field validation does. What the JobSet controller and the kubelet would do is a
scenario the test picks: pods that run the recorded MaxText log to an exit code, a worker that
crashes, pods that cannot be scheduled or cannot pull their image.

A batch/v1 Job (a pipeline's driver) is run for real, as the Job controller and the kubelet would: one pod, labelled
`batch.kubernetes.io/job-name` and `job-name` as the Job controller labels its pods (Kubernetes' "Jobs" page, "Job
labels"), created only when the Job's service account exists (the controller's pod creation is refused otherwise),
whose container's command runs here as a process: the ConfigMaps it mounts written to a folder that stands in its
mount path, `python3` this interpreter (the image's is MaxText's venv; both have the Cloud Storage client), and the
API's address given as TPU_GRPO_KUBE_API (a pod reaches kubernetes.default.svc). Its output is the pod's log; its exit
code the container's, and the Job's condition Complete or Failed (batch/v1 JobCondition). Deleting the Job ends it.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jsonschema
import yaml

DATA = Path(__file__).parent.parent / "data"
JOBSETS = re.compile(r"/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets(?:/(?P<name>[^/]+))?")
PODS = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+)(?P<log>/log)?)?")
OBJECTS = re.compile(
    r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>secrets|configmaps|serviceaccounts)(?:/(?P<name>[^/]+))?"
)
JOBS = re.compile(r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?")


def strict(schema: dict) -> dict:
    """A CRD's structural schema as JSON Schema that refuses unknown fields where the CRD does not keep
    them, as the API server does with fieldValidation=Strict."""
    schema = copy.deepcopy(schema)

    def tighten(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return schema


@functools.cache  # the CRD is read once: each test's API checks against the same schema
def jobset_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(gzip.decompress((DATA / "jobset-v0.10.1-crd.yaml.gz").read_bytes()))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def made(body: dict, namespace: str) -> None:
    """What the API server sets on an object it creates."""
    body["metadata"].update(
        {"namespace": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "1", "creationTimestamp": now()}
    )


def status_body(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class Scenario:
    """What happens to a JobSet once created: its script's log lines and exit code, or what stops it."""

    log: list[str] = field(default_factory=list)
    exit_code: int = 0
    crash_worker: bool = False
    unschedulable: str | None = None
    pull_error: str | None = None  # the container whose image cannot be pulled
    #: Why, as containerd says it in kubelet's ErrImagePull message (its resolver's errors: a tag the registry does
    #: not have, or a token refused to the node's account); None: kubelet's back-off, whose message names no cause.
    pull_cause: str | None = None
    line_delay: float = 0.0
    #: A failed JobSet's pods are gone with their statuses: Kubernetes' pod garbage collector deletes the pods bound
    #: to a node that no longer exists (its "Pod Lifecycle" page, "Garbage collection of Pods"), as a preempted spot
    #: or flex-start node is; nothing then says what the script exited with.
    pods_gone: bool = False


PULL_CAUSES = {
    "missing": 'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
    'reference "{image}": {image}: not found',
    "denied": 'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to resolve '
    'reference "{image}": failed to authorize: failed to fetch oauth token: unexpected status from GET '
    "request to https://us-east5-docker.pkg.dev/v2/token: 403 Forbidden",
}


class KubeAPI:
    def __init__(self):
        self.validator = jobset_validator()
        self.jobsets: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.secrets: dict[str, dict] = {}
        self.configmaps: dict[str, dict] = {}
        self.serviceaccounts: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}  # batch/v1 Jobs
        self.created: list[tuple[str, list[str]]] = []  # each JobSet created, and those that had not ended then
        self.processes: dict[str, subprocess.Popen] = {}  # a Job's running container, by the Job's name
        self.folders: list[str] = []  # the kubelet's stand-ins of mounted volumes, removed on close
        #: What a Job's container finds in its environment besides the API's address (the bucket's emulator).
        self.pod_env: dict[str, str] = {}
        self.logs: dict[str, list[str]] = {}
        self.requests: list[str] = []  # method and path with query, as received
        self.scenario = Scenario()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # close: within 0.05 s

    def close(self):
        for process in list(self.processes.values()):
            process.kill()
            process.wait()
        self.server.shutdown()
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                    "users": [{"name": "test", "user": {}}],
                }
            )
        )
        return path

    # -- what the JobSet controller, the scheduler and the kubelet do, by scenario
    def _start(self, jobset: dict) -> None:
        name, scenario = jobset["metadata"]["name"], self.scenario
        head_job = jobset["spec"]["replicatedJobs"][0]
        pods = [self._pod(name, head_job["name"], 0)]
        if len(jobset["spec"]["replicatedJobs"]) > 1:
            worker = jobset["spec"]["replicatedJobs"][1]
            pods += [self._pod(name, "worker", i) for i in range(worker["template"]["spec"]["parallelism"])]
        for pod in pods:
            if scenario.unschedulable:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": scenario.unschedulable,
                    }
                ]
            self.pods[pod["metadata"]["name"]] = pod
        if scenario.unschedulable:
            return
        if scenario.pull_error:
            head = pods[0]
            image = _image(jobset, scenario.pull_error)
            waiting = (
                {"reason": "ErrImagePull", "message": PULL_CAUSES[scenario.pull_cause].format(image=image)}
                if scenario.pull_cause
                else {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
            )
            head["status"]["containerStatuses"] = [
                {"name": scenario.pull_error, "image": image, "ready": False, "state": {"waiting": waiting}}
            ]
            return
        for pod in pods:
            pod["status"]["phase"] = "Running"
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "image": c["image"], "ready": True, "state": {"running": {"startedAt": now()}}}
                for c in _containers(pod)
            ]
        self.logs[pods[0]["metadata"]["name"]] = list(scenario.log)
        if scenario.crash_worker and len(pods) > 1:
            worker = pods[1]["status"]["containerStatuses"][0]
            worker["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error"}}
            worker["restartCount"] = 1

    def _finish(self, name: str) -> None:
        """The script's container has ended: the pods, then the JobSet, take its verdict."""
        with self.lock:
            jobset = self.jobsets.get(name)
            if jobset is None:
                return
            code = self.scenario.exit_code
            for pod in self.pods.values():
                if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") != name:
                    continue
                pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                for container in pod["status"].get("containerStatuses", []):
                    container["state"] = {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "finishedAt": now(),
                        }
                    }
            condition = (
                {"type": "Completed", "reason": "AllJobsCompleted", "message": "jobset completed successfully"}
                if code == 0
                else {
                    "type": "Failed",
                    "reason": "FailedJobs",
                    "message": "jobset failed due to one or more job failures",
                }
            )
            jobset["status"] = {
                "conditions": [{**condition, "status": "True", "lastTransitionTime": now()}],
                "terminalState": condition["type"],
                "restarts": 0,
            }
            if code and self.scenario.pods_gone:
                for pod_name in [
                    pod_name
                    for pod_name, pod in self.pods.items()
                    if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
                ]:
                    del self.pods[pod_name]

    def _pod(self, jobset: str, replicated_job: str, index: int) -> dict:
        template = next(job for job in self.jobsets[jobset]["spec"]["replicatedJobs"] if job["name"] == replicated_job)
        spec = copy.deepcopy(template["template"]["spec"]["template"]["spec"])
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{jobset}-{replicated_job}-0-{index}-x{uuid.uuid4().hex[:4]}",
                "namespace": "default",
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now(),
                "labels": {
                    "jobset.sigs.k8s.io/jobset-name": jobset,
                    "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                },
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }

    # -- HTTP
    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            #: Headers and body in separate writes would each wait out the client's delayed ACK (40 ms on Linux);
            #: Go's servers (the API server's) and the Hub's set TCP_NODELAY too
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def _route(self, method: str) -> None:
                api.requests.append(f"{method} {self.path}")
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                for pattern, handler in (
                    (JOBSETS, api.jobset_request),
                    (PODS, api.pod_request),
                    (OBJECTS, api.object_request),
                    (JOBS, api.job_request),
                ):
                    found = pattern.fullmatch(url.path)
                    if found:
                        handler(self, method, found.groupdict(), query)
                        return
                self._send(404, status_body(404, "NotFound", "the server could not find the requested resource"))

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_PUT(self):
                self._route("PUT")

            def do_DELETE(self):
                self._route("DELETE")

        return Handler

    def jobset_request(self, http, method: str, found: dict, query: dict) -> None:
        name = found["name"]
        if method == "POST":
            body = http._body()
            errors = sorted(self.validator.iter_errors(body), key=lambda e: list(e.path))
            if errors:
                http._send(
                    422,
                    status_body(
                        422,
                        "Invalid",
                        f'JobSet.jobset.x-k8s.io "{body["metadata"].get("name")}" is invalid: {errors[0].message}',
                    ),
                )
                return
            with self.lock:
                name = body["metadata"]["name"]
                if name in self.jobsets:
                    http._send(
                        409, status_body(409, "AlreadyExists", f'jobsets.jobset.x-k8s.io "{name}" already exists')
                    )
                    return
                made(body, found["ns"])
                body["status"] = {"restarts": 0}
                running = [other for other, made in self.jobsets.items() if "terminalState" not in made["status"]]
                self.created.append((name, running))
                self.jobsets[name] = body
                self._start(body)
            http._send(201, body)
            if not self.scenario.unschedulable and not self.scenario.pull_error and not self.scenario.log:
                self._finish(name)
            return
        if method == "GET" and name is None:
            items = [j for j in self.jobsets.values() if _selected(j, query.get("labelSelector"))]
            http._send(
                200, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSetList", "metadata": {}, "items": items}
            )
            return
        if name not in self.jobsets:
            http._send(404, status_body(404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found'))
            return
        if method == "GET":
            http._send(200, self.jobsets[name])
        elif method == "DELETE":
            with self.lock:
                gone = self.jobsets.pop(name)
                for pod in [
                    p
                    for p, v in self.pods.items()
                    if v["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
                ]:
                    del self.pods[pod]
            http._send(200, gone)

    def pod_request(self, http, method: str, found: dict, query: dict) -> None:
        name = found["name"]
        if name is None:
            items = [p for p in self.pods.values() if _selected(p, query.get("labelSelector"))]
            http._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
            return
        if name not in self.pods:
            http._send(404, status_body(404, "NotFound", f'pods "{name}" not found'))
            return
        if not found["log"]:
            http._send(200, self.pods[name])
            return
        if self.pods[name]["status"].get("phase") == "Pending":
            http._send(
                400,
                status_body(
                    400,
                    "BadRequest",
                    f'container "{query.get("container")}" in pod "{name}" is waiting to start: ContainerCreating',
                ),
            )
            return
        http.send_response(200)
        http.send_header("Content-Type", "text/plain")
        http.send_header("Transfer-Encoding", "chunked")
        http.end_headers()
        for line in list(self.logs.get(name, [])):
            data = (line + "\n").encode()
            http.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            http.wfile.flush()
            if self.scenario.line_delay:
                time.sleep(self.scenario.line_delay)
        http.wfile.write(b"0\r\n\r\n")
        jobset = self.pods[name]["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name")
        if jobset and query.get("follow") == "true":
            self._finish(jobset)

    def object_request(self, http, method: str, found: dict, query: dict) -> None:
        """Secrets and ConfigMaps: create, read, replace."""
        store, name = getattr(self, found["kind"]), found["name"]
        if method == "POST":
            body = http._body()
            if body["metadata"]["name"] in store:
                http._send(
                    409,
                    status_body(409, "AlreadyExists", f'{found["kind"]} "{body["metadata"]["name"]}" already exists'),
                )
                return
            store[body["metadata"]["name"]] = body
            http._send(201, body)
        elif name not in store:
            http._send(404, status_body(404, "NotFound", f'{found["kind"]} "{name}" not found'))
        elif method == "PUT":
            store[name] = http._body()
            http._send(200, store[name])
        else:
            http._send(200, store[name])

    def job_request(self, http, method: str, found: dict, query: dict) -> None:
        """batch/v1 Jobs: create (and run), read, list, delete (ending its process)."""
        name = found["name"]
        if method == "POST":
            body = http._body()
            with self.lock:
                name = body["metadata"]["name"]
                if name in self.jobs:
                    http._send(409, status_body(409, "AlreadyExists", f'jobs.batch "{name}" already exists'))
                    return
                made(body, found["ns"])
                body["status"] = {}
                self.jobs[name] = body
            http._send(201, body)
            self._run_job(body)
            return
        if method == "GET" and name is None:
            items = [job for job in self.jobs.values() if _selected(job, query.get("labelSelector"))]
            http._send(200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items})
            return
        if name not in self.jobs:
            http._send(404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'))
            return
        if method == "GET":
            http._send(200, self.jobs[name])
        elif method == "DELETE":
            process = self.processes.pop(name, None)
            if process:
                process.terminate()
                process.wait()
            with self.lock:
                gone = self.jobs.pop(name)
                for pod in [p for p, v in self.pods.items() if v["metadata"]["labels"].get("job-name") == name]:
                    del self.pods[pod]
            http._send(200, gone)

    def _run_job(self, job: dict) -> None:
        """The Job controller's pod and the kubelet's container, as the module's docstring says."""
        name, spec = job["metadata"]["name"], job["spec"]["template"]["spec"]
        if spec.get("serviceAccountName", "default") not in self.serviceaccounts:
            return  # the controller's pod creation is refused: the Job has no pod
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-x{uuid.uuid4().hex[:5]}",
                "namespace": "default",
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now(),
                "labels": {
                    **job["spec"]["template"]["metadata"].get("labels", {}),
                    "batch.kubernetes.io/job-name": name,
                    "job-name": name,
                },
            },
            "spec": copy.deepcopy(spec),
            "status": {"phase": "Running"},
        }
        [container] = spec["containers"]
        folder = tempfile.mkdtemp(prefix="kubelet-")
        self.folders.append(folder)
        command = [sys.executable if part == "python3" else part for part in container["command"]]
        for mount in container.get("volumeMounts", []):
            [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            where = os.path.join(folder, mount["name"])
            os.makedirs(where)
            for key, text in self.configmaps[volume["configMap"]["name"]]["data"].items():
                Path(where, key).write_text(text)
            command = [part.replace(mount["mountPath"], where) for part in command]
        pod_name = pod["metadata"]["name"]
        self.pods[pod_name] = pod
        self.logs[pod_name] = []
        path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
        env = {**os.environ, **self.pod_env, "PATH": path, "TPU_GRPO_KUBE_API": self.url}
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=folder
        )
        self.processes[name] = process
        job["status"] = {"active": 1, "startTime": now()}

        def kubelet() -> None:
            assert process.stdout
            for line in process.stdout:
                self.logs[pod_name].append(line.decode(errors="replace").rstrip("\n"))
            code = process.wait()
            with self.lock:
                pod["status"] = {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [
                        {"name": container["name"], "state": {"terminated": {"exitCode": code, "finishedAt": now()}}}
                    ],
                }
                kind = "Complete" if code == 0 else "Failed"
                job["status"] = {
                    "succeeded" if code == 0 else "failed": 1,
                    "conditions": [{"type": kind, "status": "True", "lastTransitionTime": now()}],
                }

        threading.Thread(target=kubelet, daemon=True).start()


def _containers(pod: dict) -> list[dict]:
    return pod["spec"].get("containers", [])


def _image(jobset: dict, container: str) -> str:
    for job in jobset["spec"]["replicatedJobs"]:
        spec = job["template"]["spec"]["template"]["spec"]
        for item in spec.get("initContainers", []) + spec["containers"]:
            if item["name"] == container:
                return item["image"]
    raise KeyError(container)


def _selected(item: dict, selector: str | None) -> bool:
    """`key` (the label exists) and `key=value` terms, comma-separated, as the API takes them."""
    labels = item["metadata"].get("labels", {})
    for term in filter(None, (selector or "").split(",")):
        key, equals, value = term.partition("=")
        if key not in labels or (equals and labels[key] != value):
            return False
    return True

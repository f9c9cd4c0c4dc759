"""A pipeline's steps run in order by the host itself (tpu_grpo/jobs/pipeline.py's chain_script): convert -> train ->
export -> save, each a job of its own as `invoke train` starts one (its folder, job.json, log, exit code, and its
done-record on success), so status, logs and cancel see the step and a later pipeline skips what is done. The laptop
starts the chain and follows its lines; a closed laptop stops nothing. The chain holds the TPU's lock from its start
to its end (start_job.sh's, passed on to each step): no other job starts between its steps, and the idle stop counts
the VM busy until its last step has ended.

The export's checkpoint is the one the training's intermediate evaluations scored best, chosen once a training of the
run has finished, as tpu_grpo/jobs/pipeline.py's `scored` chooses it on the laptop (progress.best: the highest
accuracy among the evaluated steps that have a checkpoint, the earlier on a tie). The laptop renders the export and
the save twice: for the last checkpoint ("last"), and for a stand-in step (SENTINEL, "best") whose number this program
replaces with the chosen step, naming the export's done-record by its inputs as pipeline.record_key does.

Its data: the file its first argument names (chain.json): `jobs`, `done`, `root` (folders, each may begin with `~`),
`wrapper` (job_wrapper.sh's text), `sentinel`, `steps` (convert's and train's), `variants` ({"best": [export, save],
"last": [...]}), each step {name, script, meta, record, test, when_done}: its job's command, job.json, done-record name,
a bash test that holds when it is done, and, for a step that runs even when done, the command it then runs; `choose`:
{list (bash that prints the names in the run's checkpoint folders), run, iterations, prefix, pattern, field, keys}
(progress.py's ABSL_PREFIX, EVAL, EVAL_FIELD and EVAL_KEYS, so a log is read one way).
Its lines: `tpu-grpo pipeline: STEP done|skipped|job ID|exit CODE`, which the laptop reads (pipeline.CHAIN_LINE).

On a slice the same program is the driver Job of tpu_grpo/jobs/slice_jobs.py, on the CPU pool in the post-training
image: its data has `cluster` ({namespace, poll}) and no `jobs`; each step has a `manifest`, its JobSet, which it
creates through the Kubernetes API with the Job's service account (JobSet's own dependsOn orders replicated jobs of one
JobSet only), follows by its script pod's log, and whose verdict is the JobSet's; a step's ID is its JobSet's name.
The training's log there is its head pod's, and no step has a done-record (the bucket's folders say what is done)."""

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SAID = "tpu-grpo pipeline:"
#: The TPU's lock, held since start_job.sh: each step holds it too, as a job started alone does.
LOCK_FD = 9
#: An evaluation's fields that are whole numbers (progress.Eval's correct and total); the others are decimals.
COUNTS = ("corr", "total")


def say(text: str) -> None:
    print(f"{SAID} {text}", flush=True)


def record_key(meta: dict) -> str:
    """The done-record's name of a step whose inputs are meta["inputs"] (pipeline.record_key's, for the export)."""
    digest = hashlib.sha256(json.dumps(meta["inputs"], sort_keys=True).encode()).hexdigest()[:12]
    return f"{meta['step']}-{digest}"


def message(line: str, prefix: re.Pattern[str]) -> str:
    """A log line's message: what follows absl's prefix, or the line itself (progress.message)."""
    line = line.rstrip("\r\n")
    if found := prefix.search(line):
        return line[found.end() :].strip()
    return line.rsplit("\r", 1)[-1].strip()


def scores(lines: list[str], choose: dict) -> list[tuple[float, int]]:
    """Each intermediate evaluation whose fields progress.py reads (whole counts, decimal rates): (accuracy, its outer
    step)."""
    prefix, pattern, field = (re.compile(choose[name]) for name in ("prefix", "pattern", "field"))
    found = []
    for line in lines:
        said = pattern.match(message(line, prefix))
        if not said or said["step"] is None:
            continue
        values = dict(field.findall(said["ifields"]))
        try:
            for key in choose["keys"]:
                (int if key in COUNTS else float)(values[key])
        except (KeyError, ValueError):
            continue
        found.append((float(values["accuracy"]), int(said["step"])))
    return found


def best_step(lines: list[str], checkpoints: set[int], choose: dict) -> int | None:
    """The train step of the best scored checkpoint (progress.best, scored_step), or None: none was scored."""
    iterations = choose["iterations"]
    scored = [(accuracy, -step) for accuracy, step in scores(lines, choose) if step * iterations in checkpoints]
    if not scored:
        return None
    step = -max(scored)[1]
    return step * iterations or None


def read(path: str) -> str:
    """A file's text, or nothing when it is not there (yet)."""
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def chosen(given: dict, trained: list[str] | None) -> int | None:
    """The step to export: the best scored once a training of the run has finished (pipeline.scored), its log's
    `trained` lines read against the checkpoints in the store; else None."""
    if trained is None:
        return None
    choose = given["choose"]
    listed = subprocess.run(["bash", "-c", choose["list"]], capture_output=True, text=True, check=False).stdout
    checkpoints = {int(name) for name in listed.split() if name.isdigit()}
    return best_step(trained, checkpoints, choose)


def variant(given: dict, step: int | None) -> list[dict]:
    """The export and the save of the chosen step: the "best" ones with the stand-in replaced, else the "last"."""
    if step is None:
        return given["variants"]["last"]
    sentinel = str(given["sentinel"])
    steps = json.loads(json.dumps(given["variants"]["best"]).replace(sentinel, str(step)))
    export = steps[0]  # its inputs' digest names its done-record, and its save's (a slice's export has none)
    if not export["record"]:
        return steps
    old, new = (key.rsplit("-", 1)[1] for key in (export["record"], record_key(export["meta"])))
    return json.loads(json.dumps(steps).replace(old, new))


def holds(test: str) -> bool:
    return subprocess.run(["bash", "-c", test], stdin=subprocess.DEVNULL, check=False).returncode == 0


def new_id(step: str) -> str:
    """As tpu_grpo/jobs/vm_jobs.py's new_id: UTC start time to the millisecond, then the step."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}-{step}"


class Host:
    """The one VM: each step a job of its own, as start_job.sh starts one."""

    def __init__(self, given: dict, chain: str):
        self.given, self.chain = given, chain
        self.jobs = os.path.expanduser(given["jobs"])

    def trained(self) -> list[str] | None:
        """The lines of the run's trainings' logs, oldest first, once one of them has finished; else None."""
        run = self.given["choose"]["run"]
        folders = []
        for name in sorted(os.listdir(self.jobs)):
            meta = read(os.path.join(self.jobs, name, "job.json"))
            try:
                step = json.loads(meta) if meta else {}
            except ValueError:
                continue
            if step.get("step") == "train" and step.get("run") == run:
                folders.append(os.path.join(self.jobs, name))
        if not any(read(os.path.join(folder, "exit_code")).strip() == "0" for folder in folders):
            return None
        return [line for folder in folders for line in read(os.path.join(folder, "log")).splitlines()]

    def run(self, step: dict, command: str) -> int:
        """Run one step as start_job.sh starts a job (without its lock, which the chain holds); its exit code."""
        given, chain = self.given, self.chain
        root = os.path.expanduser(given["root"])
        job_id = new_id(step["name"])
        folder = os.path.join(self.jobs, job_id)
        os.makedirs(folder)
        for name, text in (
            ("command.sh", command),
            ("job.json", json.dumps({**step["meta"], "chain": chain}, indent=1)),
            ("run.sh", given["wrapper"]),
        ):
            with open(os.path.join(folder, name), "w") as file:
                file.write(text)
        with open(os.path.join(root, "current"), "w") as file:
            file.write(f"{job_id}\n")
        say(f"{step['name']} job {job_id}")
        held = (LOCK_FD,) if os.path.exists(f"/proc/self/fd/{LOCK_FD}") else ()
        subprocess.run(
            ["bash", os.path.join(folder, "run.sh"), folder, step["record"], os.path.expanduser(given["done"])],
            cwd=os.path.expanduser("~"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a group of its own, as a job started alone: cancel ends it and nothing else
            pass_fds=held,
            check=False,
        )
        code = read(os.path.join(folder, "exit_code")).strip()
        return int(code) if code.lstrip("-").isdigit() else -1


#: A pod's service account, as Kubernetes mounts it: the token the API takes and the CA its certificate is signed by.
ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The API's address from a pod; TPU_GRPO_KUBE_API another's (the test's stand-in of the API server).
IN_CLUSTER = "https://kubernetes.default.svc"
#: JobSet's API (tpu_grpo/cloud/jobset.py's API_VERSION), the replicated jobs whose pod runs a step's script
#: (slice_jobs.SCRIPT_JOBS), and its container (jobset.CONTAINER).
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
SCRIPT_JOBS = ("pathways-head", "main")
CONTAINER = "jax-tpu"


class Slice:
    """A slice's cluster: each step a JobSet, created and followed through the Kubernetes API."""

    def __init__(self, given: dict):
        self.given = given
        cluster = given["cluster"]
        self.namespace, self.poll = cluster["namespace"], cluster["poll"]
        self.base = os.environ.get("TPU_GRPO_KUBE_API", IN_CLUSTER)
        token = read(os.path.join(ACCOUNT, "token")).strip()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        ca = os.path.join(ACCOUNT, "ca.crt")
        self.tls = ssl.create_default_context(cafile=ca) if os.path.exists(ca) else None
        self.logs: dict[str, list[str]] = {}  # a step's script log, read as it ran

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None):
        """One API call's response (the caller reads it), or None for a 404."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, context=self.tls, timeout=None)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def get(self, path: str, query: dict | None = None) -> dict | None:
        response = self.call("GET", path, query=query)
        return None if response is None else json.load(response)

    def jobset(self, name: str) -> dict | None:
        return self.get(f"{JOBSETS.format(namespace=self.namespace)}/{name}")

    def script_pod(self, name: str) -> dict | None:
        pods = self.get(
            f"/api/v1/namespaces/{self.namespace}/pods", {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"}
        )
        return next(
            (
                pod
                for pod in (pods or {}).get("items", [])
                if pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/replicatedjob-name") in SCRIPT_JOBS
            ),
            None,
        )

    def log(self, pod: dict, follow: bool) -> str:
        """The script's log, followed to its container's end or as it is; nothing when the pod has none yet."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}/log"
        try:
            response = self.call("GET", path, query={"container": CONTAINER, "follow": "true" if follow else "false"})
        except urllib.error.HTTPError:  # 400: not started
            return ""
        return "" if response is None else response.read().decode(errors="replace")

    @staticmethod
    def verdict(found: dict, pod: dict | None) -> int | None:
        """An ended JobSet's exit code (its script's, else 1 for a failure), or None while it runs."""
        ended = {c["type"] for c in found.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        if "Completed" in ended:
            return 0
        if "Failed" not in ended:
            return None
        for container in (pod or {}).get("status", {}).get("containerStatuses", []):
            if container["name"] == CONTAINER and container.get("state", {}).get("terminated"):
                return container["state"]["terminated"].get("exitCode") or 1
        return 1

    def trained(self) -> list[str] | None:
        """The training's head log, once its JobSet has completed (in this chain, or before it); else None."""
        name = self.given["choose"]["training"]
        if name in self.logs:
            return self.logs[name]
        found = self.jobset(name)
        if found is None or self.verdict(found, None) != 0:
            return None
        pod = self.script_pod(name)
        return self.log(pod, follow=False).splitlines() if pod else None

    def run(self, step: dict, command: str) -> int:
        """Create the step's JobSet (an ended one of its name replaced), follow its script's log, and wait for its
        verdict; its exit code (1: gone from the cluster, cancelled)."""
        manifest = step["manifest"]
        name = manifest["metadata"]["name"]
        jobsets = JOBSETS.format(namespace=self.namespace)
        if (found := self.jobset(name)) is not None:
            if self.verdict(found, None) is None:
                print(f"job {name} is still on the cluster; wait for it or cancel it", file=sys.stderr)
                return 1
            self.call("DELETE", f"{jobsets}/{name}", query={"propagationPolicy": "Foreground"})
            while self.jobset(name) is not None:
                time.sleep(self.poll)
        self.call("POST", jobsets, manifest).read()
        say(f"{step['name']} job {name}")
        lines: list[str] | None = None
        followed = False  # just now: its verdict is read at once, then again after each pause
        while (found := self.jobset(name)) is not None:
            pod = self.script_pod(name)
            code = self.verdict(found, pod)
            if code is not None:
                self.logs[name] = lines if lines is not None else (self.log(pod, False).splitlines() if pod else [])
                return code
            if not followed and pod and pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"):
                lines = self.log(pod, follow=True).splitlines()  # whole again when a stream broke off before its end
                followed = True
                continue
            followed = False
            time.sleep(self.poll)
        return 1


def main(path: str) -> int:
    with open(path) as file:
        given = json.load(file)
    chain = os.path.basename(os.path.dirname(os.path.abspath(path)))
    runner = Slice(given) if "cluster" in given else Host(given, chain)
    steps = [*given["steps"], *variant(given, chosen(given, runner.trained()))]
    done = [holds(step["test"]) for step in steps]
    last_done = max((number for number, each in enumerate(done) if each), default=-1)
    trained = False
    for number, step in enumerate(steps):
        if number < last_done or (number == last_done and not step.get("when_done")):
            say(f"{step['name']} {'done' if done[number] else 'skipped'}")
            continue
        if step["name"] == "export" and trained:  # the training just finished: its scores choose the checkpoint
            steps[number:] = variant(given, chosen(given, runner.trained()))
            step = steps[number]
        command = step["when_done"] if done[number] and step.get("when_done") else step.get("script", "")
        code = runner.run(step, command)
        say(f"{step['name']} exit {code}")
        if code != 0:
            return code
        trained = trained or step["name"] == "train"
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

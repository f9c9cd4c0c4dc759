"""The real Pulumi CLI side: what `pulumi up` needs on this laptop, running it, reading the
stack's outputs and state, and explaining the Compute Engine errors a TPU VM runs into.

Everything is checked before the CLI starts, so a missing piece is named in one place
instead of surfacing as a provider error halfway through an update.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from infra import replacements
from tpu_grpo.catalog.capacity import CAPACITIES, DEFAULT, Capacity
from tpu_grpo.catalog.stores import bucket_of
from tpu_grpo.cloud.refusals import STOCKOUT, classify
from tpu_grpo.config.errors import INTERRUPTED, UserError
from tpu_grpo.config.kubeconfig import AUTH_PLUGIN
from tpu_grpo.config.settings import Settings
from tpu_grpo.config.stack_file import project_root, salted

INSTANCE_TYPE = "gcp:compute/instance:Instance"
#: Compute Engine states of a VM that is not running: a TPU VM in them is created anew, never started
#: again (tpu_grpo/catalog/capacity.py, `after_stop`).
STOPPED = ("TERMINATED", "STOPPED", "SUSPENDED")
#: When `up` lets the protected data disk go (infra/tpu_host.py protects it; `releasable`).
RELEASED_WHEN = (
    "it is protected: `up` releases it only once every run on it is fetched or published, or to move it (--move-disk)"
)
#: What a replacement of each kind of resource means for the user (infra/replacements.py finds them).
REPLACING = {
    replacements.INSTANCE: "a new VM and boot disk (provisioning again, /dev/shm emptied)",
    replacements.DISK: "the data disk is DELETED with all it holds (saved models, checkpoints, the kept conversion, "
    f"the caches) and a new, empty one is made; {RELEASED_WHEN}",
    replacements.NODE_POOL: "new TPU hosts (a running job stops); the runs stay in the bucket",
    replacements.CLUSTER: "a new cluster (every job stops); the runs stay in the bucket",
    replacements.BUCKET: "a new bucket; the old one and what it holds are kept (retained on delete)",
}
#: What `pulumi destroy` (and `invoke down`) leaves in the project, by type: the program declares these
#: retain_on_delete (infra/common.py, infra/tpu_slice.py).
KEPT = {
    replacements.BUCKET: "the checkpoint bucket and what it holds",
    replacements.PROJECT_IAM_MEMBER: "a project-wide role of the nodes' account: other clusters of the project, or "
    "another stack, may rely on it",
}
#: A create the cloud finished outside Pulumi's state (one an interrupted or timed-out update left, or one made by
#: hand), which a later `up` meets: the instance's create outlived its timeout (terraform-plugin-sdk's helper/retry:
#: "timeout while waiting for state to become 'DONE'"; the provider clears the id while the request goes on), or the
#: name is taken: the Compute API's 409 ("The resource 'projects/P/zones/Z/instances/NAME' already exists,
#: alreadyExists"), GKE's ("Error 409: Already exists: projects/P/zones/Z/clusters/NAME., alreadyExists",
#: GoogleCloudPlatform/gke-logging-sinks-demo#11), Cloud Storage's, which names no bucket ("Error 409: Your previous
#: request to create the named bucket succeeded and you already own it., conflict", terraform-google-modules/
#: terraform-google-cloud-storage#238).
OUTSIDE_STATE = ("timeout while waiting for state to become", "alreadyExists", "you already own it")
#: `--event-log` is a flag of `pulumi up` only when PULUMI_DEBUG_COMMANDS is set (pkg/cmd/pulumi/operations/up.go:
#: `if env.DebugCommands.Value()`); otherwise the CLI refuses it as an unknown flag. Pulumi's Automation API sets
#: it for the same reason.
EVENT_LOG_ENV = {"PULUMI_DEBUG_COMMANDS": "true"}

#: What a 409 names: the Compute API's "The resource 'PATH' already exists", GKE's "Already exists: PATH.".
ALREADY_EXISTS = re.compile(r"The resource '(?P<path>[^']+)' already exists|Already exists: (?P<gke>\S+?)\.?,")


def outside_state(settings: Settings, messages: list[str]) -> list[str]:
    """What to do about what the cloud made outside the stack's state (OUTSIDE_STATE), once; [] when no message says
    so. A VM is deleted (its data disk stays); anything else (a disk, a snapshot, a cluster, the bucket) may hold data
    or be another's, and is named, never deleted."""
    if not any(marker in message for message in messages for marker in OUTSIDE_STATE):
        return []
    paths = [found["path"] or found["gke"] for message in messages for found in ALREADY_EXISTS.finditer(message)]
    bucket = bucket_of(settings.store)
    if bucket and any("you already own it" in message for message in messages):
        paths.append(f"bucket gs://{bucket}")
    other = next((path for path in paths if "/instances/" not in path), None)
    if other or settings.tpu_slice:
        return [
            f"{other or 'what the update made'} exists outside Pulumi's state (a create that an interrupted or "
            "timed-out update left, or one made by hand) and may hold data, so tpu-grpo deletes nothing: delete it in "
            "the console only if it holds nothing, then run `uv run invoke up` again"
        ]
    delete = shlex.join(
        [
            "gcloud",
            "compute",
            "instances",
            "delete",
            settings.vm_name,
            f"--zone={settings.zone}",
            f"--project={settings.project}",
            "--quiet",
        ]
    )
    return [
        f"Compute Engine may have made VM {settings.vm_name} outside Pulumi's state (a request that outlived "
        "its create timeout goes on, and the VM is billed once it runs); Pulumi cannot manage it, and a new one "
        f"cannot take its name or data disk: delete it with `{delete}` (the data disk stays: tpu-grpo attaches "
        "it with auto-delete off), then run `uv run invoke up` again"
    ]


def google_credentials() -> str | None:
    """Where the Google provider would find credentials, or None (it tries these in order)."""
    for variable in ("GOOGLE_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN"):
        if os.environ.get(variable):
            return f"${variable}"
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:  # a path: credentials only when there is a file to read
        readable = os.access(path, os.R_OK) and Path(path).is_file()
        return f"$GOOGLE_APPLICATION_CREDENTIALS ({path})" if readable else None
    gcloud_dir = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    adc = gcloud_dir / "application_default_credentials.json"
    return str(adc) if adc.is_file() else None


def missing_for_up(settings: Settings) -> list[str]:
    """Each thing `pulumi up` still needs, as 'what: how to get it'; empty when ready."""
    missing = [f"setting {error}" for error in settings.pending]
    pulumi = shutil.which("pulumi")
    if not pulumi:
        missing.append("the Pulumi CLI: install it (pulumi.com/docs/install) and put `pulumi` on PATH")
    elif subprocess.run([pulumi, "whoami"], capture_output=True).returncode != 0:
        missing.append("a Pulumi backend login: run `pulumi login` (or `pulumi login --local`)")
    passphrase = passphrase_missing(settings.stack)
    if passphrase:
        missing.append(f"the stack's passphrase: {passphrase}")
    if not google_credentials():
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        missing.append(
            f"Google Cloud credentials: $GOOGLE_APPLICATION_CREDENTIALS names {named}, which is no readable "
            "file: point it at your key file, or unset it and run `gcloud auth application-default login`"
            if named
            else "Google Cloud credentials: run `gcloud auth application-default login`"
        )
    if settings.tpu_slice and not shutil.which(AUTH_PLUGIN):
        missing.append(
            f"GKE's credential plugin, with which Pulumi and the tasks reach the slice's cluster: "
            f"gcloud components install {AUTH_PLUGIN} (or apt-get install google-cloud-cli-{AUTH_PLUGIN})"
        )
    return missing


def error_messages(event_log: Path) -> list[str]:
    """The error diagnostics of a Pulumi engine event log (`--event-log`, one JSON event a line)."""
    messages = []
    for line in event_log.read_text().splitlines() if event_log.is_file() else []:
        try:
            diagnostic = json.loads(line).get("diagnosticEvent") or {}
        except json.JSONDecodeError:
            continue  # the last line may be cut short if the CLI was killed
        if diagnostic.get("severity") == "error":
            messages.append(diagnostic.get("message", ""))
    return messages


def explain(messages: list[str], obtained: Capacity = CAPACITIES[DEFAULT]) -> list[str]:
    """What each known Compute Engine error in these messages means, once each; a zone out of capacity means
    what it means for the capacity `obtained`, whichever of Google's messages says so."""
    found = []
    for message in messages:
        refusal = classify(message)  # each of Google's words for it (refusals.py)
        meaning = refusal.fix or (obtained.no_capacity if refusal.kind == STOCKOUT else None)
        if meaning and meaning not in found:
            found.append(meaning)
    return found


#: The variable that gives the Pulumi CLI a stack's passphrase, which every message of its passphrase secrets
#: manager names (pkg/secrets/passphrase/manager.go: not set, or incorrect); or its _FILE.
PASSPHRASE_ENV = "PULUMI_CONFIG_PASSPHRASE"


def passphrase_missing(stack: str) -> str | None:
    """What to do when the stack's secrets are under a passphrase (`stack_file.salted`) and no variable gives it, or
    None. `pulumi refresh` and `up` ask for it at the terminal: a person can answer, a recovery hours into a run
    cannot. The CLI's readPassphrase (pulumi/pulumi, pkg/secrets/passphrase/manager.go) takes
    PULUMI_CONFIG_PASSPHRASE whenever it is set, even empty, and PULUMI_CONFIG_PASSPHRASE_FILE only when not empty."""
    given = os.environ.get(PASSPHRASE_ENV) is not None or os.environ.get(f"{PASSPHRASE_ENV}_FILE")
    if not salted(stack, project_root()) or given:
        return None
    return (
        f"stack '{stack}' keeps its secrets under the passphrase `pulumi stack init` asked for, which the "
        "tasks cannot type: export PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE="
        "FILE) before `uv run invoke`"
    )


def _pulumi_json(*args: str):
    """The JSON a read-only Pulumi CLI command prints, or None (no CLI, no stack, nothing made yet). A CLI that
    wants the stack's passphrase to read it (`stack output` did until pulumi/pulumi#23820, 2026-07) is said so, not
    taken for a stack with nothing in it."""
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        return None
    done = subprocess.run([pulumi, *args], capture_output=True, text=True, cwd=project_root())
    if done.returncode and PASSPHRASE_ENV in done.stderr:
        said = done.stderr.strip().splitlines()[-1].removeprefix("error: ")
        raise UserError(
            f"the Pulumi CLI could not read stack '{args[args.index('--stack') + 1]}': {said}; fix: "
            "export PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE (the one `pulumi stack init` asked for), or "
            "PULUMI_CONFIG_PASSPHRASE_FILE=FILE"
        )
    try:
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    except json.JSONDecodeError:
        return None


def outputs(stack: str) -> dict:
    """The stack's outputs from its last update (`pulumi stack output --json`); {} when there are none."""
    return _pulumi_json("stack", "output", "--json", "--stack", stack) or {}


def state_resources(stack: str) -> list[dict]:
    """The resources of the stack's state as its last update (and refresh) left them (`pulumi stack export`); []
    with no CLI or nothing made yet."""
    state = _pulumi_json("stack", "export", "--stack", stack) or {}
    return state.get("deployment", {}).get("resources") or []


def instance_state(stack: str) -> tuple[str, str] | None:
    """(URN, Compute Engine status) of the stack's VM as its state records it, or None."""
    for resource in state_resources(stack):
        if resource.get("type") == INSTANCE_TYPE:
            return resource["urn"], (resource.get("outputs") or {}).get("currentStatus", "")
    return None


def zone_of(resources: list[dict], type_: str) -> str | None:
    """The zone of the state's resource of this type (the data disk, a move's snapshot), or None."""
    for resource in resources:
        if resource.get("type") == type_:
            zone = (resource.get("outputs") or resource.get("inputs") or {}).get("zone") or ""
            return zone.rsplit("/", 1)[-1] or None  # a self link's last part
    return None


def preview(settings: Settings, declared: list | None = None, resources: list[dict] | None = None) -> list:
    """What `pulumi up` would replace or delete (infra/replacements.py): the stack's state as the last update (and
    refresh) left it (`resources`, or read now) against what the program declares now (`declared`, or the program
    run offline on the stack file); [] with no CLI or nothing made yet."""
    if resources is None:
        resources = state_resources(settings.stack)
    if not resources:
        return []
    from infra import offline
    from tpu_grpo.config.stack_file import read_stack_file

    if declared is None:
        _, declared, _ = offline.run(read_stack_file(settings.stack, project_root()), settings.stack, lenient=True)
    return replacements.diff(resources, declared)


def stays(resources: list[dict], declared: list) -> list[str]:
    """What the stack file now puts elsewhere and the program keeps where it was made (it ignores the change): the
    bucket's location (infra/common.py's declare_bucket), a line each; [] with no state."""
    before = {(r["type"], r["urn"].rsplit("::", 1)[-1]): r.get("inputs") or {} for r in resources}
    return [
        f"Bucket {r.name} stays in {was}, where it was made (a bucket cannot move), not {r.inputs['location']}: the "
        "VM reads and writes its runs across regions"
        for r in declared
        if r.type == replacements.BUCKET
        and (was := before.get((r.type, r.name), {}).get("location"))
        and was != r.inputs.get("location")
    ]


def describe(change) -> str:
    """One line for a replacement or deletion: what, why, and what it means."""
    kind = change.type.rsplit(":", 1)[-1]
    if change.action == "delete":
        meaning = (
            f"the data disk is DELETED with all it holds; {RELEASED_WHEN}"
            if change.type == replacements.DISK
            else "it is deleted"
        )
        return f"{kind} {change.name} is no longer declared: {meaning}"
    if change.action == "strip":
        return (
            f"{kind} {change.name} is no longer declared, and deleting it removes the very grant the update "
            "declares under another name (an IAM member's delete removes its binding): refused"
        )
    if change.action == "forget":
        return f"{kind} {change.name} is no longer declared: it leaves the stack and stays in the project (retained)"
    if change.action == "recreate nodes":
        return (
            f"{kind} {change.name} ({change.because()}): updated in place, and GKE makes its nodes anew to apply "
            "it (a job running on them stops; the runs stay in the bucket)"
        )
    return f"{kind} {change.name} ({change.because()}): {REPLACING.get(change.type, 'a new one is made')}"


def strips_a_grant(changes: list) -> bool:
    """Whether the update would delete a grant it also declares (a renamed IAM member whose old name no alias
    matches, as when vmName changes in the same update as an upgrade of tpu-grpo)."""
    return any(change.action == "strip" for change in changes)


def data_disk_lost(changes: list) -> bool:
    """Whether the update deletes the data disk (replaced by an empty one, or gone)."""
    return any(change.type == replacements.DISK and change.action in ("replace", "delete") for change in changes)


def releasable(
    changes: list, resources: list[dict], disk_checked: str | None, only: str | None = None
) -> dict[str, str]:
    """The protected resources of the state (`resources`) that this update deletes or replaces and that tpu-grpo's
    own checks let go, URN -> why: the data disk when `disk_checked` says why nothing is lost with it (every run saved
    elsewhere, an empty disk a search made, a move that snapshots it first: `only` that disk, by name); a move's
    snapshot once a data disk holds what it held. Anything else stays protected, and Pulumi's engine refuses."""
    going = {(change.type, change.name) for change in changes if change.action in ("replace", "delete")}
    disk_made = any(resource["type"] == replacements.DISK for resource in resources)
    why = {}
    for resource in resources:
        name = resource["urn"].rsplit("::", 1)[-1]
        if not resource.get("protect") or (resource["type"], name) not in going:
            continue
        if resource["type"] == replacements.DISK and disk_checked and only in (None, name):
            why[resource["urn"]] = disk_checked
        elif resource["type"] == replacements.SNAPSHOT and disk_made:
            why[resource["urn"]] = "a data disk made from it holds what it held"
    return why


def _state_edit(command: str, stack: str, urns: list[str], stdout=None) -> int:
    """`pulumi state protect|unprotect URN...` (pkg/cmd/pulumi/state/state_unprotect.go takes several URNs)."""
    return subprocess.run(["pulumi", "state", command, "--stack", stack, "--yes", *urns], stdout=stdout).returncode


@contextmanager
def released(stack: str, why: dict[str, str], say: Callable[[str], None], stdout=None) -> Iterator[None]:
    """The protected resources `why` names, unprotected in the stack's state for the update (or destroy) inside, and
    protected again after it where it left them (a failed, declined or cancelled update): the program declares them
    protected, so what the update made anew is protected already. Pulumi's engine allows a replacement only when the
    old or the new resource is unprotected, and a delete only when the old one is (step_generator.go, step.go)."""
    for urn, reason in why.items():
        say(f"releases {urn.rsplit('::', 1)[-1]} (protected): {reason}")
    if why and _state_edit("unprotect", stack, list(why), stdout):
        raise UserError(f"could not release {', '.join(why)} in stack '{stack}': see Pulumi's message above")
    try:
        yield
    finally:
        left = [r["urn"] for r in state_resources(stack) if r["urn"] in why and not r.get("protect")] if why else []
        if left:
            _state_edit("protect", stack, left, stdout)


class Cancelled(UserError):
    """Ctrl-C during an update: Pulumi cancelled it (what it had started finished), and the state says what may be
    pending."""

    exit_code = INTERRUPTED


def run_pulumi(argv: list[str], *, asks: bool, stdout=None, env: dict | None = None) -> int:
    """A Pulumi CLI command to its end, whatever Ctrl-C does here: CPython's subprocess.run kills its child 0.25 s
    after a KeyboardInterrupt (`_sigint_wait_secs`), before Pulumi's own cancel can finish, so a create it had sent
    would go on in the cloud outside the state. A command that `asks` (Pulumi's question at this terminal) stays in
    the terminal's process group, which Ctrl-C reaches as a whole; any other runs in its own session, and this
    process forwards it one SIGINT (Pulumi's cancel: a second one terminates it,
    pkg/cmd/pulumi/operations' cancellationScope). Either way this process waits for Pulumi, then raises Cancelled."""
    process = subprocess.Popen(argv, stdout=stdout, env=env, start_new_session=not asks)
    try:
        return process.wait()
    except KeyboardInterrupt:
        if not asks:
            os.killpg(process.pid, signal.SIGINT)
        while process.poll() is None:
            try:
                process.wait()
            except KeyboardInterrupt:
                continue  # Pulumi's cancel is under way; a second SIGINT of a terminal reached it too
    raise Cancelled(
        f"`{' '.join(argv[:2])}` cancelled (Ctrl-C): Pulumi finished what it had started and stopped; "
        f"{pending_said(argv[argv.index('--stack') + 1]) if '--stack' in argv else ''}"
        "fix: run it again; `uv run invoke up` first adopts a create the cloud finished (or drops one it did not)"
    )


#: The id the provider gives each billed resource a create may leave pending, from what its inputs name (terraform-
#: provider-google's importers: resource_compute_instance.go `projects/{{project}}/zones/{{zone}}/instances/{{name}}`,
#: and the same forms for the disk, the snapshot, the network, the subnetwork and the firewall; a bucket's id is its
#: name; resource_container_cluster.go's containerClusterFullName and resource_container_node_pool.go's
#: `projects/%s/locations/%s/clusters/%s/nodePools/%s`). A grant has none here: a refresh clears its pending create
#: (pulumi/pulumi#8435), and the next update adds the binding again, which Cloud IAM takes whether it holds it or not.
PENDING_ID = {
    replacements.INSTANCE: "projects/{project}/zones/{zone}/instances/{name}",
    replacements.DISK: "projects/{project}/zones/{zone}/disks/{name}",
    replacements.SNAPSHOT: "projects/{project}/global/snapshots/{name}",
    "gcp:compute/network:Network": "projects/{project}/global/networks/{name}",
    "gcp:compute/subnetwork:Subnetwork": "projects/{project}/regions/{region}/subnetworks/{name}",
    "gcp:compute/firewall:Firewall": "projects/{project}/global/firewalls/{name}",
    replacements.BUCKET: "{name}",
    replacements.CLUSTER: "projects/{project}/locations/{location}/clusters/{name}",
    replacements.NODE_POOL: "projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}",
}


def pending_creates(stack: str) -> list[tuple[str, str | None]]:
    """The creates an interrupted update left pending in the stack's state (`pending_operations` of type
    "creating"), each (URN, the provider's id of what it would have made, or None where tpu-grpo cannot name it)."""
    state = _pulumi_json("stack", "export", "--stack", stack) or {}
    found = []
    for operation in state.get("deployment", {}).get("pending_operations") or []:
        resource = operation.get("resource") or {}
        if operation.get("type") != "creating" or "urn" not in resource:
            continue
        inputs = {key: str(value) for key, value in (resource.get("inputs") or {}).items()}
        form = PENDING_ID.get(resource.get("type", ""))
        try:
            found.append((resource["urn"], form.format(**inputs) if form else None))
        except KeyError:
            found.append((resource["urn"], None))
    return found


def pending_said(stack: str) -> str:
    """What an interrupted update left pending, for its message; "" when nothing."""
    pending = pending_creates(stack)
    named = ", ".join(urn.rsplit("::", 1)[-1] for urn, _ in pending)
    return f"pending in the state: the create of {named}, which the cloud may finish (and bill); " if pending else ""


def select_and_refresh(settings: Settings, stdout=None) -> int:
    """Select (or create) the stack and refresh its state, so that the preview and `up` (which plans from it, and so
    refreshes no more) see what the cloud has now (a VM Compute Engine deleted or stopped), adopting what an
    interrupted update left pending; forget what tpu-grpo keeps that an earlier release's state does not mark so
    (`forget_unmarked`), which the update could otherwise delete; and protect what it protects that such a state
    does not mark (`protect_unmarked`), which the engine would otherwise let this update delete."""
    selected = subprocess.run(["pulumi", "stack", "select", "--create", settings.stack], stdout=stdout)
    if selected.returncode:
        return selected.returncode
    adopt = [flag for urn, id_ in pending_creates(settings.stack) if id_ for flag in adopting(urn, id_)]
    refresh = ["pulumi", "refresh", "--yes", "--skip-preview", "--stack", settings.stack, *adopt]
    run_pulumi(refresh, asks=False, stdout=stdout)
    resources = state_resources(settings.stack)
    return forget_unmarked(settings.stack, stdout, resources) or protect_unmarked(settings.stack, stdout, resources)


def adopting(urn: str, id_: str) -> list[str]:
    """`pulumi refresh`'s flags that settle a pending create: the resource it would have made, by its id, read back
    (pkg/cmd/pulumi/operations/refresh.go: `--import-pending-creates`, pairs of URN and ID), which the refresh then
    keeps if the cloud made it and drops if not."""
    return ["--import-pending-creates", urn, "--import-pending-creates", id_]


#: What the program protects (infra/tpu_host.py): the data disk, and a move's snapshot.
PROTECTED_TYPES = (replacements.DISK, replacements.SNAPSHOT)


def protect_unmarked(stack: str, stdout=None, resources: list[dict] | None = None) -> int:
    """Protect in the stack's state what the program protects and the state does not mark so: the engine decides a
    replacement or a delete on the state's bit (step_generator.go: `new.Protect && old.Protect`; DeleteStep:
    `old.Protect`), which only an update writes, so the first update over an earlier release's state would not be
    guarded; the CLI's exit code."""
    resources = state_resources(stack) if resources is None else resources
    unmarked = [r["urn"] for r in resources if r["type"] in PROTECTED_TYPES and not r.get("protect")]
    return _state_edit("protect", stack, unmarked, stdout) if unmarked else 0


#: Update plans (`pulumi preview --save-plan`, `pulumi up --plan`) need no experimental mode: the engine makes a plan
#: whenever a plan file is given (pulumi/pulumi#8897, 2022; preview.go at v3.259.0: `GeneratePlan:
#: env.Experimental.Value() || planFilePath != ""`), and `up --plan`, hidden in the help outside it, is read all the
#: same (up.go: `if planFilePath != ""`). PULUMI_EXPERIMENTAL would turn on every other experimental behaviour too.


def stopped_vm(settings: Settings, resources: list[dict]) -> tuple[str, str] | None:
    """(URN, status) of the stack's VM when the state says Compute Engine stopped it (an idle stop, a preemption):
    `up` replaces it, as no TPU VM is started again whatever its capacity."""
    for resource in [] if settings.tpu_slice else resources:
        status = (resource.get("outputs") or {}).get("currentStatus")
        if resource.get("type") == INSTANCE_TYPE and status in STOPPED:
            return resource["urn"], status
    return None


def engine_changes(settings: Settings, declared: list, replace: list[str], env: dict) -> tuple[int, list, list[str]]:
    """What the next update replaces or deletes, by Pulumi's own preview (`pulumi preview --json`: the engine's steps
    and the provider's diff, CustomizeDiff included): its exit code, the changes (replacements.from_steps) and its
    error messages (a protected resource it would replace, a refusal of the cloud)."""
    done = _preview(settings.stack, replace, {**os.environ, **env}, stderr=subprocess.PIPE)
    errors = diagnosed(done.stdout)
    if done.returncode and not errors:
        errors = done.stderr.strip().splitlines()[-1:] or [f"pulumi preview exited {done.returncode}"]
    return done.returncode, replacements.from_steps(digest_of(done.stdout).get("steps") or [], declared), errors


def _preview(stack: str, replace: list[str], env: dict, *flags: str, stderr=None) -> subprocess.CompletedProcess:
    """`pulumi preview --json` of the next update, its JSON read back (`digest_of`); its errors go to this terminal
    unless `stderr` takes them."""
    return subprocess.run(
        ["pulumi", "preview", "--json", "--stack", stack, *replace, *flags],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=project_root(),
        env=env,
    )


def digest_of(printed: str) -> dict:
    """What `pulumi preview --json` printed, or {} where it printed no JSON (a CLI that failed before the engine)."""
    try:
        digest = json.loads(printed) if printed.strip() else {}
    except json.JSONDecodeError:
        return {}
    return digest if isinstance(digest, dict) else {}


def diagnosed(printed: str) -> list[str]:
    """The error diagnostics of what `pulumi preview --json` printed."""
    diagnostics = digest_of(printed).get("diagnostics") or []
    return [d.get("message", "") for d in diagnostics if isinstance(d, dict) and d.get("severity") == "error"]


def up(
    settings: Settings,
    *,
    yes: bool,
    say=print,
    stdout=None,
    replace: list[str] | None = None,
    env: dict | None = None,
    checked: list[replacements.Change] | None = None,
    declared: list | None = None,
) -> tuple[int, list[str]]:
    """The update Pulumi's preview shows, and no other: `pulumi preview --save-plan`, then `pulumi up --plan` (the
    engine stops at the first step the plan does not hold), on the stack `select_and_refresh` refreshed. `checked`:
    the replacements and deletes tpu-grpo's checks passed on (`engine_changes`, before they released what they may
    lose); a plan that holds others is not run (UPDATE_CHANGED). `replace`:
    `--replace URN` of a stopped VM (`stopped_vm`); `env`: this update's place (PLACE_ENV). `yes`: the user has agreed
    already (`invoke up --yes`, a recovery nobody watches), so no question; otherwise Pulumi shows its preview and asks.

    Returns the exit code and the error messages of Pulumi's event log, or of the preview (what they mean:
    `explanations`). The CLI's output goes to this terminal, or to `stdout` (a file: stderr when this process's
    stdout is JSON).
    """
    stack, replace = settings.stack, replace or []
    agreed = ["--yes", "--skip-preview"] if yes else []
    env = {**os.environ, **EVENT_LOG_ENV, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="tpu-grpo-") as folder:
        plan, event_log = Path(folder) / "plan.json", Path(folder) / "events.jsonl"
        planned = _preview(stack, replace, env, "--save-plan", str(plan))  # its errors reach this terminal too
        if planned.returncode:
            return planned.returncode, diagnosed(planned.stdout) or [f"pulumi preview exited {planned.returncode}"]
        now = _what_goes(replacements.from_steps(digest_of(planned.stdout).get("steps") or [], declared or []))
        if checked is not None and now != _what_goes(checked):
            return 1, [
                f"{UPDATE_CHANGED}: it now replaces or deletes {now or 'nothing'}, checked "
                f"{_what_goes(checked) or 'nothing'}; nothing was changed"
            ]
        code = run_pulumi(
            ["pulumi", "up", "--stack", stack, "--plan", str(plan), *replace, *agreed, "--event-log", str(event_log)],
            asks=not yes and sys.stdin.isatty(),
            stdout=stdout,
            env=env,
        )
        return code, error_messages(event_log) if code else []


def _what_goes(changes: list[replacements.Change]) -> list[tuple[str, str, str]]:
    """What an update replaces or deletes, each (type, name, action), in one order to compare and to say."""
    return sorted({(c.type, c.name, c.action) for c in changes})


#: The update the plan would run is not the one tpu-grpo's checks saw: the state or the stack file changed between.
UPDATE_CHANGED = "the update changed after tpu-grpo checked it (another update, or the stack file edited meanwhile)"


def explanations(settings: Settings, messages: list[str]) -> list[str]:
    """What the known errors of a failed `up` mean, for the capacity tried."""
    return [*explain(messages, settings.obtained), *outside_state(settings, messages)]


def require_cli() -> None:
    if not shutil.which("pulumi"):
        raise UserError("no pulumi CLI on PATH; fix: install it (pulumi.com/docs/install)")


def kept(declared: list) -> list[str]:
    """What `pulumi destroy` leaves of what the program declares (retained on delete), a line each, in one order
    (the program registers its resources in no fixed order)."""
    return sorted(
        f"{r.type.rsplit(':', 1)[-1]} {r.name}: {KEPT.get(r.type, 'kept')}"
        for r in declared
        if r.options.retain_on_delete
    )


def unmarked_retained(resources: list[dict]) -> list[str]:
    """The URNs of the state's resources of a type tpu-grpo keeps (KEPT) that the state does not mark retained: an
    earlier release made them so (the project-wide role; the bucket was retained from its first release), and
    Pulumi acts on the state's mark for what it deletes."""
    return [r["urn"] for r in resources if r["type"] in KEPT and not r.get("retainOnDelete")]


def forget_unmarked(stack: str, stdout=None, resources: list[dict] | None = None) -> int:
    """Forget from the stack's state (`pulumi state delete`, which deletes nothing in the cloud) what tpu-grpo keeps
    and the state does not mark so, before an update or a destroy could delete it, with what depends on it (a bucket's
    grants, which the CLI otherwise refuses to leave behind; the next update declares them again); the CLI's exit
    code. `resources`: the state, when read already."""
    for urn in unmarked_retained(state_resources(stack) if resources is None else resources):
        forgot = subprocess.run(  # its grants too, which stay in the cloud (state_delete.go refuses it without)
            ["pulumi", "state", "delete", "--stack", stack, "--yes", "--target-dependents", urn], stdout=stdout
        )
        if forgot.returncode:
            return forgot.returncode
    return 0


def destroy(stack: str, why: str, yes: bool = False, say: Callable[[str], None] = print) -> int:
    """`pulumi destroy` on the stack, attached to this terminal: it shows what goes and asks, unless `yes`. What
    tpu-grpo keeps and the state does not mark so is forgotten first (`forget_unmarked`), so that it stays; what it
    protects is released for the destroy, `why` being `down`'s check that passed (or --force)."""
    resources = state_resources(stack)  # what forget_unmarked forgets is never what the program protects
    forgot = forget_unmarked(stack, resources=resources)
    if forgot:
        return forgot
    protected = {r["urn"]: why for r in resources if r.get("protect")}
    with released(stack, protected, say):
        return run_pulumi(
            ["pulumi", "destroy", "--stack", stack, *(["--yes", "--skip-preview"] if yes else [])],
            asks=not yes and sys.stdin.isatty(),
        )

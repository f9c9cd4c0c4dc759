"""Where things live on the TPU host, in one place: the jobs read these, and the playbook gets
them as values the engine sets (not `--var`s), so what provisioning makes is what the jobs use."""

VENV = "~/maxtext_venv"  # the tutorial's
TOKEN_FILE = "~/.cache/huggingface/token"  # where huggingface_hub looks for the token
ROOT = "~/tpu-grpo"  # jobs, step records, runs and saved models; a link to the data disk
BASE_MODELS = f"{ROOT}/base-models"  # the Hub's models the conversion reads, downloaded by provisioning
COMPILE_CACHES = (
    f"{ROOT}/compile-cache"  # JAX's and vLLM's compiled programs, kept for the next start (jobs/maxtext.py)
)
PROVISIONING = f"{ROOT}/provisioning"  # a record of each provisioning run that changed something
TPU_LOCK = f"{ROOT}/tpu.lock"  # held by a running job's processes: one TPU job at a time
#: Leases of work that holds no TPU lock and no terminal, yet must keep the VM up: a fetch, a provisioning run and its
#: model download. Each is a file touched every minute while the work goes on; the idle stop counts one touched in
#: the last few minutes, so a laptop that went away lets its lease lapse. On the boot disk, beside ROOT: provisioning
#: makes ROOT a link to the data disk while its own lease is held.
BUSY = "~/.tpu-grpo-busy"
#: The idle stop counts a lease touched in the last LEASE_FRESH_MINUTES (playbooks/host.yml's check); a lease is
#: touched three times in that window (hosts.busy), so a touch lost to a slow link never lets work in flight lapse.
LEASE_FRESH_MINUTES = 3
LEASE_EVERY_S = LEASE_FRESH_MINUTES * 60 // 3
IDLE_CONF = "/etc/tpu-grpo/idle.conf"  # the idle-stop timer's settings (playbooks/host.yml, "idle stop")


def playbook_values() -> dict[str, str]:
    """The paths as playbook values; the home-relative ones without their `~/`."""
    return {
        "venv": VENV,
        "token_file": TOKEN_FILE.removeprefix("~/"),
        "jobs_root": ROOT.removeprefix("~/"),
        "tpu_lock": TPU_LOCK.removeprefix("~/"),
        "busy": BUSY.removeprefix("~/"),
        "lease_fresh_minutes": str(LEASE_FRESH_MINUTES),
        "idle_conf": IDLE_CONF,
        "base_models": BASE_MODELS.removeprefix("~/"),
    }

"""An idle VM stops itself: `invoke provision` installs a systemd timer whose check powers the VM
off after `idleStopMinutes` without a tpu-grpo job or a terminal session (a person's SSH login; tpu-grpo's own
connections have no terminal). Tested on throwaway hosts (a root file system and namespaces of their own,
tests/host/rootfs.py), so the units, the script and the configuration land there, never on this machine; the check
is run as the timer would run it (as root, in the host's namespaces; no systemd here), with the power-off pointed at
a recorder."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import fabric
import pytest

from tests.host.sshd import free_port
from tests.support import FAST, statuses, wait_for

CHECK = "/usr/local/sbin/tpu-grpo-idle"
CONF = "etc/tpu-grpo/idle.conf"
UNITS = ["etc/systemd/system/tpu-grpo-idle.service", "etc/systemd/system/tpu-grpo-idle.timer"]
LAST_ACTIVE = "run/tpu-grpo-last-active"
RECORDER = "/usr/local/bin/record-poweroff"
POWEROFFS = "var/log/tpu-grpo-poweroffs"


def with_idle_stop(host):
    """`host` provisioned with a 1-minute idle stop whose power-off only records that it ran: (the host, its
    root as this machine sees it, the provisioning report)."""
    root = host.host.vm.root
    (root / RECORDER.lstrip("/")).write_text(f"#!/bin/sh\ndate +%s >> /{POWEROFFS}\n")
    (root / RECORDER.lstrip("/")).chmod(0o755)
    variables = ["idle_stop_minutes=1", f"idle_poweroff={RECORDER}"]
    args = [arg for item in variables for arg in ("--var", item)]
    done = host.host.invoke("provision", "--tags", "idle", "--json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return host, root, done


@pytest.fixture
def idle_host(workload_host):
    return with_idle_stop(workload_host)


def run_check(host, idle_seconds_ago: int | None) -> subprocess.CompletedProcess:
    """Run the timer's check on the host as systemd would (as root, in the host's own namespaces: its processes
    and terminals), after it was last busy so long ago."""
    if idle_seconds_ago is not None:
        (host.host.vm.root / LAST_ACTIVE).write_text(f"{int(time.time()) - idle_seconds_ago}\n")
    return host.host.on_host(CHECK)


def fired(root: Path) -> int:
    path = root / POWEROFFS
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_timer_and_its_check_are_installed_and_valid(idle_host):
    host, root, done = idle_host
    assert statuses(done) == {"idle stop": "changed", "no idle stop": "skipped"}
    assert "IDLE_MINUTES=1" in (root / CONF).read_text().splitlines()
    verified = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *(f"/{unit}" for unit in UNITS)], capture_output=True, text=True
    )
    assert (verified.returncode, verified.stderr) == (0, ""), verified.stderr
    timer = (root / UNITS[1]).read_text()
    assert "OnUnitActiveSec=1min" in timer and "WantedBy=timers.target" in timer
    assert "OnBootSec=1min" in timer.splitlines()  # a first trigger: a freshly booted VM is watched too
    again = host.host.invoke(
        "provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=1", "--var", f"idle_poweroff={RECORDER}"
    )
    assert statuses(again)["idle stop"] == "ok"
    longer = host.host.invoke(
        "provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=7", "--var", f"idle_poweroff={RECORDER}"
    )
    assert statuses(longer)["idle stop"] == "changed"  # another idleStopMinutes is applied, not kept as it was
    assert "IDLE_MINUTES=7" in (root / CONF).read_text().splitlines()
    off = host.host.invoke("provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=0")
    assert statuses(off) == {"idle stop": "skipped", "no idle stop": "changed"}
    assert not any((root / path).exists() for path in (CONF, *UNITS, CHECK.lstrip("/")))


def test_it_fires_when_idle_and_not_before(idle_host):
    host, root, _ = idle_host
    (root / LAST_ACTIVE).unlink(missing_ok=True)
    assert run_check(host, None).returncode == 0 and fired(root) == 0  # first look: counting starts now
    assert run_check(host, 30).returncode == 0 and fired(root) == 0  # idle 30 s of 60
    result = run_check(host, 61)
    assert result.returncode == 0 and fired(root) == 1
    assert "no job, terminal session or transfer since" in result.stdout


def test_a_running_job_keeps_the_vm_up(idle_host):
    host, root, _ = idle_host
    host.control(hold_s=60)
    started = host.invoke("convert", "--detach")
    assert started.returncode == 0, started.stderr
    try:
        assert run_check(host, 3600).returncode == 0 and fired(root) == 0
        assert int(time.time()) - int((root / LAST_ACTIVE).read_text()) < 30  # the job counted as activity
    finally:
        assert host.invoke("cancel").returncode == 0
    assert run_check(host, 3600).returncode == 0 and fired(root) == 1


def connect(host) -> fabric.Connection:
    session = fabric.Connection(
        "127.0.0.1",
        user=host.host.user.name,
        port=host.host.vm.port,
        connect_kwargs={"key_filename": str(host.host.key)},
    )
    session.client.load_host_keys(str(host.host.state / "known_hosts"))
    session.open()
    return session


def test_a_persons_terminal_session_keeps_the_vm_up(idle_host):
    """A login with a terminal (what `ssh HOST` gives a person) keeps the VM up while it is open."""
    host, root, _ = idle_host
    session = connect(host)
    shell = session.client.invoke_shell()  # a pseudo-terminal and a login shell, as `ssh HOST` asks for
    try:
        wait_for(lambda: "pts/" in host.host.on_host("ps", "-e", "-o", "tty=").stdout, 30, "the login's terminal")
        assert run_check(host, 3600).returncode == 0 and fired(root) == 0
    finally:
        shell.close()
        session.close()
    wait_for(lambda: "pts/" not in host.host.on_host("ps", "-e", "-o", "tty=").stdout, 30, "the login to end")
    assert run_check(host, 3600).returncode == 0 and fired(root) == 1


def test_tpu_grpos_own_connections_do_not_keep_the_vm_up(idle_host):
    """An `invoke tensorboard` left open on a laptop syncs every second and holds its connection; a command running
    over SSH without a terminal (as every task runs them): neither is a person, so the idle VM still stops."""
    host, root, _ = idle_host
    assert host.invoke("pipeline", "--run-name", "idle", "--batches", "2", *FAST).returncode == 0
    served = host.popen("tensorboard", "--run", "idle", "--port", str(free_port()), "--every", "1")
    session = connect(host)
    session.run("sleep 20", asynchronous=True, hide=True)  # a connection busy with a command
    try:
        assert served.stdout.readline().startswith("TensorBoard: ")  # syncing
        time.sleep(2)  # a sync or two while the check runs
        assert run_check(host, 3600).returncode == 0 and fired(root) == 1
    finally:
        served.kill()
        served.communicate(timeout=30)
        session.close()


def test_a_transfer_in_flight_keeps_the_vm_up_until_its_lease_lapses(idle_host):
    """A fetch (a 70B model takes hours over a home line) and a provisioning run hold neither the TPU lock nor a
    terminal: each keeps a lease fresh on the host while it works (hosts.busy, over a connection without a terminal),
    and the idle stop waits, however long ago the VM was last busy otherwise. The lease goes when the work ends; a
    laptop that went away leaves one that lapses after host_paths.LEASE_FRESH_MINUTES; one touched at its interval,
    a touch lost, is fresh still (the interval and the window are one fact: change either and this fails)."""
    from tpu_grpo.config import host_paths
    from tpu_grpo.host import hosts

    host, root, _ = idle_host
    busy = host.host.user.home / ".tpu-grpo-busy"
    assert busy.is_dir() and not any(busy.iterdir())  # the fixture's provisioning held one, and let it go
    session = connect(host)
    try:
        with hosts.busy(session, "fetch"):
            wait_for(lambda: any(busy.iterdir()), 30, "the fetch's lease")
            assert run_check(host, 3600).returncode == 0 and fired(root) == 0
    finally:
        session.close()
    assert not any(busy.iterdir())
    assert run_check(host, 3600).returncode == 0 and fired(root) == 1
    gone = busy / "fetch-of-a-laptop-that-went-away"
    gone.touch()
    assert run_check(host, 3600).returncode == 0 and fired(root) == 1  # fresh: waits
    # the check runs every minute: a lease is read at most a minute after its last touch, two intervals if one touch
    # was lost on the way
    os.utime(gone, (time.time() - 2 * host_paths.LEASE_EVERY_S - 59,) * 2)
    assert run_check(host, 3600).returncode == 0 and fired(root) == 1  # fresh: waits
    os.utime(gone, (time.time() - host_paths.LEASE_FRESH_MINUTES * 60 - 60,) * 2)
    assert run_check(host, 3600).returncode == 0 and fired(root) == 2  # lapsed


def test_status_says_when_the_vm_stops(idle_host):
    host, _, _ = idle_host
    before = int(time.time())
    result = host.invoke("status", "--json")
    assert result.returncode == 0, result.stderr
    idle = json.loads(result.stdout)["idle_stop"]
    assert idle["idle_minutes"] == 1 and before + 60 <= idle["stops_at_earliest"] <= time.time() + 60
    text = host.invoke("status")
    assert "idle stop: " in text.stdout and "powers itself off 1 minutes after its last job ends" in text.stdout


def test_a_wrong_idle_setting_is_one_line(idle_host):
    host, _, _ = idle_host
    result = host.host.invoke("provision", "--tags", "idle", "--var", "idle_stop_minutes=soon")
    assert result.returncode == 2
    assert result.stderr == (
        "error: --var idle_stop_minutes: idle_stop_minutes='soon' is not a whole number; "
        "fix: e.g. idle_stop_minutes=0\n"
    )


def test_status_on_a_stacks_vm_says_what_an_idle_stop_means_for_its_capacity(
    make_workload_host, bridge, spot_project, tmp_path
):
    """No --host: the VM is the stack's (its address from the stack's outputs, the Pulumi CLI's double), so status
    knows its capacity and says, in its table and in --json alike, what a stop means for it."""
    from tests.doubles.pulumi_cli import PulumiCli
    from tests.host.conftest import invoke_on_stack
    from tpu_grpo.catalog.capacity import CAPACITIES

    address = bridge.address("a")
    host = make_workload_host(address=address, port=22, netns=bridge.netns("a")).host
    cloud = PulumiCli(
        tmp_path / "cloud",
        {
            "external_ip": address,
            "ssh_user": host.user.name,
            "machine_type": "ct6e-standard-8t",
            "zone": "us-east5-b",
            "capacity": "spot",
        },
    )
    conf = host.vm.root / "etc/tpu-grpo/idle.conf"  # as the playbook's "idle stop" step writes it
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("# tpu-grpo idle stop\nIDLE_MINUTES=30\n")
    after_stop = CAPACITIES["spot"].after_stop
    out, err = invoke_on_stack(host, cloud, spot_project, "status", "--json").communicate(timeout=300)
    idle = json.loads(out)["idle_stop"]
    assert (idle["idle_minutes"], idle["after_stop"]) == (30, after_stop), err
    out, err = invoke_on_stack(host, cloud, spot_project, "status").communicate(timeout=300)
    assert f"at the earliest; then {after_stop}" in " ".join(out.split()), err


def test_a_pipeline_left_by_its_laptop_keeps_the_vm_up_to_its_last_step_then_the_vm_stops(idle_host):
    """The on-demand default (the /dev/shm store, an idle stop): the laptop gone just after the start, the check run
    again and again as the timer would, each time as if the VM had been idle for an hour, never fires while the chain
    has a step left (between its steps too), and fires once it has ended, the model saved on the data disk by then."""
    host, root, _ = idle_host
    host.control(line_delay_s=0.002)
    laptop = host.popen("pipeline", "--run-name", "alone", "--batches", "8", *FAST)
    wait_for(lambda: any(host.host.user.home.glob("tpu-grpo/jobs/*-convert")), what="the chain's first step")
    laptop.kill()
    laptop.communicate()
    [chain] = host.host.user.home.glob("tpu-grpo/jobs/*-pipeline")
    checks = 0
    while fired(root) == 0:
        assert run_check(host, 3600).returncode == 0
        checked = time.time()
        checks += 1
    ended = chain / "exit_code"  # the chain's wrapper writes it, then lets the TPU's lock go
    assert ended.exists() and ended.stat().st_mtime <= checked, "fired while the chain had a step left"
    assert ended.read_text().strip() == "0" and checks > 10
    saved = host.host.user.home / "tpu-grpo/models/alone"
    assert (saved / "SHA256SUMS").is_file() and (saved / "config.json").is_file()
    assert any((host.host.user.home / "tpu-grpo/runs/alone/tensorboard").rglob("events.out.tfevents.*"))


def test_a_training_alone_on_dev_shm_is_refused_where_the_vm_stops_itself(idle_host):
    """Its checkpoints would go with the idle stop, nothing having saved them: refused before it starts, with the
    pipeline (which saves first) as the fix; once the VM never stops itself, the same training starts."""
    host, root, _ = idle_host
    assert host.invoke("convert").returncode == 0
    jobs = sorted((host.host.user.home / "tpu-grpo/jobs").iterdir())
    refused = host.invoke("train", "--batches", "2")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        "error: a training alone keeps its checkpoints in /dev/shm, and this VM powers itself off 1 idle minutes "
        "after its last job, which empties it; fix: uv run invoke pipeline (it exports and saves the model on the "
        "data disk before the VM can stop), or set tpu-grpo:checkpointStore disk\n"
    )
    assert sorted((host.host.user.home / "tpu-grpo/jobs").iterdir()) == jobs and len(host.records()) == 1
    fix = refused.stderr.split("fix: uv run invoke ")[1].split(" (")[0]  # the first fix, as printed
    assert fix == "pipeline"
    fixed = host.invoke(*fix.split(), *FAST)  # the test host's small disks: the preflight's room, as elsewhere
    assert fixed.returncode == 0, fixed.stderr
    assert (host.host.user.home / "tpu-grpo/models").is_dir() and "save: model copied to" in fixed.stdout
    off = host.host.invoke("provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=0")
    assert off.returncode == 0, off.stderr
    assert host.invoke("train", "--batches", "2").returncode == 0

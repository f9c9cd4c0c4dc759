"""An idle VM stops itself: `invoke provision` installs a systemd timer whose check powers the VM
off after `idleStopMinutes` without a tpu-grpo job or an SSH session. Tested on a real host, the
check run as the timer would run it (no systemd here), with the power-off pointed at a recorder."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import fabric
import pytest

from tests.conftest import statuses

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the real SSH hosts need root (users, sudo)")

CHECK = "/usr/local/sbin/tpu-grpo-idle"
CONF = Path("/etc/tpu-grpo/idle.conf")
UNITS = [Path("/etc/systemd/system/tpu-grpo-idle.service"), Path("/etc/systemd/system/tpu-grpo-idle.timer")]
LAST_ACTIVE = Path("/run/tpu-grpo-last-active")


@pytest.fixture
def idle_host(workload_host, tmp_path):
    """A workload host provisioned with a 1-minute idle stop whose power-off only records that it ran."""
    host = workload_host
    poweroffs = tmp_path / "poweroffs"
    recorder = tmp_path / "poweroff"
    recorder.write_text(f"#!/bin/sh\ndate +%s >> {poweroffs}\n")
    recorder.chmod(0o755)
    variables = [f"idle_stop_minutes=1", f"idle_poweroff={recorder}", f"idle_ssh_port={host.host.sshd.port}"]
    args = [arg for item in variables for arg in ("--var", item)]
    done = host.host.invoke("provision", "--tags", "idle", "--json", *args)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield host, poweroffs, done
    finally:
        off = host.host.invoke("provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=0")
        for path in (CONF, *UNITS, Path(CHECK), LAST_ACTIVE):
            path.unlink(missing_ok=True)
        assert off.returncode == 0, off.stdout


def run_check(idle_seconds_ago: int | None) -> subprocess.CompletedProcess:
    """Run the timer's check as systemd would (as root), after the VM was last busy so long ago."""
    if idle_seconds_ago is not None:
        LAST_ACTIVE.write_text(f"{int(time.time()) - idle_seconds_ago}\n")
    return subprocess.run([CHECK], capture_output=True, text=True, timeout=30)


def fired(poweroffs: Path) -> int:
    return len(poweroffs.read_text().splitlines()) if poweroffs.exists() else 0


def test_the_timer_and_its_check_are_installed_and_valid(idle_host):
    host, _, done = idle_host
    assert statuses(done) == {"idle stop": "changed", "no idle stop": "skipped"}
    assert "IDLE_MINUTES=1" in CONF.read_text().splitlines()
    verified = subprocess.run(["systemd-analyze", "verify", *map(str, UNITS)], capture_output=True, text=True)
    assert (verified.returncode, verified.stderr) == (0, ""), verified.stderr
    timer = UNITS[1].read_text()
    assert "OnUnitActiveSec=1min" in timer and "WantedBy=timers.target" in timer
    again = host.host.invoke("provision", "--tags", "idle", "--json", "--var", "idle_stop_minutes=1", "--var",
                             f"idle_poweroff={CONF.read_text().split(chr(39))[1]}", "--var",
                             f"idle_ssh_port={host.host.sshd.port}")
    assert statuses(again)["idle stop"] == "ok"


def test_it_fires_when_idle_and_not_before(idle_host):
    _, poweroffs, _ = idle_host
    LAST_ACTIVE.unlink(missing_ok=True)
    assert run_check(None).returncode == 0 and fired(poweroffs) == 0  # first look: counting starts now
    assert run_check(30).returncode == 0 and fired(poweroffs) == 0  # idle 30 s of 60
    result = run_check(61)
    assert result.returncode == 0 and fired(poweroffs) == 1
    assert "no job and no SSH session since" in result.stdout


def test_a_running_job_keeps_the_vm_up(idle_host):
    host, poweroffs, _ = idle_host
    host.control(hold_s=60)
    started = host.invoke("convert", "--detach")
    assert started.returncode == 0, started.stderr
    try:
        assert run_check(3600).returncode == 0 and fired(poweroffs) == 0
        assert int(time.time()) - int(LAST_ACTIVE.read_text()) < 30  # the job counted as activity
    finally:
        assert host.invoke("cancel").returncode == 0
    assert run_check(3600).returncode == 0 and fired(poweroffs) == 1


def test_an_open_ssh_session_keeps_the_vm_up(idle_host):
    host, poweroffs, _ = idle_host
    session = fabric.Connection("127.0.0.1", user=host.host.user.name, port=host.host.sshd.port,
                                connect_kwargs={"key_filename": str(host.host.key)})
    session.client.load_host_keys(str(host.host.state / "known_hosts"))
    session.open()
    try:
        assert run_check(3600).returncode == 0 and fired(poweroffs) == 0
    finally:
        session.close()
    time.sleep(0.5)  # the server side of the connection closes
    assert run_check(3600).returncode == 0 and fired(poweroffs) == 1


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
    assert result.stderr == ("error: --var idle_stop_minutes: idle_stop_minutes='soon' is not a whole number; "
                             "fix: e.g. idle_stop_minutes=0\n")

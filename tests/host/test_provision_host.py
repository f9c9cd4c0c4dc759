"""`invoke provision` and `invoke freeze` against throwaway hosts: real apt, uv, venvs, mounts and files."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import threading
import time

import pytest

from tests.support import TEST_TOKEN, statuses


def assert_no_token(*texts: str) -> None:
    for text in texts:
        assert TEST_TOKEN not in text


@pytest.fixture
def converged(make_host):
    """A host that one real `invoke provision` run has converged, and that run's output."""
    host = make_host()
    first = host.invoke("provision", "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    return host, first


def test_first_run_makes_every_step_right(converged):
    host, first = converged
    assert statuses(first) == {
        "apt update and upgrade": "skipped",
        "build tools": statuses(first)["build tools"],
        "data disk": "changed",
        "caches on the data disk": "changed",
        "Hugging Face token": "changed",
        "idle stop": "skipped",
        "no idle stop": "ok",
        "uv (installer)": "skipped",
        "uv (pip)": "changed",
        "Python": "ok",
        "venv": "changed",
        "MaxText": "changed",
        "MaxText post-training extra deps": "skipped",
        "packages exactly as the lock": "skipped",
        "model download started": "skipped",
        "model downloaded": "skipped",
    }
    assert statuses(first)["build tools"] in {"ok", "changed"}
    home, mount = host.user.home, host.disk.mount
    assert host.run_as_user("findmnt -rn -o SOURCE " + mount).stdout.strip() == host.disk.device
    uuid = host.run_as_user(f"sudo -n blkid -o value -s UUID {host.disk.device}").stdout.strip()
    assert f"UUID={uuid} {mount} ext4 discard,defaults,nofail 0 2" in host.read_text("/etc/fstab").splitlines()
    assert host.vm.path(mount).stat().st_uid == host.user.uid
    assert os.readlink(home / ".cache/uv") == f"{mount}/cache/uv"
    assert os.readlink(home / ".cache/huggingface") == f"{mount}/cache/huggingface"
    token = host.vm.path(f"{mount}/cache/huggingface/token")  # on the data disk
    assert token.read_text() == TEST_TOKEN and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert f"Starting session: subsystem 'sftp' for {host.user.name} " in host.vm.log.read_text()  # how the token went
    assert host.run_as_user("~/.local/bin/uv --version").stdout.split()[1] == "0.13.9"
    venv_python = host.run_as_user(
        "~/maxtext_venv/bin/python -c 'import sys, six; print(sys.version_info[:2], six.__version__)'"
    )
    assert venv_python.stdout.strip() == "(3, 12) 1.16.0"
    assert_no_token(first.stdout, first.stderr, host.vm.log.read_text(), *host.user.commands())
    # each step that ran is kept on the host with when it began, for `invoke timeline`
    (record,) = host.vm.path(f"{mount}/tpu-grpo/provisioning").iterdir()
    ran = {step["step"]: step for step in json.loads(record.read_text())["steps"]}
    assert set(ran) == {name for name, status in statuses(first).items() if status == "changed"}
    shown = host.invoke("timeline", "--json", vars=False)
    assert shown.returncode == 0, shown.stderr
    timeline = json.loads(shown.stdout)
    venv = next(phase for phase in timeline["phases"] if phase["label"] == "provision: venv")
    assert venv["start"] == ran["venv"]["started"] and venv["seconds"] == ran["venv"]["seconds"]


def test_second_run_changes_nothing_over_one_connection_and_one_round_trip(converged):
    """Run with the host offline: a check wrongly failing would start a step that downloads again,
    and that step would fail at once, so the assertion on the statuses fails, not the network."""
    from tests.host import sshd as harness

    host, _ = converged
    connections, commands = host.vm.accepted(host.user.name), len(host.user.commands())
    sftp_sessions = host.vm.log.read_text().count(f"Starting session: subsystem 'sftp' for {host.user.name} ")
    with harness.offline(host.user.uid):
        probe = host.run_as_user(
            "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=5)\""
        )
        assert probe.returncode != 0, "the host is not offline"
        again = host.invoke("provision", "--json")
    assert again.returncode == 0, again.stderr
    assert set(statuses(again).values()) == {"ok", "skipped"}
    assert host.vm.accepted(host.user.name) == connections + 1
    assert host.vm.log.read_text().count(f"Starting session: subsystem 'sftp' for {host.user.name} ") == sftp_sessions
    assert len(host.user.commands()) == commands + 1  # every check in one command
    text = host.invoke("provision")
    assert "0 changed, 0 failed" in text.stdout and text.returncode == 0
    assert_no_token(again.stdout, text.stdout, text.stderr, *host.user.commands())


def host_state(host) -> str:
    """Everything provisioning could touch on a test host: its home tree, fstab, mounts, the disk's file system."""
    tree = host.run_as_user("cd && find . -printf '%p %y %s %m %T@ %l\\n' | sort").stdout
    disk = host.run_as_user(f"sudo -n blkid -p {host.disk.device}; echo $?").stdout
    return "\n".join([tree, host.read_text("/etc/fstab"), host.on_host("cat", "/proc/self/mounts").stdout, disk])


def test_check_mode_reports_what_would_change_and_changes_nothing(make_host):
    host = make_host()
    before = host_state(host)
    checked = host.invoke("provision", "--check", "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["check_mode"] is True
    would = {step["step"] for step in report["hosts"][0]["steps"] if step["status"] == "changed"}
    assert {"data disk", "caches on the data disk", "Hugging Face token", "uv (pip)", "venv", "MaxText"} <= would
    assert all(step["note"] == "would change" for step in report["hosts"][0]["steps"] if step["status"] == "changed")
    assert host_state(host) == before
    assert len(host.user.commands()) == 1  # the one round trip of checks, nothing else
    text = host.invoke("provision", "--check")
    assert "would change" in text.stdout and "data disk" in text.stdout and host_state(host) == before


def test_freeze_then_locked_rebuild_reports_and_repairs_drift(converged, tmp_path):
    host, _ = converged
    lock = tmp_path / "host.lock.txt"
    frozen = host.invoke("freeze", "--lock", str(lock), vars=False)
    assert frozen.returncode == 0, frozen.stderr
    assert f"wrote {lock}" in frozen.stdout
    text = lock.read_text()
    assert "# python: 3.12." in text and "# uv: 0.13.9\n" in text and "\nsix==1.16.0\n" in text
    drifted = host.run_as_user("~/.local/bin/uv pip install --quiet --python ~/maxtext_venv six==1.17.0")
    assert drifted.returncode == 0, drifted.stderr

    checked = host.invoke("provision", "--check", "--locked", "--lock", str(lock), "--json")
    assert checked.returncode == 0, checked.stderr
    steps = {step["step"]: step for step in json.loads(checked.stdout)["hosts"][0]["steps"]}
    assert steps["packages exactly as the lock"]["status"] == "changed"
    assert steps["packages exactly as the lock"]["output"] == "six: host 1.17.0, lock 1.16.0"
    assert steps["MaxText"]["status"] == "skipped"
    assert (
        "six: host 1.17.0, lock 1.16.0" in host.invoke("provision", "--check", "--locked", "--lock", str(lock)).stdout
    )
    assert (
        host.run_as_user("~/maxtext_venv/bin/python -c 'import six; print(six.__version__)'").stdout.strip() == "1.17.0"
    )

    synced = host.invoke("provision", "--locked", "--lock", str(lock), "--json")
    assert synced.returncode == 0, synced.stdout
    assert statuses(synced)["packages exactly as the lock"] == "changed"
    assert (
        host.run_as_user("~/maxtext_venv/bin/python -c 'import six; print(six.__version__)'").stdout.strip() == "1.16.0"
    )
    again = host.invoke("provision", "--locked", "--lock", str(lock), "--json")
    assert set(statuses(again).values()) == {"ok", "skipped"}


STOPPING_BOOK = """\
steps:
  - name: first
    check: test -f ~/first
    run: touch ~/first
  - name: second
    check: test -f ~/second
    run: |
      echo "line one of the failure"
      test -f ~/allowed || { echo "not allowed yet" >&2; exit 7; }
      touch ~/second
  - name: third
    check: test -f ~/third
    run: touch ~/third
"""


def test_a_failed_step_stops_the_host_shows_why_and_a_rerun_continues(make_host, tmp_path):
    host = make_host()
    book = tmp_path / "book.yml"
    book.write_text(STOPPING_BOOK)
    failed = host.invoke("provision", "--playbook", str(book), vars=False)
    assert failed.returncode == 1
    assert f"{host.spec}: 'second' failed with exit code 7\n" in failed.stdout
    assert "    line one of the failure\n    not allowed yet\n" in failed.stdout
    assert re.search(r"skipped +third  \(not run: 'second' failed\)", failed.stdout)
    assert "1 changed, 1 failed, 1 skipped" in failed.stdout and "FAILED" in failed.stdout
    assert not (host.user.home / "third").exists()
    (host.user.home / "allowed").touch()
    resumed = host.invoke("provision", "--playbook", str(book), "--json", vars=False)
    assert resumed.returncode == 0
    assert statuses(resumed) == {"first": "ok", "second": "changed", "third": "changed"}


def test_network_steps_retry_with_backoff_after_a_network_error(make_host, tmp_path, monkeypatch):
    host = make_host()
    result, seen = _apply_one_step(
        host,
        tmp_path,
        monkeypatch,
        kind="network",
        check="test -f ~/got",
        script=(
            "echo attempt >> ~/tries\n"
            "[ $(wc -l < ~/tries) -ge 2 ] || { echo 'curl: (6) Could not resolve host: astral.sh' >&2; exit 6; }\n"
            "touch ~/got"
        ),
    )
    assert result.status == "changed"
    assert (host.user.home / "tries").read_text() == "attempt\nattempt\n"
    assert [payload for _, kind, payload in seen if kind == "output"] == [
        "attempt 2 of 3 in 0.1 s, after: Could not resolve host"
    ]


def test_a_network_step_that_fails_for_another_reason_runs_once(make_host, tmp_path, monkeypatch):
    """A requirement with no solution (or a failed build) fails the same way again: retrying only costs time."""
    host = make_host()
    result, seen = _apply_one_step(
        host,
        tmp_path,
        monkeypatch,
        kind="network",
        check="test -f ~/got",
        script=("echo attempt >> ~/tries\necho 'error: No solution found when resolving dependencies' >&2; exit 1"),
    )
    assert (result.status, result.exit_code) == ("failed", 1)
    assert result.output == "error: No solution found when resolving dependencies"
    assert (host.user.home / "tries").read_text() == "attempt\n"
    assert not [payload for _, kind, payload in seen if kind == "output"]


def test_a_rebuilt_boot_disk_reuses_the_data_disk_and_its_caches(converged):
    """A new boot disk (empty home, no mount, no fstab line) with the same data disk: nothing reformatted,
    the uv cache it left is used instead of downloading again."""
    host, _ = converged
    mount = host.disk.mount
    host.vm.path(f"{mount}/cache/uv/marker").write_text("kept")
    archives = sorted(os.listdir(host.vm.path(f"{mount}/cache/uv/archive-v0")))
    unmounted = host.on_host("sh", "-c", f"umount {mount} && sed -i '\\# {mount} #d' /etc/fstab && rmdir {mount}")
    assert unmounted.returncode == 0, unmounted.stderr
    home = str(host.user.home)  # emptied but for the SSH key, which the guest agent writes from the metadata
    subprocess.run(
        ["find", home, "-mindepth", "1", "!", "-path", f"{home}/.ssh", "!", "-path", f"{home}/.ssh/*", "-delete"],
        check=True,
    )

    rebuilt = host.invoke("provision", "--json")
    assert rebuilt.returncode == 0, rebuilt.stdout
    changed = {name for name, status in statuses(rebuilt).items() if status == "changed"}
    assert {"data disk", "caches on the data disk", "venv", "MaxText"} <= changed
    assert statuses(rebuilt)["Hugging Face token"] == "ok"  # it lives on the data disk too
    assert host.run_as_user("cat ~/.cache/uv/marker").stdout == "kept"
    assert sorted(os.listdir(host.vm.path(f"{mount}/cache/uv/archive-v0"))) == archives
    assert (
        host.run_as_user("~/maxtext_venv/bin/python -c 'import six; print(six.__version__)'").stdout.strip() == "1.16.0"
    )


def test_wait_retries_a_vm_that_still_refuses_ssh(make_host):
    """Right after boot nothing listens yet: --wait keeps trying until sshd is up, then provisions."""
    booting = make_host(boot=False)
    refused = booting.invoke("provision", "--check", "--json")
    assert refused.returncode == 1
    assert "cannot connect" in json.loads(refused.stdout)["hosts"][0]["error"]
    assert "--wait 120 if it has just booted" in json.loads(refused.stdout)["hosts"][0]["error"]
    starter = threading.Timer(3, booting.vm.boot)
    starter.start()
    try:
        waited = booting.invoke("provision", "--check", "--json", "--wait", "30")
    finally:
        starter.join()
    assert waited.returncode == 0, waited.stdout
    assert booting.vm.accepted(booting.user.name) == 1


def test_a_vm_without_the_data_disk_is_told_how_to_go_on(make_host):
    """A VM made by hand with the tutorial has no data disk: the step says so and how to skip it."""
    host = make_host()
    result = host.invoke("provision", "--tags", "disk", "--var", "data_device=/dev/disk/by-id/google-none")
    assert result.returncode == 1
    assert (
        "/dev/disk/by-id/google-none is not a disk: this VM has no data disk (made by hand?); "
        "fix: --var data_device= to keep the caches on the boot disk"
    ) in result.stdout
    skipped = host.invoke("provision", "--tags", "disk", "--var", "data_device=", "--json")
    assert skipped.returncode == 0 and set(statuses(skipped).values()) == {"skipped"}


def _apply_one_step(host, tmp_path, monkeypatch, script: str, check: str, kind: str = "progress"):
    """Apply one step (`kind`: progress or network) running `script` to the host, retrying after 0.1 s:
    (its result, the events seen, timed)."""
    from tpu_grpo.host import hosts
    from tpu_grpo.provision import engine, playbook

    monkeypatch.setenv("TPU_GRPO_STATE", str(host.state))
    book = tmp_path / "book.yml"
    body = "".join(f"      {line}\n" for line in script.splitlines())
    book.write_text(f"steps:\n  - name: the step\n    {kind}: true\n    check: {check}\n    run: |\n{body}")
    seen = []
    target = hosts.Host(host.user.name, "127.0.0.1", host.vm.port, host.key)
    report = engine.apply(
        playbook.load(book),
        {},
        [target],
        retry_delays=(0.1, 0.1),
        on_event=lambda kind, _host, _step, payload: seen.append((time.monotonic(), kind, payload)),
    )
    return report.hosts[0].steps[0], seen


def test_long_steps_stream_their_progress_while_they_run(make_host, tmp_path, monkeypatch):
    """The MaxText install downloads about 6 GB: its progress lines (bars redrawn with \\r, colours) arrive as they
    happen."""
    result, seen = _apply_one_step(
        make_host(),
        tmp_path,
        monkeypatch,
        check="test -f ~/done",
        script=(
            "printf '\\033[1mstarting\\033[0m\\n'\n"
            "for i in 1 2 3; do printf 'got %s of 3\\r' $i; sleep 0.4; done\n"
            "echo; touch ~/done"
        ),
    )
    assert result.status == "changed"
    lines = [payload for _, kind, payload in seen if kind == "output"]
    assert lines == ["starting", "got 1 of 3", "got 2 of 3", "got 3 of 3"]
    first_line_at = next(at for at, kind, _ in seen if kind == "output")
    done_at = next(at for at, kind, _ in seen if kind == "done")
    assert done_at - first_line_at > 0.8  # streamed during the step, not replayed after it


def test_a_failed_progress_step_shows_its_last_lines_as_the_terminal_does(make_host, tmp_path, monkeypatch):
    """uv redraws a spinner with `\\r` and erases it before its error; the failure shows the error, not the frames."""
    failed, seen = _apply_one_step(
        make_host(),
        tmp_path,
        monkeypatch,
        check="'false'",
        script=(
            "echo 'Using Python 3.12 environment at: maxtext_venv'\n"
            "for frame in a b c d e f g h i j k l m n o p; do\n"
            "printf '\\033[2K%s Resolving dependencies...\\r' $frame; done\n"
            "printf '\\033[2K\\033[1;31merror\\033[0m: No solution found\\n  cause: not in the registry\\n'\n"
            "printf 'half a line'; exit 3"
        ),
    )
    assert (failed.status, failed.exit_code) == ("failed", 3)
    assert failed.output == (
        "Using Python 3.12 environment at: maxtext_venv\nerror: No solution found\n"
        "cause: not in the registry\nhalf a line"
    )
    frames = [
        payload for _, kind, payload in seen if kind == "output" and payload.endswith("Resolving dependencies...")
    ]
    assert len(frames) == 16  # every redraw still reached the live view

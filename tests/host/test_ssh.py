"""`invoke ssh`: OpenSSH's client on a throwaway host, with the user, key and host key tpu-grpo uses: a command's
output and exit code are the task's, and a host key other than the one recorded is refused before ssh runs."""

from __future__ import annotations

import subprocess


def test_ssh_runs_a_command_as_the_hosts_user_and_passes_its_exit_code_on(make_host):
    host = make_host(disk_mb=0)
    done = host.invoke("ssh", "--command", "echo hello from $(whoami) in $PWD", vars=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"hello from {host.user.name} in /home/{host.user.name}"
    assert host.invoke("ssh", "--command", "exit 7", vars=False).returncode == 7


def test_ssh_refuses_a_host_key_other_than_the_one_recorded(make_host, tmp_path):
    host = make_host(disk_mb=0)
    known = host.state / "known_hosts"
    name = known.read_text().split(" ", 1)[0]
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"{name} {kind} {key}\n")
    done = host.invoke("ssh", "--command", "echo never", vars=False)
    assert done.returncode == 1 and "never" not in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "ssh-keygen -R" in done.stderr

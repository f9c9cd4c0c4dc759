"""`invoke ssh`: OpenSSH's client on a throwaway host, with the user, key and host key tpu-grpo uses: a command's
output and exit code are the task's, and a host key other than the one recorded is refused before ssh runs."""

from __future__ import annotations

import subprocess

from tests.support import ROOT


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


def test_the_fix_printed_for_a_command_after_a_double_dash_runs_it_as_pasted(make_host):
    """`invoke ssh --host H --identity K -- echo ...` drops nothing silently: it is refused with the line as typed,
    the command moved to --command, and that line, pasted into bash as printed, runs the command on the host."""
    host = make_host(disk_mb=0)
    refused = host.invoke("ssh", "--", "echo", "pasted", "from", "$(whoami)", vars=False)
    assert refused.returncode == 2, refused.stderr
    fix = refused.stderr.split("fix: ", 1)[1].split(" runs a command on the VM")[0]
    assert fix.startswith("uv run invoke ssh --host ") and "--command" in fix
    done = subprocess.run(["bash", "-c", fix], cwd=ROOT, env=host.env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"pasted from {host.user.name}"


def test_a_script_longer_than_one_argument_runs_whole(make_host):
    """Linux takes no argument over 128 KiB (MAX_ARG_STRLEN), and sshd hands the login shell the command as one: a
    pipeline's chain, its steps' scripts inside, can be longer. hosts.run_script sends such a script as a file, which
    runs whole, every line of it, its exit code the script's, and is gone after."""
    import fabric

    from tpu_grpo.host import hosts

    host = make_host(disk_mb=0)
    connection = fabric.Connection(
        "127.0.0.1", user=host.user.name, port=host.vm.port, connect_kwargs={"key_filename": str(host.key)}
    )
    connection.client.load_host_keys(str(host.state / "known_hosts"))
    connection.open()
    lines = [f"echo {number} 'a line with quotes: '\"'\"'x'\"'\"' {'.' * 40}'" for number in range(4000)]
    script = "set -e\ncount=0\n" + "\n".join(f"{line} > /dev/null; count=$((count + 1))" for line in lines)
    script += "\ncat <<'END'\na heredoc\nEND\necho \"$count\"\nexit 3\n"
    assert len(hosts.bash_command(script).encode()) > hosts.LONGEST_ARGUMENT
    try:
        done = hosts.run_script(connection, script)
        assert (done.exited, done.stdout) == (3, "a heredoc\n4000\n"), done.stderr
        short = hosts.run_script(connection, "echo short; exit 4")
        assert (short.exited, short.stdout) == (4, "short\n")
        assert not list(host.user.home.glob(".tpu-grpo-script-*"))
    finally:
        connection.close()

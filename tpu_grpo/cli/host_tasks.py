"""The host's tasks: provision, freeze, and a shell on it."""

from __future__ import annotations

import json

from invoke import Exit

from tpu_grpo.cli.checks import check_freeze, check_provision, check_ssh
from tpu_grpo.cli.flags import HOST_FLAGS, checked, flag_help, one_line_errors, task
from tpu_grpo.config.printing import terminal


@task(
    iterable=["host", "var", "tags"],
    check=check_provision,
    help=flag_help(
        *HOST_FLAGS,
        "var",
        "playbook",
        "json",
        check="report what would change (and drift from the lock), change nothing",
        tags="TAG[,TAG], repeatable: run only the steps with these tags",
        locked="install exactly the lock (written by `invoke freeze`) with `uv pip sync`",
        lock="the lock file (default: playbooks/host.lock.txt)",
    ),
)
def provision(
    c,
    host=None,
    identity=None,
    stack=None,
    var=None,
    tags=None,
    check=False,
    locked=False,
    lock=None,
    playbook=None,
    wait=None,
    json_=False,
):
    """Make the host(s) ready for MaxText: apply playbooks/host.yml over SSH, idempotently, in parallel."""
    from tpu_grpo.provision import engine
    from tpu_grpo.provision.report import LiveView, print_summary

    with one_line_errors():
        book, values, chosen_tags, where = checked(check_provision)
        targets = where.flags.hosts(where.settings)
        wait_s = where.flags.wait_s
    if json_:
        report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, wait_s=wait_s)
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = terminal()
        verb = "checking" if check else "provisioning"
        console.print(
            f"{verb} {', '.join(t.name for t in targets)} with {book.path.name}" + (" (locked)" if locked else "")
        )
        with LiveView(console, check) as view:
            report = engine.apply(
                book, values, targets, check_mode=check, tags=chosen_tags, on_event=view, wait_s=wait_s
            )
        print_summary(report, console)
    if report.failed:
        raise Exit(code=1)


@task(
    iterable=["host", "var"],
    check=check_freeze,
    help=flag_help(*HOST_FLAGS, "var", "playbook", lock="where to write the lock (default: playbooks/host.lock.txt)"),
)
def freeze(c, host=None, identity=None, stack=None, var=None, playbook=None, lock=None, wait=None):
    """Record the host's exact environment (Python, uv, every package) in the lock for `provision --locked`."""
    from tpu_grpo.host import hosts
    from tpu_grpo.provision.lock import freeze, write_lock

    with one_line_errors():
        book, values, lock_path, where = checked(check_freeze)
        targets = where.flags.hosts(where.settings)
        notices: list[str] = []
        connection = hosts.connect(targets[0], notices, where.flags.wait_s)
        try:
            text = freeze(connection, book, values, targets[0].name)
        finally:
            connection.close()
    path, packages = write_lock(lock_path, text)
    for notice in notices:
        print(f"note: {notice}")
    print(f"wrote {path}: {packages} packages from {targets[0].name}")


@task(
    iterable=["host"],
    check=check_ssh,
    help=flag_help(*HOST_FLAGS, command="a command to run on the VM instead of a login shell, e.g. 'df -h ~/tpu-grpo'"),
)
def ssh(c, host=None, identity=None, stack=None, wait=None, command=None):
    """A shell on the VM, or one command, with OpenSSH: the stack's user and key, the host key tpu-grpo recorded.

    The VM's key is recorded at the first contact and checked ever after, as every task checks it; a changed key
    is refused with the command that forgets it."""
    import os
    import shutil

    from tpu_grpo.config.errors import UserError
    from tpu_grpo.host import hosts

    with one_line_errors():
        where = checked(check_ssh)
        [target] = where.flags.hosts(where.settings)
        client = shutil.which("ssh")
        if client is None:
            raise UserError("no ssh on PATH, OpenSSH's client; fix: install it (apt install openssh-client)")
        notices: list[str] = []
        hosts.connect(target, notices, where.flags.wait_s).close()  # the key: recorded now, or checked
    for notice in notices:
        print(f"note: {notice}", flush=True)
    os.execv(client, hosts.openssh(client, target, command))

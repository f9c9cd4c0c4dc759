"""The host's tasks: provision, freeze, and a shell on it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from invoke import Exit

from tpu_grpo.cli.checks import Freeze, Freezing, Provision, Provisioning, Ssh
from tpu_grpo.cli.flags import one_line_errors, task
from tpu_grpo.config.printing import terminal

if TYPE_CHECKING:
    from tpu_grpo.jobs.targets import Where


@task(flags=Provision)
def provision(c, flags: Provision, checked: Provisioning):
    """Make the host(s) ready for MaxText: apply playbooks/host.yml over SSH, idempotently, in parallel."""
    from tpu_grpo.provision import engine
    from tpu_grpo.provision.report import LiveView, print_summary

    with one_line_errors():
        book, values, chosen_tags, where = checked.book, checked.values, checked.tags, checked.where
        targets = where.flags.hosts(where.settings)
        wait_s = where.flags.wait_s
    check = flags.check_
    if flags.json_:
        report = engine.apply(book, values, targets, check_mode=check, tags=chosen_tags, wait_s=wait_s)
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = terminal()
        verb = "checking" if check else "provisioning"
        console.print(
            f"{verb} {', '.join(t.name for t in targets)} with {book.path.name}" + (" (locked)" if flags.locked else "")
        )
        with LiveView(console, check) as view:
            report = engine.apply(
                book, values, targets, check_mode=check, tags=chosen_tags, on_event=view, wait_s=wait_s
            )
        print_summary(report, console)
    if report.failed:
        raise Exit(code=1)


@task(flags=Freeze)
def freeze(c, flags: Freeze, checked: Freezing):
    """Record the host's exact environment (Python, uv, every package) in the lock for `provision --locked`."""
    from tpu_grpo.host import hosts
    from tpu_grpo.provision.lock import freeze, write_lock

    with one_line_errors():
        book, values, lock_path, where = checked.book, checked.values, checked.lock, checked.where
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


@task(flags=Ssh)
def ssh(c, flags: Ssh, where: Where):
    """A shell on the VM, or one command, with OpenSSH: the stack's user and key, the host key tpu-grpo recorded.

    The VM's key is recorded at the first contact and checked ever after, as every task checks it; a changed key
    is refused with the command that forgets it."""
    import os
    import shutil

    from tpu_grpo.config.errors import UserError
    from tpu_grpo.host import hosts

    with one_line_errors():
        [target] = where.flags.hosts(where.settings)
        client = shutil.which("ssh")
        if client is None:
            raise UserError("no ssh on PATH, OpenSSH's client; fix: install it (apt install openssh-client)")
        notices: list[str] = []
        hosts.connect(target, notices, where.flags.wait_s).close()  # the key: recorded now, or checked
    for notice in notices:
        print(f"note: {notice}", flush=True)
    os.execv(client, hosts.openssh(client, target, flags.command))

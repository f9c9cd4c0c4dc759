"""Provisioning under faults, without a host: every step that changes a fresh host has a point where the
host tests kill its connection (tests/host/test_provision_faults.py)."""

from __future__ import annotations

from tests.host.kill_points import KILL_POINTS
from tests.host.rootfs import TEST_VARS
from tpu_grpo.provision import playbook

#: The test hosts find this machine's Python 3.12 on PATH, and have no idle-stop timer to remove.
ALREADY_RIGHT = {"Python", "no idle stop"}


def test_every_step_that_changes_a_fresh_host_has_a_kill_point():
    """Guards KILL_POINTS: a step added to host.yml gets a connection kill of its own."""
    book = playbook.load()
    values = playbook.resolve(book, [*TEST_VARS, "data_device=/dev/loop7", "data_mount=/mnt/data"])
    runs = {step.name for step in book.steps if playbook.applies(step, values)}
    assert runs == set(KILL_POINTS) | ALREADY_RIGHT

"""Provisioning under faults, without a host: every step that changes a fresh host has a point where the
host tests kill its connection (tests/host/test_provision_faults.py)."""

from __future__ import annotations

from tests.host.rootfs import TEST_VARS
from tpu_grpo import playbook

KILL_POINTS = {
    "build tools": ("apt-get ", "install -y build-essential"),  # as root, under the user's sudo
    "data disk": ("mkfs.ext4 ", "lazy_itable_init"),  # as root, under the user's sudo; held at its exec (HELD_AT_EXEC)
    "caches on the data disk": ("cp ", "-a"),  # moving an existing cache onto the disk
    # The copy itself takes milliseconds, less than one scan of /proc on a busy machine, so for this
    # step the user's SSH session is stopped the moment the step starts: its mkdir and SFTP copy wait.
    "Hugging Face token": ("sshd: ", "@notty"),
    "uv (pip)": ("python3 ", "-m pip install --user"),
    "venv": ("uv ", "venv --python"),
    "MaxText": ("uv ", "pip install"),
}






ALREADY_RIGHT = {"Python", "no idle stop"}




def test_every_step_that_changes_a_fresh_host_has_a_kill_point():
    """Guards KILL_POINTS: a step added to host.yml gets a connection kill of its own."""
    book = playbook.load()
    values = playbook.resolve(book, [*TEST_VARS, "data_device=/dev/loop7", "data_mount=/mnt/data"])
    runs = {step.name for step in book.steps if playbook.applies(step, values)}
    assert runs == set(KILL_POINTS) | ALREADY_RIGHT

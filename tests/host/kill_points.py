"""Where the host tests kill a provisioning step's connection (tests/host/test_provision_faults.py);
tests/unit/test_provision_faults.py holds it to the playbook: every step that changes a fresh host has one."""

# Every step of playbooks/host.yml that changes a fresh test host, and the program its `run`
# starts there (how its command line begins, and words in it): the kill waits until that
# program runs, so it lands in the middle of the step's work, not before the script starts.
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

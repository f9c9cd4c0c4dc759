"""tpu-grpo's command line: `invoke --list` shows the tasks, `invoke --help TASK` their flags.

The tasks live in tpu_grpo/cli/ by what they act on (stack_tasks, host_tasks, job_tasks, result_tasks), their flag
checks in tpu_grpo/cli/checks.py; this file gathers them into Invoke's root collection. Each task parses its flags,
calls one library function and prints the result. Heavy imports (Pulumi, the GCP SDK) happen inside the tasks that
need them, so `invoke --list` stays instant.
"""

from __future__ import annotations

import sys

from invoke import Collection, Task

# Invoke turns off Python's bytecode cache for whatever its tasks import (see its --write-pyc), so
# Fabric, paramiko and tpu_grpo would be compiled from source on every run. Python's own setting
# (PYTHONDONTWRITEBYTECODE, -B) still decides.
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

from tpu_grpo.cli import host_tasks, job_tasks, result_tasks, stack_tasks  # noqa: E402 - after dont_write_bytecode

ns = Collection(
    *(
        value
        for module in (stack_tasks, host_tasks, job_tasks, result_tasks)
        for value in vars(module).values()
        if isinstance(value, Task)
    )
)

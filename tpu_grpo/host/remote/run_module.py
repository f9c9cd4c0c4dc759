"""Run a module as `python3 -m` does (argv 1 the module, the rest its arguments), and end the process once it is done.

MaxText 0.2.3's train_rl grades answers that are not an exact match in a pool of spawned processes
(trainers/post_train/rl/math_verify_pool.py). Its exit handler kills the pool's workers, one of which waits for a task
holding the pool's queue lock, and Pool's own finalizer then waits on that lock forever: after its last line the
trainer never exits, its job never ends and the TPU stays billed (seen in the real-MaxText tier, whose rollout answers
some questions wrong, and alone: a program that grades one such answer and returns hangs at exit). So once the
module has returned (or raised), Python's exit handlers get GRACE_SECONDS to flush what they hold (TensorBoard's last
events), then the process ends with the module's exit code.

The pool is resized (torn down and spawned anew) whenever a call grades another number of answers than the last (an
evaluation grades one, a training batch several), and a torn-down pool's worker handler can spawn a replacement that
nobody ends: it waits on the queue's lock forever, holding the training's output, so what reads that output (the
keeper, the job's log) never sees its end. So, last, the process ends every child it still has.
"""

import atexit
import os
import runpy
import signal
import sys
import threading
import traceback

GRACE_SECONDS = 10


def exit_code(done: SystemExit) -> int:
    """The exit code Python gives a SystemExit: 0 for None, the number, else 1 with the message on stderr."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


def end_children() -> None:
    """SIGKILL each process whose parent this one is (from /proc: the pool's workers are nobody else's)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])  # after "PID (NAME)": state, parent
            if parent == os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue  # gone since


def end(code: int) -> None:
    end_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    atexit.register(end_children)  # registered first, run last: after the module's own exit handlers
    module = sys.argv.pop(1)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = exit_code(done)
    except BaseException:  # noqa: BLE001 - said as Python says it, then the same exit
        traceback.print_exc()
        code = 1
    timer = threading.Timer(GRACE_SECONDS, end, (code,))
    timer.daemon = True  # it does not hold the exit up itself
    timer.start()
    sys.exit(code)

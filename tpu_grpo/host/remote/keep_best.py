"""A training's output passed through as it comes (the job's log gets every byte), keeping the best scored checkpoint
from the checkpoint manager's deletion (`max_num_checkpoints_to_keep` keeps the newest, whichever scored best).

After an intermediate evaluation that scores higher than every earlier one (the earlier wins a tie, as
tpu_grpo/jobs/progress.best chooses), the weights of its checkpoint (`model_params`, all an export reads) are
hard-linked into KEPT/STEP once the checkpoint is written, and the one kept before is removed. A hard link costs no
room until the manager deletes the checkpoint; it needs the checkpoint's own filesystem (/dev/shm or the data disk).
Nothing here may stop the training: a failure of the keeping is said on a line, and the output goes on.

Its data: `checkpoints` (the run's checkpoints/actor), `kept`, `iterations` (train steps a batch), `period`
(checkpoint_period), `last` (the last train step), `pattern` and `field` (tpu_grpo/jobs/progress.py's EVAL and
EVAL_FIELD, so the log is read one way)."""

import json
import os
import queue
import re
import shutil
import sys
import threading
import time

SAID = "tpu-grpo: keeps checkpoint"
#: Beside the kept weights, the accuracy they scored.
SCORE = "accuracy"
#: Set once the training's output has ended: a checkpoint not written by then never will be.
ENDED = threading.Event()
#: The step to keep, the newest best; what was asked before it is superseded.
WANTED: dict[str, int] = {}
LOCK = threading.Lock()


def say(text: str) -> None:
    sys.stdout.buffer.write(f"{text}\n".encode())
    sys.stdout.buffer.flush()


def source(checkpoints: str, step: int) -> str:
    return os.path.join(checkpoints, str(step), "model_params")


def kept_before(kept: str) -> tuple[int | None, float | None]:
    """What an earlier training of the run kept (a resumed run's job starts a keeper anew): its step and accuracy."""
    for name in os.listdir(kept) if os.path.isdir(kept) else []:
        try:
            with open(os.path.join(kept, name, SCORE)) as file:
                return int(name), float(file.read())
        except (OSError, ValueError):
            continue
    return None, None


def keep(step: int, accuracy: float, checkpoints: str, kept: str) -> None:
    """Link checkpoint `step`'s weights into kept/step, then remove what was kept before; unless a better one has been
    asked for since."""
    with LOCK:
        if WANTED.get("step") != step:
            return
        partial = os.path.join(kept, f"{step}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source(checkpoints, step), os.path.join(partial, "model_params"), copy_function=os.link)
        with open(os.path.join(partial, SCORE), "w") as file:
            file.write(f"{accuracy}\n")
        os.replace(partial, os.path.join(kept, str(step)))
        for name in os.listdir(kept):
            if name != str(step):
                shutil.rmtree(os.path.join(kept, name), ignore_errors=True)
    say(f"{SAID} {step}, the best scored so far, in {kept}")


def keep_once_written(asked: "queue.Queue[tuple[int, float]]", checkpoints: str, kept: str) -> None:
    """Keep each step asked for once Orbax has written it (asynchronously, beside the evaluation)."""
    while True:
        step, accuracy = asked.get()
        while not os.path.isdir(source(checkpoints, step)) and WANTED.get("step") == step and not ENDED.is_set():
            time.sleep(1)
        try:
            if os.path.isdir(source(checkpoints, step)):
                keep(step, accuracy, checkpoints, kept)
            elif WANTED.get("step") == step:
                say(f"{SAID} {step}: never written, nothing kept")
        except OSError as error:
            say(f"{SAID} {step} failed: {error}")
        asked.task_done()


def scored(found: "re.Match[str] | None", field: "re.Pattern[str]", iterations: int) -> tuple[int | None, float | None]:
    """The train step an intermediate evaluation line scored and its accuracy, or (None, None) for any other line."""
    if not found or found["step"] is None:
        return None, None
    try:
        return int(found["step"]) * iterations, float(dict(field.findall(found["ifields"]))["accuracy"])
    except (KeyError, ValueError):
        return None, None


def main(given: dict) -> None:
    pattern, field = re.compile(given["pattern"]), re.compile(given["field"])
    checkpoints, kept = (os.path.expanduser(given[name]) for name in ("checkpoints", "kept"))
    asked: queue.Queue[tuple[int, float]] = queue.Queue()
    threading.Thread(target=keep_once_written, args=(asked, checkpoints, kept), daemon=True).start()
    before, best = kept_before(kept)
    if before is not None:
        WANTED["step"] = before
    for line in iter(sys.stdin.buffer.readline, b""):
        step, accuracy = scored(pattern.search(line.decode(errors="replace")), field, given["iterations"])
        written = step is not None and (step % given["period"] == 0 or step == given["last"])  # the manager's
        if step is not None and accuracy is not None and written and (best is None or accuracy > best):
            best, WANTED["step"] = accuracy, step
            try:  # at once when written (the line then follows it), else once it is
                if os.path.isdir(source(checkpoints, step)):
                    keep(step, accuracy, checkpoints, kept)
                else:
                    asked.put((step, accuracy))
            except OSError as error:
                say(f"{SAID} {step} failed: {error}")
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    ENDED.set()
    asked.join()  # what was asked is kept (or said not to be) before the job ends


if __name__ == "__main__":
    main(json.loads(os.environ["TPU_GRPO_INPUT"]))

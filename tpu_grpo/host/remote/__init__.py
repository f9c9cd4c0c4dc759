"""Programs that run on the host, or in a slice's pod, in MaxText's venv: files here, linted, type-checked and unit
tested like any module, and shipped as they are. A job script or a fact carries a program's text as the standard
input of `python3 -` (a quoted heredoc, so bash expands nothing in it) and its data as one JSON document in the
environment variable TPU_GRPO_INPUT, quoted once here (as Modal's `modal launch` hands its programs one JSON
document): no caller quotes anything, and nothing a program is given reaches its command line. The one exception
is run_module, which runs a module as `python3 -m` does and so takes a command line: MaxText's, which the job
script writes as `invoke script` shows it. Shell scripts longer than a line are files here too, their inputs bash
variables that `shell` sets (each quoted here; a path keeps its `~`, which the script expands with home.sh's `at`).

    hub.py              the Hub side of `invoke publish` (sent by tpu_grpo/results/publish.py)
    chips.py            the TPU chips as tpu-info sees them (tpu_grpo/host/chips.py's fact)
    maxtext_version.py  which MaxText the venv holds (the kept conversion, the preflight, the model card)
    save_tokenizer.py   the training's tokenizer into the export (tpu_grpo/jobs/maxtext.py)
    folder_children.py  a gs:// folder's children, the steps of a bucket's checkpoints (tpu_grpo/jobs/maxtext.py)
    compile_cache.py    a step's compile cache, named by versions and settings, warm or cold (tpu_grpo/jobs/maxtext.py)
    run_module.py       the training's module, run as `python3 -m` runs it, ending once done (tpu_grpo/jobs/maxtext.py)
    keep_best.py        the training's output passed through, keeping its best scored checkpoint (jobs/maxtext.py)
    chain.py            a pipeline's steps run in order by the host, each a job (jobs/pipeline.py's chain), or
                        by a slice's driver Job, each a JobSet (jobs/slice_jobs.py)
    preflight.sh        what keeps the host from running a run (tpu_grpo/jobs/pipeline.py's Preflight)
    jobs.sh             every job on the host and its state (tpu_grpo/jobs/vm_jobs.py's Jobs)
    start_job.sh        a job started detached under the TPU's lock, job_wrapper.sh its run.sh (jobs/vm_jobs.py)
    write_card.sh       the model card beside a saved model (tpu_grpo/results/publish.py)
    save.sh             a folder copied with its checksums, checked (tpu_grpo/host/artifacts.py's save_script)
    manifest.sh         a folder's files, sizes and checksums, for a fetch (tpu_grpo/host/artifacts.py)
    sums.sh             the hashing both share
    home.sh             `at PATH`, which every script above uses for a path's leading ~
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

#: The environment variable that holds a program's data; each program reads it as json.loads(os.environ[INPUT]).
INPUT = "TPU_GRPO_INPUT"


def text(name: str, suffix: str = ".py") -> str:
    return (Path(__file__).parent / f"{name}{suffix}").read_text()


def run(name: str, data: dict | None = None, *, python: str = "python3", then: str = "", command_line: str = "") -> str:
    """Bash that runs program `name` with `data` (any JSON value's dict: paths, ids, names, as they are); `then`: what
    follows the command on its line (a pipe, a redirection), before the program's text; `command_line`: run_module's
    module and arguments, bash's to expand."""
    given = f"{INPUT}={shlex.quote(json.dumps(data, sort_keys=True))} " if data is not None else ""
    end = f"TPU_GRPO_{name.upper()}"
    call = " ".join(filter(None, [f"{given}{python}", "-", command_line]))
    return f"{call} <<'{end}'{then}\n{text(name)}{end}"


def filter_into(name: str, data: dict, variable: str) -> tuple[str, str]:
    """A program that reads another's output on its standard input, which its text cannot then come through: (bash
    that writes its text to a new file named by $`variable`, the command that runs it with `data`, to follow a `|`)."""
    end = f"TPU_GRPO_{name.upper()}"
    written = f"{variable}=$(mktemp)\ncat > \"${variable}\" <<'{end}'\n{text(name)}{end}"
    return written, f'{INPUT}={shlex.quote(json.dumps(data, sort_keys=True))} python3 "${variable}"'


def shell(name: str, *libraries: str, **inputs: object) -> str:
    """Shell script `name`.sh with its inputs set first as bash variables (NAME='value'), each quoted here, then the
    functions of home.sh (`at PATH`: a path's leading ~ as the home) and of `libraries` (NAME.sh each)."""
    assigned = "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in inputs.items())
    return assigned + "".join(text(each, ".sh") for each in ("home", *libraries, name))

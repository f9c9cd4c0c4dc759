"""Programs that run on the host, or in a slice's pod, in MaxText's venv: files here, linted, type-checked and unit
tested like any module, and shipped as they are. A job script or a fact carries a program's text as the standard
input of `python3 -` (a quoted heredoc, so bash expands nothing in it), its arguments after the `-`.

    hub.py              the Hub side of `invoke publish` (sent by tpu_grpo/results/publish.py)
    chips.py            the TPU chips as tpu-info sees them (tpu_grpo/host/chips.py's fact)
    maxtext_version.py  which MaxText the venv holds (the kept conversion, the preflight, the model card)
    save_tokenizer.py   the training's tokenizer into the export (tpu_grpo/jobs/maxtext.py)
    folder_children.py  a gs:// folder's children, the steps of a bucket's checkpoints (tpu_grpo/jobs/maxtext.py)
    compile_cache.py    a step's compile cache, named by versions and settings, warm or cold (tpu_grpo/jobs/maxtext.py)
    run_module.py       the training's module, run as `python3 -m` runs it, ending once done (tpu_grpo/jobs/maxtext.py)
"""

from __future__ import annotations

from pathlib import Path


def text(name: str) -> str:
    return (Path(__file__).parent / f"{name}.py").read_text()


def run(name: str, *args: str, python: str = "python3", then: str = "") -> str:
    """Bash that runs program `name` with `args` (already quoted for bash); `then`: what follows the command on its
    line (a pipe, a redirection), before the program's text."""
    end = f"TPU_GRPO_{name.upper()}"
    return f"{' '.join([python, '-', *args])} <<'{end}'{then}\n{text(name)}{end}"

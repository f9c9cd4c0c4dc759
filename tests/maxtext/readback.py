"""What the real-MaxText tier reads back from MaxText's outputs, in the tier's venv (which has transformers, torch,
safetensors and Orbax, as a host has them), in one process a row (torch, transformers and Orbax import once):

    python -m tests.maxtext.readback '{"load": [EXPORT, TRAINED_TOKENIZER], "learned": [START, EXPORT, ROLLOUT_LOG],
                                       "bytes": STEP_FOLDER, "digests": {NAME: MODEL_PARAMS_FOLDER, ...}}'

prints each asked for under its key, as JSON: the export as transformers loads it, what the training changed, what
Orbax wrote per parameter, and the digest of the weights in each folder (the stand-in rollout's, standin/
sitecustomize.digest).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

QUESTION = [{"role": "user", "content": "Tom has 2 apples and buys 3 more. How many apples does he have?"}]


def load_export(folder: Path, trained_tokenizer: Path) -> dict:
    """The export as transformers loads it, offline: the class it makes; the class's weights it missed, found
    unexpected or in another shape; the question as its tokenizer's chat template renders it, beside the rendering of
    the tokenizer the run trained with and the text its tokens decode to; and how many tokens a greedy reply has."""
    import transformers

    model, found = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rendered = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(rendered, add_special_tokens=False, return_tensors="pt")
    reply = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    trained = transformers.AutoTokenizer.from_pretrained(trained_tokenizer)
    return {
        "class": type(model).__name__,
        "rendered": rendered,
        "decoded": tokenizer.decode(prompt["input_ids"][0]),
        "trained_rendered": trained.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False),
        "new_tokens": reply.shape[-1] - prompt["input_ids"].shape[-1],
        **{what: sorted(map(str, found[what])) for what in ("missing_keys", "unexpected_keys", "mismatched_keys")},
    }


def learned(start: Path, export: Path, rollout_log: Path) -> dict:
    """What the training changed against the start it trained from, the checkpoint as MaxText's conversion holds it
    (bfloat16): for each of the export's weight matrices (as its class names them), the fraction of its weights that
    moved (the class's weights the export leaves out aside; and the norms' scales, which a few small steps need not
    move past bfloat16's rounding: Gemma's are stored as 1 + scale, where bfloat16 steps by 1/128); and, over the
    prompts the rollout answered both right and wrong, the mean of log p(right) - log p(wrong) under the start's model
    and the export's: GRPO pushes it up."""
    import torch
    import transformers

    before = transformers.AutoModelForCausalLM.from_pretrained(start, torch_dtype=torch.float32)
    before.load_state_dict({name: value.to(torch.bfloat16).float() for name, value in before.state_dict().items()})
    after, found = transformers.AutoModelForCausalLM.from_pretrained(
        export, torch_dtype=torch.float32, output_loading_info=True
    )
    start_weights = before.state_dict()
    moved = {
        name: float((value != start_weights[name]).float().mean())
        for name, value in after.state_dict().items()
        if value.dim() > 1 and name not in found["missing_keys"]
    }
    answers: dict[str, dict[bool, str]] = {}
    for line in rollout_log.read_text().splitlines():
        said = json.loads(line)
        answers.setdefault(said["prompt"], {})[said["right"]] = said["completion"]
    pairs = [(prompt, given[True], given[False]) for prompt, given in answers.items() if len(given) == 2]
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)

    def margin(model) -> float:
        def log_p(prompt: str, completion: str) -> float:
            asked = tokenizer(prompt, return_tensors="pt")["input_ids"][0]
            said = tokenizer(completion, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
            with torch.no_grad():
                logits = model(torch.cat([asked, said])[None]).logits[0, len(asked) - 1 : -1]
            return float(torch.log_softmax(logits, -1).gather(-1, said[:, None]).sum())

        return sum(log_p(prompt, right) - log_p(prompt, wrong) for prompt, right, wrong in pairs) / len(pairs)

    return {
        "moved": moved,
        "pairs": len(pairs),
        "margin_before": margin(before),
        "margin_after": margin(after),
    }


def bytes_per_parameter(step_folder: str) -> dict[str, float]:
    """What Orbax wrote in a training checkpoint (`checkpoints/actor/STEP`, a folder or gs://), bytes a model
    parameter: its weights (model_params) and its optimizer state (AdamW's moments; integer counters and seeds aside),
    from the checkpoint's metadata."""
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from jax.tree_util import tree_leaves

    found = {}
    for part in ("model_params", "optimizer_state"):
        metadata = ocp.StandardCheckpointer().metadata(epath.Path(step_folder) / part)
        leaves = [
            leaf
            for leaf in tree_leaves(getattr(metadata, "item_metadata", metadata))  # not steps, seeds
            if getattr(leaf, "shape", None) and np.dtype(leaf.dtype).kind not in "iub"
        ]
        found[part] = (
            sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in leaves),
            sum(int(np.prod(leaf.shape)) for leaf in leaves),
        )
    parameters = found["model_params"][1]
    return {part: nbytes / parameters for part, (nbytes, _) in found.items()}


def digest(model_params: str) -> str:
    """The digest of the weights Orbax wrote in a checkpoint's `model_params` (a folder or gs://), as the stand-in
    rollout takes it of the weights it answers with (standin/sitecustomize.digest: the same sum, restored as numpy)."""
    import math

    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath

    folder = epath.Path(model_params)
    tree = ocp.StandardCheckpointer().metadata(folder).item_metadata.tree
    restored = ocp.PyTreeCheckpointer().restore(
        folder, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    )
    weights = [leaf for leaf in jax.tree.leaves(restored) if np.asarray(leaf).dtype.kind not in "iub"]
    return repr(math.fsum(float(np.square(np.asarray(leaf, np.float64)).sum()) for leaf in weights))


if __name__ == "__main__":
    asked = json.loads(sys.argv[1])
    said: dict = {}
    if "load" in asked:
        said["load"] = load_export(*map(Path, asked["load"]))
    if "learned" in asked:
        said["learned"] = learned(*map(Path, asked["learned"]))
    if "bytes" in asked:
        said["bytes"] = bytes_per_parameter(asked["bytes"])
    said["digests"] = {name: digest(folder) for name, folder in asked.get("digests", {}).items()}
    print(json.dumps(said))

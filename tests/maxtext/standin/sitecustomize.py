"""What the real-MaxText tier changes in MaxText 0.2.3's run on the CPU, all of it here (this folder goes first on
the PYTHONPATH of the scripts the tier runs, so Python imports this module at start-up):

1. vLLM's rollout is tunix's MockRollout, answering as a student would. vLLM and tpu-inference are TPU/GPU-only and
   install from GitHub commits, which these machines cannot fetch; train_rl imports them through tunix
   (tunix/generate/vllm_async_driver.py: `from vllm import envs`) and MaxText (integration/vllm). So `vllm` and
   `tpu_inference` import as empty stand-in modules, and the RL cluster's rollout engine ("vllm", or MaxText's
   MaxTextVllmRollout) becomes MockRollout, with no simulated latency, answering with the weights it was last
   given, as vLLM does: its own copy, replaced at each weight sync (tunix's MockRollout answers the trainer's model
   and is never synced). Its completions are GSM8K's answer format with the sum the question asks for or one more:
   on a prompt's first copy in a batch, the one the policy's greedy decoding takes (the likelier of the two tokens
   where they part, by the forward pass tunix's own logps use), on its others the other. So a group's rewards
   differ and GRPO has advantages to learn from, an evaluation's score is that of the weights it scored, and before
   each batch it says the digest of those weights in the log (TPU_GRPO_WEIGHTS_LINE): the tier holds the keeper, the
   export and the report to the weights each claims. With TPU_GRPO_ROLLOUT_LOG, each prompt, completion and whether
   it is right is appended to that file as a JSON line, for the tier to weigh what the training learned.
   What the run hands vLLM is checked first, as vLLM and MaxText's vLLM plugin would use it (check_vllm_settings).
2. The model is tiny: with TPU_GRPO_TINY_MODEL (a Hugging Face folder) and TPU_GRPO_TINY_MODEL_NAME (a MaxText
   model name), HF_MODEL_CONFIGS holds that folder's config for the name (and its base name, which to_maxtext
   converts an Instruct name as), so the conversions map the tiny checkpoint's layers. The MaxText side of the
   shrinking is the project's own `--set`s (override_model_config=True, base_emb_dim=...).
3. A slice's bucket is the Cloud Storage emulator. TensorFlow's GCS file system, which etils' epath uses for gs://
   where TensorFlow is installed (Orbax's files, JAX's compile cache, MaxText's folders), takes no endpoint; with
   EPATH_USE_TF=false (tests/maxtext/stack.py) epath uses gcsfs, which reads STORAGE_EMULATOR_HOST, here made to
   create a folder as TensorFlow's does, since MaxText checks that a folder it made exists
   (utils/gcs_utils.mkdir_and_check_permissions; gcsfs alone makes none).
"""

import functools
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import types

STUBBED = ("vllm", "tpu_inference")


class _Anything(type):
    """A class that stands for any name of a stubbed package: attributes, calls and subscripts give more of it."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __call__(cls, *args, **kwargs):
        return cls

    def __getitem__(cls, item):
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


PATCHES = {}


def after_import(name):
    """Run the decorated function on module `name` once it is imported."""

    def register(patch):
        PATCHES[name] = patch
        return patch

    return register


class _PostImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            PATCHES[fullname](module)

        spec.loader.exec_module = exec_module
        return spec


#: The tier's GSM8K rows ask for a sum (tests/maxtext/families.write_gsm8k).
QUESTION = re.compile(r"has (\d+) apples and buys (\d+) more")


def answers(prompt: str) -> tuple[str, str] | None:
    """The right and a wrong completion in rl.yml's format (reasoning_start_token ... solution_end_token): the sum the
    question asks for, and one more, its working slipped. The two differ in one token of the working beside the number
    (` =` or ` -`, one token each in the tier's tokenizer, so neither is longer): what GRPO rewards is then a habit that
    carries to every question (a tiny random model learns no sums in a few steps), so the right answer grows likelier
    with training, and the scores with it. None for a prompt that is not the tier's."""
    found = QUESTION.search(prompt)
    if not found:
        return None
    a, b = map(int, found.groups())
    return tuple(
        f"<reasoning>{a} + {b} {sign} {total}</reasoning><answer>{total}</answer>"
        for sign, total in (("=", a + b), ("-", a + b + 1))
    )


def digest(weights) -> str:
    """The weights' sum of squares, exact whatever the order of the leaves (math.fsum of each leaf's float64 sum): the
    same number from the rollout's copy and from a checkpoint Orbax restores (tests/maxtext/readback.py)."""
    import math

    import jax
    import numpy as np

    return repr(math.fsum(float(np.square(np.asarray(leaf, np.float64)).sum()) for leaf in jax.tree.leaves(weights)))


#: The one architecture MaxText's vLLM plugin registers with tpu-inference (maxtext/integration/vllm/
#: maxtext_vllm_adapter/__init__.py, `register_model("MaxTextForCausalLM", ...)`): a model MaxText runs inside vLLM.
MAXTEXT_IN_VLLM = "MaxTextForCausalLM"


def check_vllm_settings(rollout_config) -> None:
    """What the run hands vLLM, checked as vLLM would use it (MaxText 0.2.3 pins vLLM 2131b597 and tpu-inference
    4d089716, installed from GitHub: not here). vLLM applies `hf_overrides` to the model's config and passes
    `additional_config` through untouched (vllm/config/vllm.py); an `architectures` override must name a registered
    model; for MaxText's, its plugin makes a MaxText config of `additional_config["maxtext_config"]` over
    configs/inference/vllm.yml (adapter.generate_maxtext_config), which MaxText's pyconfig refuses with an unknown
    key or model name. The engine's model is `rollout_vllm_model_version`, which train_rl sets to its tokenizer_path
    (tunix/rl/rollout/vllm_rollout.py: `"model": rollout_config.rollout_vllm_model_version`): vLLM reads that
    repository's config.json from the Hub at its start, so a repository of a tokenizer alone fails there. The same
    calls here, before the rollout starts, refuse what vLLM's start on a TPU would."""
    import jax
    import transformers
    from maxtext.configs import pyconfig
    from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR

    for config in rollout_config.values() if isinstance(rollout_config, dict) else [rollout_config]:
        transformers.AutoConfig.from_pretrained(config.rollout_vllm_model_version)  # from HF_ENDPOINT, as vLLM reads it
        architectures = ((config.rollout_vllm_kwargs or {}).get("hf_overrides") or {}).get("architectures", [])
        if set(architectures) - {MAXTEXT_IN_VLLM}:
            raise ValueError(
                f"vllm_hf_overrides names architectures {architectures}; the model tpu-grpo runs inside "
                f"vLLM is MaxText's, registered by MaxText's vLLM plugin as {MAXTEXT_IN_VLLM}"
            )
        if architectures:
            overrides = dict((config.rollout_vllm_additional_config or {}).get("maxtext_config") or {})
            if "model_name" not in overrides:
                raise ValueError(
                    "vllm_additional_config has no maxtext_config.model_name: MaxText's vLLM plugin "
                    "would build MaxText's default model"
                )
            # the plugin's own call; the cache folder the training already uses, so JAX's stays where it is
            pyconfig.initialize(
                ["", os.path.join(MAXTEXT_CONFIGS_DIR, "inference", "vllm.yml")],
                **{**overrides, "jax_cache_dir": jax.config.jax_compilation_cache_dir or ""},
            )


@after_import("tunix.rl.rl_cluster")
def _mock_rollout(module):
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from flax.linen import partitioning
    from tunix.rl import common
    from tunix.rl.rollout.mock_rollout import MockRollout

    class AnsweringRollout(MockRollout):
        """Answers with the policy it was last given, as vLLM does: a copy of the weights it starts with (the model it
        is built on is the trainer's own, which the optimizer changes under it), replaced by each weight sync. A
        prompt's first copy gets the policy's greedy choice between the right and the wrong answer (likelier); its
        other copies, the other one, so a group's rewards differ and GRPO has something to learn."""

        def __init__(self, *args, actor_mesh, axis_rules, **kwargs):
            super().__init__(*args, **kwargs)
            self._mesh, self._axis_rules = actor_mesh, axis_rules
            self._policy = nnx.clone(self._model)
            self.update_params(nnx.state(self._model, nnx.Param))

        def update_params(self, params, filter_types=None):
            # a copy: the trainer may donate the buffers it was given (a device copy, allowed by sync_weights' guard)
            nnx.update(self._policy, jax.tree.map(jnp.copy, params))
            self._digest = None

        def model(self):
            # its own, as vLLM's rollout answers its sampler's: the learner syncs weights only into a model that is
            # not the trainer's (rl_learner.should_sync_weights)
            return self._policy

        def likelier(self, prompts, max_prompt, max_tokens) -> list[bool]:
            """For each of the tier's prompts, whether the policy prefers its right completion to its wrong one where a
            greedy decoder chooses between them: the first token they differ in, after the same prefix (the sign)."""
            if not prompts:
                return []
            pairs = [answers(prompt) for prompt in prompts]
            pad = self.pad_id()
            asked = np.full((2 * len(prompts), max_prompt), pad, np.int32)
            said = np.full((2 * len(prompts), max_tokens), pad, np.int32)
            for row, (prompt, completion) in enumerate((p, c) for p, pair in zip(prompts, pairs) for c in pair):
                tokens = self._encode_text(prompt)[-max_prompt:]
                asked[row, max_prompt - len(tokens) :] = tokens
                tokens = self._encode_text(completion)[:max_tokens]
                said[row, : len(tokens)] = tokens
            graphdef, state = nnx.split(self._policy)
            with self._mesh, partitioning.axis_rules(self._axis_rules):
                logps = common.compute_per_token_logps(
                    graphdef, state, jnp.asarray(asked), jnp.asarray(said), pad_id=pad, eos_id=self.eos_id()
                )
            logps = np.asarray(logps)
            chosen = []
            for right in range(0, len(said), 2):
                differs = int(np.argmax(said[right] != said[right + 1]))
                chosen.append(bool(logps[right, differs] > logps[right + 1, differs]))
            return chosen

        def generate(self, prompts, rollout_config, **kwargs):
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            made = super().generate(prompts, rollout_config, **kwargs)
            texts, tokens = list(made.text), list(made.tokens)
            max_tokens = max(1, rollout_config.max_tokens_to_generate)
            asked = list(dict.fromkeys(p for p in prompts if answers(p)))
            choice = dict(zip(asked, self.likelier(asked, rollout_config.max_prompt_length, max_tokens)))
            if self._digest is None:
                self._digest = digest(nnx.state(self._policy, nnx.Param))
            sys.stderr.write(f"{os.environ['TPU_GRPO_WEIGHTS_LINE']} {self._digest}\n")
            sys.stderr.flush()
            right = []
            for i, prompt in enumerate(prompts):
                if prompt not in choice:
                    right.append(False)
                    continue
                first = prompt not in prompts[:i]
                right.append(choice[prompt] == first)  # the greedy choice first, the other after
                texts[i] = answers(prompt)[0 if right[-1] else 1]
                tokens[i] = self._encode_text(texts[i])[:max_tokens]
            log = os.environ.get("TPU_GRPO_ROLLOUT_LOG")
            if log:
                with open(log, "a") as file:
                    file.writelines(
                        json.dumps({"prompt": p, "completion": t, "right": r}) + "\n"
                        for p, t, r in zip(prompts, texts, right)
                    )
            return dataclasses.replace(
                made,
                text=texts,
                tokens=tokens,
                logits=[np.zeros((len(t), self._vocab_size), dtype=np.float16) for t in tokens],
                logprobs=[np.zeros(len(t), dtype=np.float32) for t in tokens] if made.logprobs is not None else None,
            )

    init = module.ClusterConfig.__init__

    def __init__(self, *args, **kwargs):
        engine = kwargs.get("rollout_engine", "vanilla")
        if engine == "vllm" or not isinstance(engine, str):
            check_vllm_settings(kwargs["rollout_config"])
            # the forward pass of the trainer's model, under the trainer's mesh and sharding rules
            kwargs["rollout_engine"] = functools.partial(
                AnsweringRollout,
                min_generation_time=0.0,
                max_generation_time=0.0,
                actor_mesh=kwargs["role_to_mesh"][module.Role.ACTOR],
                axis_rules=(kwargs.get("role_to_logical_axis_rule") or {}).get(module.Role.ACTOR, ()),
            )
        init(self, *args, **kwargs)

    module.ClusterConfig.__init__ = __init__


@after_import("maxtext.checkpoint_conversion.utils.hf_model_configs")
def _tiny_configs(module):
    folder, name = os.environ.get("TPU_GRPO_TINY_MODEL"), os.environ.get("TPU_GRPO_TINY_MODEL_NAME")
    if folder and name:
        import transformers

        for each in {name, name.replace("-Instruct", "")}:
            module.HF_MODEL_CONFIGS[each] = transformers.AutoConfig.from_pretrained(folder)


@after_import("etils.epath.backend")
def _folders_as_tensorflow_makes_them(module):
    if os.environ.get("EPATH_USE_TF", "").lower() not in ("false", "no", "f", "0"):
        return
    import fsspec
    import gcsfs
    from fsspec.asyn import sync_wrapper

    class TensorFlowsFolders(gcsfs.GCSFileSystem):
        """gcsfs, making a folder as TensorFlow's GCS file system does: an empty object named FOLDER/
        (tensorflow/tsl/platform/cloud/gcs_file_system.cc, CreateDir; RecursivelyCreateDir makes each level)."""

        async def _mkdir(self, path, create_parents=True, **kwargs):
            bucket, key, _ = self.split_path(path)
            if not key:
                return await super()._mkdir(path, create_parents=create_parents, **kwargs)
            await self._pipe_file(f"{bucket}/{key.rstrip('/')}/", b"")

        async def _makedirs(self, path, exist_ok=False):
            bucket, key, _ = self.split_path(path)
            parts = [part for part in key.split("/") if part]
            for end in range(1, len(parts) + 1):
                await self._pipe_file(f"{bucket}/{'/'.join(parts[:end])}/", b"")

        mkdir = sync_wrapper(_mkdir)
        makedirs = sync_wrapper(_makedirs)

    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, TensorFlowsFolders, clobber=True)


sys.meta_path[:0] = [_PostImport(), _Stubs()]

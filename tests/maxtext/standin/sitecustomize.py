"""What the real-MaxText tier changes in MaxText 0.2.3's run on the CPU, all of it here (this folder goes first on
the PYTHONPATH of the scripts the tier runs, so Python imports this module at start-up):

1. vLLM's rollout is tunix's MockRollout, answering as a student would. vLLM and tpu-inference are TPU/GPU-only and
   install from GitHub commits, which these machines cannot fetch; train_rl imports them through tunix
   (tunix/generate/vllm_async_driver.py: `from vllm import envs`) and MaxText (integration/vllm). So `vllm` and
   `tpu_inference` import as empty stand-in modules, and the RL cluster's rollout engine ("vllm", or MaxText's
   MaxTextVllmRollout) becomes MockRollout, with no simulated latency, whose completions are GSM8K's answer format
   with the sum the question asks for on a prompt's first copy in a batch and one more on its others (a fixed rule
   on the prompt): a group's rewards differ, so GRPO has advantages to learn from (MockRollout's own dummy words
   score 0 everywhere, and nothing is learned). With TPU_GRPO_ROLLOUT_LOG, each prompt, completion and whether it
   is right is appended to that file as a JSON line, for the tier to weigh what the training learned.
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


def answer(prompt: str, first: bool) -> str | None:
    """A completion in rl.yml's format (reasoning_start_token ... solution_end_token): the right sum on a prompt's
    first copy, one more on its others; None for a prompt that is not the tier's."""
    found = QUESTION.search(prompt)
    if not found:
        return None
    a, b = map(int, found.groups())
    total = a + b if first else a + b + 1
    return f"<reasoning>{a} + {b} = {total}</reasoning><answer>{total}</answer>"


#: The one architecture MaxText's vLLM plugin registers with tpu-inference (maxtext/integration/vllm/
#: maxtext_vllm_adapter/__init__.py, `register_model("MaxTextForCausalLM", ...)`): a model MaxText runs inside vLLM.
MAXTEXT_IN_VLLM = "MaxTextForCausalLM"


def check_vllm_settings(rollout_config) -> None:
    """What the run hands vLLM, checked as vLLM would use it (MaxText 0.2.3 pins vLLM 2131b597 and tpu-inference
    4d089716, installed from GitHub: not here). vLLM applies `hf_overrides` to the model's config and passes
    `additional_config` through untouched (vllm/config/vllm.py); an `architectures` override must name a registered
    model; for MaxText's, its plugin makes a MaxText config of `additional_config["maxtext_config"]` over
    configs/inference/vllm.yml (adapter.generate_maxtext_config), which MaxText's pyconfig refuses with an unknown
    key or model name. The same call here, before the rollout starts, refuses what vLLM's start on a TPU would."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR

    for config in rollout_config.values() if isinstance(rollout_config, dict) else [rollout_config]:
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

    import numpy as np
    from tunix.rl.rollout.mock_rollout import MockRollout

    class AnsweringRollout(MockRollout):
        def generate(self, prompts, rollout_config, **kwargs):
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            made = super().generate(prompts, rollout_config, **kwargs)
            texts, tokens = list(made.text), list(made.tokens)
            for i, prompt in enumerate(prompts):
                text = answer(prompt, first=prompt not in prompts[:i])
                encoded = self._encode_text(text) if text else None
                if encoded is not None and len(encoded):
                    texts[i], tokens[i] = text, encoded[: max(1, rollout_config.max_tokens_to_generate)]
            log = os.environ.get("TPU_GRPO_ROLLOUT_LOG")
            if log:
                with open(log, "a") as file:
                    file.writelines(
                        json.dumps({"prompt": p, "completion": t, "right": p not in prompts[:i]}) + "\n"
                        for i, (p, t) in enumerate(zip(prompts, texts))
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
            kwargs["rollout_engine"] = functools.partial(
                AnsweringRollout, min_generation_time=0.0, max_generation_time=0.0
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

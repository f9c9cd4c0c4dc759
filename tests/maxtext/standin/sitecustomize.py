"""What the real-MaxText tier changes in MaxText 0.2.3's run on the CPU, all of it here (this folder goes first on
the PYTHONPATH of the scripts the tier runs, so Python imports this module at start-up):

1. vLLM's rollout is tunix's MockRollout. vLLM and tpu-inference are TPU/GPU-only and install from GitHub commits,
   which these machines cannot fetch; train_rl imports them through tunix (tunix/generate/vllm_async_driver.py:
   `from vllm import envs`) and MaxText (integration/vllm). So `vllm` and `tpu_inference` import as empty stand-in
   modules, and the RL cluster's rollout engine ("vllm", or MaxText's MaxTextVllmRollout) becomes MockRollout, with
   no simulated latency. It generates dummy words: rewards are 0 and nothing is learned, as in the recorded run.
2. The model is tiny: with TPU_GRPO_TINY_MODEL (a Hugging Face folder) and TPU_GRPO_TINY_MODEL_NAME (a MaxText
   model name), HF_MODEL_CONFIGS holds that folder's config for the name (and its base name, which to_maxtext
   converts an Instruct name as), so the conversions map the tiny checkpoint's layers. The MaxText side of the
   shrinking is the project's own `--set`s (override_model_config=True, base_emb_dim=...).
"""

import functools
import importlib.abc
import importlib.machinery
import os
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


@after_import("tunix.rl.rl_cluster")
def _mock_rollout(module):
    from tunix.rl.rollout.mock_rollout import MockRollout

    init = module.ClusterConfig.__init__

    def __init__(self, *args, **kwargs):
        engine = kwargs.get("rollout_engine", "vanilla")
        if engine == "vllm" or not isinstance(engine, str):
            kwargs["rollout_engine"] = functools.partial(MockRollout, min_generation_time=0.0,
                                                         max_generation_time=0.0)
        init(self, *args, **kwargs)
    module.ClusterConfig.__init__ = __init__


@after_import("maxtext.checkpoint_conversion.utils.hf_model_configs")
def _tiny_configs(module):
    folder, name = os.environ.get("TPU_GRPO_TINY_MODEL"), os.environ.get("TPU_GRPO_TINY_MODEL_NAME")
    if folder and name:
        import transformers

        for each in {name, name.replace("-Instruct", "")}:
            module.HF_MODEL_CONFIGS[each] = transformers.AutoConfig.from_pretrained(folder)


sys.meta_path[:0] = [_PostImport(), _Stubs()]

"""The model table: every model tpu-grpo post-trains with MaxText 0.2.3, and the smallest v6e shape it fits.

The facts come from the `maxtext==0.2.3` wheel (tests/data/maxtext-0.2.3-models.json keeps them with their source
paths): a name must be a `ModelName` (configs/types.py) with an entry in `HF_MODEL_CONFIGS`, which every RL run reads,
in `HF_IDS` (to_maxtext's source and the default tokenizer) and in `PARAM_MAPPING`, `HF_SHAPE` and `HOOK_FNS`
(to_huggingface). vLLM runs the rollout with its own model for names starting `llama3.1`, `qwen2` and dense `qwen3`
(integration/tunix/weight_mapping); the others run MaxText's own model inside vLLM, as MaxText's Gemma 3 RL test does
(`vllm_hf_overrides` and `vllm_additional_config`, unscanned layers). The parameters are counted from the wheel's
`HF_MODEL_CONFIGS` (the decoder's; Gemma 3's vision tower is not trained).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tpu_grpo.catalog.accelerators import ACCELERATORS, Accelerator

#: Bytes a parameter, bfloat16 throughout, as MaxText 0.2.3 writes them (measured in the real-MaxText tier: an actor
#: checkpoint's model_params is bfloat16 weights, its optimizer_state two bfloat16 moments, since
#: utils_rl.get_optimizer gives optax.adamw no mu_dtype; tests/maxtext/test_real_maxtext.py).
WEIGHT_BYTES = 2
MOMENT_BYTES = 2 * 2
#: A training checkpoint on disk: the weights and AdamW's moments.
CHECKPOINT_BYTES = WEIGHT_BYTES + MOMENT_BYTES
#: The memory arithmetic: MaxText's RL trainer holds the actor, its gradients, the moments and the reference model;
#: the rollout holds vLLM's copy of the weights, and its KV cache in what is left.
TRAINER_BYTES = WEIGHT_BYTES + WEIGHT_BYTES + MOMENT_BYTES + WEIGHT_BYTES
ROLLOUT_BYTES = WEIGHT_BYTES
#: rl.yml: vLLM may fill this share of each sampler chip's HBM, what is already there included.
HBM_UTILIZATION_VLLM = 0.72
#: rl.yml: with Pathways on several hosts, the first half of the chips train and the other half sample
#: (trainer_devices_fraction, sampler_devices_fraction); on one host both share every chip.
TRAINER_FRACTION = 0.5

#: The licences whose Hub repositories are gated (docs/first-run.md: accept the licence on the model's page first).
GATED_LICENSES = ("llama3.1", "gemma")


@dataclass(frozen=True)
class Model:
    name: str  # MaxText's model_name
    hf_id: str  # HF_IDS[name]: what to_maxtext converts, and the rollout's Hugging Face model
    params_b: float  # parameters, in billions
    native_rollout: bool  # vLLM's own model (tunix's weight mapping), else MaxText's model inside vLLM
    license: str  # the Hub's license id of the weights (its model card's), which a published model keeps
    tokenizer: str | None = None  # what to train and export with, when not hf_id's (a base model's Instruct one)
    export_name: str | None = None  # the model_name to_huggingface gets, when not name (the tutorial's llama3.1-8b)
    #: to_maxtext's eager loader, where the model needs one (to_maxtext.py: "Must use "transformers" for gemma3-4b
    #: due to mapping compatibility"; tests/end_to_end/tpu/gemma3/4b/test_gemma3_to_mt.sh passes it with
    #: --lazy_load_tensors=False); None: the stack's lazyLoadTensors decides, with safetensors.
    eager_load_method: str | None = None
    #: The rollout's vLLM tensor parallelism, where MaxText's recipe for the model sets it (the data parallelism is
    #: then derived, -1); None: one replica over the sampler's chips (data 1, tensor -1).
    rollout_tensor_parallelism: int | None = None
    #: What MaxText's own model inside vLLM is given beyond its name, as the model's recipe has it.
    maxtext_in_vllm: tuple[tuple[str, str | bool], ...] = ()
    #: The Hub repository holds the weights twice: its safetensors and Meta's own format (`original/`, as large).
    #: MaxText 0.2.3's eager loader downloads both (checkpoint_conversion/utils/utils.py, load_hf_dict_from_safetensors:
    #: `snapshot_download` with no pattern); the lazy one fetches each safetensors file alone (`hf_hub_download`).
    original_copy: bool = False

    @property
    def gated(self) -> bool:
        """The Hub serves the weights only to a token whose account accepted their licence (Meta's Llama 3.1 and
        Google's Gemma repositories are gated; Qwen's are not)."""
        return self.license in GATED_LICENSES

    @property
    def training_tokenizer(self) -> str:
        return self.tokenizer or self.hf_id

    @property
    def export_model(self) -> str:
        return self.export_name or self.name

    @property
    def weights_gb(self) -> float:
        """The bfloat16 weights: the Hub's safetensors a conversion downloads (MaxText 0.2.3's rl_qwen3_30b.md:
        "Converting the 30B model requires approximately 62 GB of free disk space"), a converted checkpoint (bf16,
        to_maxtext's default `--save_dtype`), an export, a saved model."""
        return self.params_b * WEIGHT_BYTES

    @property
    def checkpoint_gb(self) -> float:
        """One training checkpoint: the weights and AdamW's moments."""
        return self.params_b * CHECKPOINT_BYTES

    def conversion_download_gb(self, lazy: bool) -> float:
        """What a conversion that downloads the model itself puts on disk: the safetensors, or (loading eagerly) the
        whole repository."""
        return self.weights_gb * (2 if self.original_copy and not lazy else 1)

    @property
    def eager_conversion_gb(self) -> float:
        """What a conversion loading eagerly holds in memory: the downloaded weights and their converted copy."""
        return 2 * self.weights_gb

    def rollout_overrides(self) -> dict[str, str]:
        """The train step's `key=value`s that run MaxText's own model inside vLLM (none for a native rollout), as
        MaxText's Gemma 3 RL test passes them."""
        if self.native_rollout:
            return {}
        config = json.dumps(
            {"maxtext_config": {"model_name": self.name, "log_config": "false", **dict(self.maxtext_in_vllm)}}
        )
        return {"vllm_hf_overrides": '{architectures: ["MaxTextForCausalLM"]}', "vllm_additional_config": config}

    def rollout_parallelism(self) -> dict[str, str]:
        """The rollout's `rollout_data_parallelism` and `rollout_tensor_parallelism` (at most one -1, MaxText's
        rl_on_multi_host.md)."""
        if self.rollout_tensor_parallelism is None:
            return {"rollout_data_parallelism": "1", "rollout_tensor_parallelism": "-1"}
        return {"rollout_data_parallelism": "-1", "rollout_tensor_parallelism": str(self.rollout_tensor_parallelism)}

    def need_gb(self, shape: Accelerator, num_slices: int = 1) -> tuple[float, float, str]:
        """(GB needed, GB there, the arithmetic as one line) on this shape: on one host, the trainer and the rollout
        within vLLM's share of all the HBM; on a slice, the trainer within its half."""
        hbm = shape.hbm_gb * num_slices
        if shape.hosts == 1:
            need, there = (TRAINER_BYTES + ROLLOUT_BYTES) * self.params_b, HBM_UTILIZATION_VLLM * hbm
            return (
                need,
                there,
                (
                    f"({TRAINER_BYTES} training + {ROLLOUT_BYTES} rollout bytes) x {self.params_b:g}B "
                    f"parameters = {need:.0f} GB, within {HBM_UTILIZATION_VLLM:.0%} (vLLM's "
                    f"hbm_utilization) of {hbm} GB of HBM = {there:.0f} GB"
                ),
            )
        need, there = TRAINER_BYTES * self.params_b, TRAINER_FRACTION * hbm
        return (
            need,
            there,
            (
                f"{TRAINER_BYTES} training bytes x {self.params_b:g}B parameters = {need:.0f} GB, "
                f"within the trainer's half of {hbm} GB of HBM = {there:.0f} GB"
            ),
        )

    def fits(self, shape: Accelerator, num_slices: int = 1) -> bool:
        need, there, _ = self.need_gb(shape, num_slices)
        if shape.hosts > 1:  # and the sampler's half holds the rollout's weights
            return need <= there and ROLLOUT_BYTES * self.params_b <= HBM_UTILIZATION_VLLM * there
        return need <= there

    @property
    def smallest(self) -> Accelerator:
        """The smallest v6e shape (the accelerator table's order) this model fits."""
        return next(shape for shape in ACCELERATORS.values() if self.fits(shape))


MODELS: dict[str, Model] = {
    row.name: row
    for row in (
        # a base model trains with its Instruct tokenizer, as rl.yml's comments have it
        Model(
            "llama3.1-8b",
            "meta-llama/Llama-3.1-8B",
            8.03,
            True,
            "llama3.1",
            tokenizer="meta-llama/Llama-3.1-8B-Instruct",
            original_copy=True,
        ),
        Model(
            "llama3.1-8b-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
            8.03,
            True,
            "llama3.1",
            export_name="llama3.1-8b",
            original_copy=True,
        ),  # the tutorial's export
        # rl_on_multi_host.md's 70B commands: rollout_tensor_parallelism=8
        Model(
            "llama3.1-70b",
            "meta-llama/Llama-3.1-70B",
            70.55,
            True,
            "llama3.1",
            tokenizer="meta-llama/Llama-3.1-70B-Instruct",
            rollout_tensor_parallelism=8,
            original_copy=True,
        ),
        Model("qwen3-0.6b", "Qwen/Qwen3-0.6B", 0.6, True, "apache-2.0"),
        Model("qwen3-4b", "Qwen/Qwen3-4B", 4.02, True, "apache-2.0"),
        Model("qwen3-8b", "Qwen/Qwen3-8B", 8.19, True, "apache-2.0"),
        Model("qwen3-14b", "Qwen/Qwen3-14B", 14.77, True, "apache-2.0"),
        Model("qwen3-32b", "Qwen/Qwen3-32B", 32.76, True, "apache-2.0"),
        Model("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", 1.54, True, "apache-2.0"),
        Model("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7.62, True, "apache-2.0"),
        Model("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", 14.77, True, "apache-2.0"),
        Model("gemma3-4b", "google/gemma-3-4b-it", 3.88, False, "gemma", eager_load_method="transformers"),
        Model("gemma3-12b", "google/gemma-3-12b-it", 11.77, False, "gemma", eager_load_method="transformers"),
        Model("gemma3-27b", "google/gemma-3-27b-it", 27.01, False, "gemma", eager_load_method="transformers"),
        # scripts/run_qwen3_30b_rl.sh: rollout_tensor_parallelism=4 (data 16 on its slice) and these for MaxText in vLLM
        Model(
            "qwen3-30b-a3b",
            "Qwen/Qwen3-30B-A3B-Thinking-2507",
            30.53,
            False,
            "apache-2.0",
            rollout_tensor_parallelism=4,
            maxtext_in_vllm=(
                ("model_call_mode", "inference"),
                ("enable_dp_attention", False),
                ("allow_split_physical_axes", True),
                ("weight_dtype", "bfloat16"),
                ("prefuse_moe_weights", True),
            ),
        ),
    )
}
DEFAULT_MODEL = "llama3.1-8b-Instruct"  # the tutorial's
#: What MaxText 0.2.3's RL trains on by default (rl.yml: dataset_name, hf_name), and its losses (configs/types.py,
#: rl.loss_algo).
DEFAULT_DATASET, DEFAULT_DATASET_CONFIG = "openai/gsm8k", "main"
#: The rows of GSM8K's test split (its dataset card: 7,473 train, 1,319 test), which the evaluations take in turn.
DEFAULT_DATASET_TEST_ROWS = 1319
LOSS_ALGOS = ("grpo", "gspo-token")

"""Tiny checkpoints of the model table's families, as their Hugging Face classes lay them out: the real config with
layers and widths shrunk, and each tensor named and shaped as that class has it (random values). MaxText converts,
trains and exports them as it would the real model, its own config shrunk to match by `--set`s.

The files are written by the tier's own venv (`python -m tests.maxtext.families MODEL FOLDER`, and `gsm8k FOLDER`
for the data), which has safetensors, pyarrow, torch and transformers, as a host has them."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The tiny tokenizer (vocabulary 512, with a chat template) of MaxText's recorded run.
TOKENIZER = ROOT / "tests/data/maxtext-0.2.3/hf-export"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
VOCAB, HIDDEN, MLP, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 512, 64, 128, 2, 4, 2, 16
EXPERTS, EXPERTS_PER_TOKEN, EXPERT_MLP = 4, 2, 32


@dataclass(frozen=True)
class Family:
    model: str  # the table's row this family is tested with
    architecture: str  # the Hugging Face class
    config: dict  # its config.json, shrunk
    q_norm: bool = False  # Qwen3: per-head RMS norms of the queries and keys
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    experts: bool = False  # Qwen3 MoE: a router and EXPERTS experts in place of the dense MLP
    #: The class's weights MaxText neither trains nor exports (its models are text-only): the export leaves them out
    untrained: tuple[str, ...] = ()

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's name and shape, as the class's state dict has them."""
        shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
        if not self.config["tie_word_embeddings"]:  # tied: the logits use the embedding
            shapes["lm_head.weight"] = (VOCAB, HIDDEN)
        for i in range(LAYERS):
            layer = f"model.layers.{i}"
            shapes.update(
                {
                    f"{layer}.input_layernorm.weight": (HIDDEN,),
                    f"{layer}.post_attention_layernorm.weight": (HIDDEN,),
                    f"{layer}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                    f"{layer}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                    f"{layer}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                    f"{layer}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                }
            )
            if self.experts:
                shapes[f"{layer}.mlp.gate.weight"] = (EXPERTS, HIDDEN)
                for e in range(EXPERTS):
                    shapes.update(
                        {
                            f"{layer}.mlp.experts.{e}.gate_proj.weight": (EXPERT_MLP, HIDDEN),
                            f"{layer}.mlp.experts.{e}.up_proj.weight": (EXPERT_MLP, HIDDEN),
                            f"{layer}.mlp.experts.{e}.down_proj.weight": (HIDDEN, EXPERT_MLP),
                        }
                    )
            else:
                shapes.update(
                    {
                        f"{layer}.mlp.gate_proj.weight": (MLP, HIDDEN),
                        f"{layer}.mlp.up_proj.weight": (MLP, HIDDEN),
                        f"{layer}.mlp.down_proj.weight": (HIDDEN, MLP),
                    }
                )
            if self.q_norm:
                shapes.update(
                    {f"{layer}.self_attn.q_norm.weight": (HEAD_DIM,), f"{layer}.self_attn.k_norm.weight": (HEAD_DIM,)}
                )
            if self.qkv_bias:
                shapes.update(
                    {
                        f"{layer}.self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
                        f"{layer}.self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
                        f"{layer}.self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,),
                    }
                )
        return shapes

    def write(self, folder: Path, seed: int = 0) -> Path:
        """The checkpoint (config, safetensors, tokenizer) in `folder`, as the Hub's snapshot would hold it."""
        import numpy as np
        from safetensors.numpy import save_file

        folder.mkdir(parents=True, exist_ok=True)
        if "text_config" in self.config:  # a text and vision model: its own class lays it out
            import torch
            import transformers

            torch.manual_seed(seed)
            config = transformers.AutoConfig.for_model(**self.config)
            getattr(transformers, self.architecture)(config).save_pretrained(folder)
            write_tokenizer(folder)
            return folder
        random = np.random.default_rng(seed)
        save_file(
            {name: (random.standard_normal(shape) * 0.02).astype(np.float32) for name, shape in self.tensors().items()},
            str(folder / "model.safetensors"),
        )
        (folder / "config.json").write_text(json.dumps(self.config, indent=1))
        write_tokenizer(folder)
        return folder

    @property
    def maxtext_overrides(self) -> dict[str, str]:
        """MaxText's model config shrunk to the checkpoint: the `--set`s every step gets."""
        experts = (
            {
                "num_experts": str(EXPERTS),
                "num_experts_per_tok": str(EXPERTS_PER_TOKEN),
                "base_moe_mlp_dim": str(EXPERT_MLP),
                "sparse_matmul": "False",
            }
            if self.experts
            else {}
        )
        return {
            "override_model_config": "True",
            "base_emb_dim": str(HIDDEN),
            "base_mlp_dim": str(MLP),
            "base_num_decoder_layers": str(LAYERS),
            "base_num_query_heads": str(HEADS),
            "base_num_kv_heads": str(KV_HEADS),
            "head_dim": str(HEAD_DIM),
            "vocab_size": str(VOCAB),
            **experts,
        }


def write_tokenizer(folder: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER / name, folder / name)


def _shrunk(**config) -> dict:
    return {
        "hidden_size": HIDDEN,
        "intermediate_size": MLP,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **config,
    }


FAMILIES = {
    family.model: family
    for family in (
        # meta-llama/Llama-3.1-8B-Instruct's config.json, shrunk
        Family(
            "llama3.1-8b-Instruct",
            "LlamaForCausalLM",
            _shrunk(
                architectures=["LlamaForCausalLM"],
                model_type="llama",
                rms_norm_eps=1e-5,
                attention_bias=False,
                mlp_bias=False,
                rope_theta=500000.0,
                rope_scaling={
                    "factor": 8.0,
                    "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
            ),
        ),
        # Qwen/Qwen3-8B's, shrunk
        Family(
            "qwen3-8b",
            "Qwen3ForCausalLM",
            _shrunk(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1000000.0, attention_bias=False),
            q_norm=True,
        ),
        # Qwen/Qwen2.5-7B-Instruct's, shrunk, with the attention_bias MaxText's HF_MODEL_CONFIGS gives it (the Hub's
        # config.json has none: Qwen2's q, k and v projections always have biases)
        Family(
            "qwen2.5-7b",
            "Qwen2ForCausalLM",
            _shrunk(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1000000.0, attention_bias=True),
            qkv_bias=True,
        ),
        # Qwen/Qwen3-30B-A3B-Thinking-2507's, shrunk (its intermediate_size, 6144, is 8 experts' 768 each: so here)
        Family(
            "qwen3-30b-a3b",
            "Qwen3MoeForCausalLM",
            _shrunk(
                architectures=["Qwen3MoeForCausalLM"],
                model_type="qwen3_moe",
                rope_theta=10000000.0,
                attention_bias=False,
                intermediate_size=EXPERT_MLP * EXPERTS_PER_TOKEN,
                num_experts=EXPERTS,
                num_experts_per_tok=EXPERTS_PER_TOKEN,
                moe_intermediate_size=EXPERT_MLP,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                norm_topk_prob=True,
            ),
            q_norm=True,
            experts=True,
        ),
        # google/gemma-3-4b-it's (MaxText's HF_MODEL_CONFIGS), shrunk, its vision tower too
        Family(
            "gemma3-4b",
            "Gemma3ForConditionalGeneration",
            dict(
                architectures=["Gemma3ForConditionalGeneration"],
                model_type="gemma3",
                boi_token_index=VOCAB - 3,
                eoi_token_index=VOCAB - 2,
                image_token_index=VOCAB - 1,
                eos_token_id=[1, 2],
                mm_tokens_per_image=4,
                text_config={
                    "model_type": "gemma3_text",
                    "hidden_size": HIDDEN,
                    "intermediate_size": MLP,
                    "num_hidden_layers": LAYERS,
                    "num_attention_heads": HEADS,
                    "num_key_value_heads": KV_HEADS,
                    "head_dim": HEAD_DIM,
                    "query_pre_attn_scalar": HEAD_DIM,
                    "vocab_size": VOCAB,
                    "hidden_activation": "gelu_pytorch_tanh",
                    "rms_norm_eps": 1e-6,
                    "attention_bias": False,
                    "rope_theta": 1000000.0,
                    "rope_local_base_freq": 10000.0,
                    "sliding_window": 32,
                    "sliding_window_pattern": 6,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "max_position_embeddings": 2048,
                },
                vision_config={
                    "model_type": "siglip_vision_model",
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_channels": 3,
                    "image_size": 28,
                    "patch_size": 14,
                    "hidden_act": "gelu_pytorch_tanh",
                    "layer_norm_eps": 1e-6,
                    "vision_use_head": False,
                },
            ),
            untrained=("model.vision_tower.", "model.multi_modal_projector."),
        ),
    )
}


def write_gsm8k(folder: Path) -> None:
    """GSM8K's columns (question; answer ending `#### N`), a few rows: train and test as parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
            "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
        }
        for a in range(1, 17)
        for b in range(1, 4)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    # the test split: 8 rows the training's evaluations score (testBatches 2 of batch_size 4), 4 more for the report
    pq.write_table(pa.Table.from_pylist(rows[:12]), folder / "test.parquet")


#: Every other row of the model table, as its family's checkpoint under its own name, and whether the row ties its word
#: embeddings (MaxText's HF_MODEL_CONFIGS: the small Qwen3 and Qwen2.5 and every Gemma 3 do).
SAME_FAMILY = {
    "llama3.1-8b": ("llama3.1-8b-Instruct", False),
    "llama3.1-70b": ("llama3.1-8b-Instruct", False),
    "qwen3-0.6b": ("qwen3-8b", True),
    "qwen3-4b": ("qwen3-8b", True),
    "qwen3-14b": ("qwen3-8b", False),
    "qwen3-32b": ("qwen3-8b", False),
    "qwen2.5-1.5b": ("qwen2.5-7b", True),
    "qwen2.5-14b": ("qwen2.5-7b", False),
    "gemma3-12b": ("gemma3-4b", True),
    "gemma3-27b": ("gemma3-4b", True),
}
ROWS = {
    **FAMILIES,
    **{
        row: replace(FAMILIES[family], model=row, config={**FAMILIES[family].config, "tie_word_embeddings": tied})
        for row, (family, tied) in SAME_FAMILY.items()
    },
}


if __name__ == "__main__":
    what, folder = sys.argv[1], Path(sys.argv[2])
    if what == "gsm8k":
        write_gsm8k(folder)
    else:
        ROWS[what].write(folder)

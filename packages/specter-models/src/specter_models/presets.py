"""Named model configurations: the three full-size models, tiny test models and the demo.

Full-size presets reproduce the real models' transformers configurations (shape for shape:
the parameter counts match docs/benchmarking.md) so that Specter can be measured on them with
seeded random weights, since no weights can be downloaded here. Two deliberate differences
from the published configs, neither of which changes a shape or a FLOP:

* Phi-3.5-MoE uses plain RoPE instead of ``longrope`` and no sliding window. transformers'
  ``longrope`` reads ``max(position_ids)`` back to the host on every forward (a device sync
  on the decode path), and the 131072-token window never binds at our sequence lengths.
* DeepSeek-V2-Lite keeps its YaRN RoPE (computed once at construction, no runtime cost).

Tiny presets (``tiny-*``) keep each architecture's structure (MLA, shared experts, dense
first layer, sigmoid-gated shared expert, sparsemixer routing, attention biases) at sizes
that run in milliseconds on a CPU. ``specter-code-tiny`` is the trained demo checkpoint
shipped as package data.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from transformers import DeepseekV2Config, PhimoeConfig, PretrainedConfig, Qwen2MoeConfig

DEMO_MODEL = "specter-code-tiny"
# Tiny presets draw weights wider than the real models' 0.02: at hidden size 64 that scale
# leaves the logits almost input-independent (every draft accepted, degenerate greedy
# loops), which would hide rollback bugs from the tests.
TINY_INITIALIZER_RANGE = 0.15


@dataclass(frozen=True)
class Preset:
    """A named configuration built from seeded random weights.

    Attributes:
        name: the preset's name, as given to ``specter_models.load``.
        display_name: the model it reproduces, for tables.
        make_config: builds a fresh transformers config.
        low_budget_gb: the benchmark's low GPU memory budget (None for test presets).
        high_budget_gb: the benchmark's high GPU memory budget (None for test presets).
    """

    name: str
    display_name: str
    make_config: Callable[[], PretrainedConfig]
    low_budget_gb: float | None = None
    high_budget_gb: float | None = None


def _deepseek_v2_lite() -> DeepseekV2Config:
    return DeepseekV2Config(
        vocab_size=102400,
        hidden_size=2048,
        intermediate_size=10944,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_shared_experts=2,
        n_routed_experts=64,
        num_experts_per_tok=6,
        routed_scaling_factor=1.0,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        bos_token_id=100000,
        eos_token_id=100001,
        tie_word_embeddings=False,
    )


def _qwen15_moe() -> Qwen2MoeConfig:
    return Qwen2MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=60,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        max_position_embeddings=8192,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=151643,
        eos_token_id=151643,
        tie_word_embeddings=False,
    )


def _phi35_moe() -> PhimoeConfig:
    return PhimoeConfig(
        vocab_size=32064,
        hidden_size=4096,
        intermediate_size=6400,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=16,
        num_experts_per_tok=2,
        attention_bias=True,
        lm_head_bias=True,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        sliding_window=None,
        router_jitter_noise=0.01,
        input_jitter_noise=0.01,
        bos_token_id=1,
        eos_token_id=32000,
        tie_word_embeddings=False,
    )


def _tiny_deepseek_v2() -> DeepseekV2Config:
    return DeepseekV2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        routed_scaling_factor=1.5,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        topk_method="greedy",
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=TINY_INITIALIZER_RANGE,
    )


def _tiny_qwen2_moe() -> Qwen2MoeConfig:
    return Qwen2MoeConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=TINY_INITIALIZER_RANGE,
    )


def _tiny_phimoe() -> PhimoeConfig:
    return PhimoeConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        attention_bias=True,
        lm_head_bias=True,
        max_position_embeddings=512,
        sliding_window=None,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=TINY_INITIALIZER_RANGE,
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("deepseek-v2-lite", "DeepSeek-V2-Lite", _deepseek_v2_lite, 16.0, 24.0),
        Preset("qwen1.5-moe", "Qwen1.5-MoE-A2.7B", _qwen15_moe, 14.0, 20.0),
        Preset("phi-3.5-moe", "Phi-3.5-MoE", _phi35_moe, 32.0, 40.0),
        Preset("tiny-deepseek-v2", "tiny DeepSeek-V2 (tests)", _tiny_deepseek_v2),
        Preset("tiny-qwen2-moe", "tiny Qwen2-MoE (tests)", _tiny_qwen2_moe),
        Preset("tiny-phimoe", "tiny PhiMoE (tests)", _tiny_phimoe),
    )
}
FULL_SIZE_PRESETS = ("deepseek-v2-lite", "qwen1.5-moe", "phi-3.5-moe")
TINY_PRESETS = ("tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe")


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (case-insensitive).

    Raises:
        KeyError: no such preset; the message lists the known names.
    """
    preset = PRESETS.get(name.lower()) if isinstance(name, str) else None
    if preset is None:
        if looks_like_path(name):
            raise KeyError(missing_checkpoint_message(name))
        raise KeyError(
            f"no preset named {name!r}; known presets: {sorted(PRESETS)} (and {DEMO_MODEL!r}, "
            "the trained demo checkpoint), or pass a checkpoint folder"
        )
    return preset


def missing_checkpoint_message(path: str) -> str:
    """The error for a model argument that reads as a path where nothing exists."""
    return (
        f"no checkpoint folder at {path!r} (nothing exists there) and no preset of that name; "
        f"check the path, or give a preset: {sorted(PRESETS)} or {DEMO_MODEL!r}"
    )


def looks_like_path(name: object) -> bool:
    """Whether ``name`` reads as a file system path rather than a preset name (it holds a
    path separator or starts with ``.`` or ``~``)."""
    if not isinstance(name, str):
        return False
    return "/" in name or os.sep in name or name.startswith((".", "~"))


def preset_config(name: str) -> PretrainedConfig:
    """A fresh transformers config of preset ``name``.

    Raises:
        KeyError: no such preset.
    """
    return get_preset(name).make_config()


def demo_model_path() -> Path:
    """Folder of the trained demo checkpoint ``specter-code-tiny`` (package data).

    Raises:
        FileNotFoundError: the folder or its ``config.json`` is missing from this install.
    """
    folder = Path(str(resources.files("specter_models") / "data" / DEMO_MODEL))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"the demo checkpoint {DEMO_MODEL!r} is not in this installation (looked for "
            f"{folder}/config.json). It is produced by `specter train` (see "
            "docs/training.md) and shipped in specter_models/data/; train it or pass another "
            "checkpoint folder or a preset name."
        )
    return folder

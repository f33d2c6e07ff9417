"""Architecture presets: the tiny demo model and topology proxies of the benchmark models.

`dsv2-tiny` is the built-in demo checkpoint: DeepSeek-V2 architecture (MLA attention, one
dense first layer, routed experts with top-k and a routed scaling factor, a shared expert)
small enough that its fp16 safetensors stay near 13 MB. The proxies copy the real models'
numbers of layers, routed experts, top-k and shared experts with
hidden size 256, so routing and acceptance can be measured on trained weights. Hidden and
expert intermediate sizes are multiples of 128 so INT4 group-128 quantisation applies to
both expert projections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import DeepseekV2Config, PhimoeConfig, PretrainedConfig, Qwen2MoeConfig


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the configs need.

    Attributes:
        bos_token_id: <|endoftext|>.
        eos_token_id: <|endoftext|>.
        pad_token_id: None in the model config on purpose: transformers gives the padding
            id a zero, never-trained embedding row (`nn.Embedding(padding_idx=...)`), but
            <|endoftext|> is a real input here (before every file). A zero residual stream
            at those positions also makes each RMSNorm scale its gradient by 1/sqrt(eps),
            which overflows in deep models. Padding for `generate` is set in the
            generation config instead.
    """

    bos_token_id: int
    eos_token_id: int
    pad_token_id: int | None = None


@dataclass(frozen=True)
class TrainingDefaults:
    """Per-preset training settings, each overridable on the command line.

    Attributes:
        learning_rate: Peak AdamW learning rate after warm-up.
        batch_size: Sequences per optimizer step.
        seq_len: Tokens per sequence.
        epochs: Passes over the training tokens that set the step count when --steps is
            not given (the wall-clock budget may shorten it).
        warmup_steps: Linear warm-up steps before the cosine decay.
        balance_coef: Weight of the expert-level load-balance term (0 disables it).
    """

    learning_rate: float
    batch_size: int
    seq_len: int
    epochs: float
    warmup_steps: int
    balance_coef: float


@dataclass(frozen=True)
class ArchPreset:
    """One trainable architecture.

    Attributes:
        name: The --arch value.
        description: One line for the model card.
        build_config: Makes the transformers config from the vocabulary size, the special
            token ids and the position limit.
        defaults: Training settings.
        size_limit_bytes: Largest allowed output folder (checked after saving), or None.
    """

    name: str
    description: str
    build_config: Callable[[int, SpecialTokens, int], PretrainedConfig]
    defaults: TrainingDefaults
    size_limit_bytes: int | None


def _dsv2_tiny(vocab_size: int, ids: SpecialTokens, max_positions: int) -> PretrainedConfig:
    return DeepseekV2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=384,  # the dense first layer
        moe_intermediate_size=128,
        num_hidden_layers=4,
        first_k_dense_replace=1,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        # Not 1.0 on purpose: a checkpoint with a non-trivial scale catches engines that drop it.
        routed_scaling_factor=2.0,
        topk_method="greedy",
        n_group=None,
        topk_group=None,
        norm_topk_prob=False,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        # Tied input/output embeddings keep the fp16 file near 13 MB.
        tie_word_embeddings=True,
        **vars(ids),
    )


def _dsv2_proxy(vocab_size: int, ids: SpecialTokens, max_positions: int) -> PretrainedConfig:
    # DeepSeek-V2-Lite's topology: 27 layers, dense first layer, 64 experts top-6, 2 shared.
    return DeepseekV2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=1280,
        moe_intermediate_size=128,
        num_hidden_layers=27,
        first_k_dense_replace=1,
        n_routed_experts=64,
        num_experts_per_tok=6,
        n_shared_experts=2,
        routed_scaling_factor=1.0,
        topk_method="greedy",
        n_group=None,
        topk_group=None,
        norm_topk_prob=False,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=None,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **vars(ids),
    )


def _qwen_proxy(vocab_size: int, ids: SpecialTokens, max_positions: int) -> PretrainedConfig:
    # Qwen1.5-MoE-A2.7B's topology: 24 layers, 60 experts top-4, one sigmoid-gated shared
    # expert four times an expert's width, unnormalised top-k weights.
    return Qwen2MoeConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=512,
        num_hidden_layers=24,
        num_experts=60,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_attention_heads=8,
        num_key_value_heads=8,
        qkv_bias=True,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=False,
        output_router_logits=False,
        **vars(ids),
    )


def _phi_proxy(vocab_size: int, ids: SpecialTokens, max_positions: int) -> PretrainedConfig:
    # Phi-3.5-MoE's topology: 32 layers, 16 experts top-2 (sparsemixer), no shared expert,
    # grouped-query attention 4:1 with biases, expert width 1.5x hidden.
    return PhimoeConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=32,
        num_local_experts=16,
        num_experts_per_tok=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attention_bias=True,
        lm_head_bias=True,
        router_jitter_noise=0.01,
        input_jitter_noise=0.01,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        output_router_logits=False,
        **vars(ids),
    )


_PROXY_DEFAULTS = TrainingDefaults(
    learning_rate=1e-3, batch_size=64, seq_len=512, epochs=10, warmup_steps=100, balance_coef=0.01
)

PRESETS: dict[str, ArchPreset] = {
    preset.name: preset
    for preset in (
        ArchPreset(
            name="dsv2-tiny",
            description=(
                "Tiny DeepSeek-V2-architecture demo MoE: 4 layers (1 dense), 16 routed experts "
                "top-4, 1 shared expert, MLA attention, hidden 256"
            ),
            build_config=_dsv2_tiny,
            defaults=TrainingDefaults(
                learning_rate=2e-3,
                batch_size=64,
                seq_len=512,
                epochs=30,
                warmup_steps=100,
                balance_coef=0.01,
            ),
            size_limit_bytes=15_000_000,
        ),
        ArchPreset(
            name="dsv2-proxy",
            description=(
                "DeepSeek-V2-Lite topology proxy: 27 layers (1 dense), 64 routed experts top-6, "
                "2 shared experts, MLA attention, hidden 256"
            ),
            build_config=_dsv2_proxy,
            defaults=_PROXY_DEFAULTS,
            size_limit_bytes=None,
        ),
        ArchPreset(
            name="qwen-proxy",
            description=(
                "Qwen1.5-MoE-A2.7B topology proxy: 24 layers, 60 routed experts top-4, 1 shared "
                "expert with sigmoid gate, norm_topk_prob false, hidden 256"
            ),
            build_config=_qwen_proxy,
            defaults=_PROXY_DEFAULTS,
            size_limit_bytes=None,
        ),
        ArchPreset(
            name="phi-proxy",
            description=(
                "Phi-3.5-MoE topology proxy: 32 layers, 16 routed experts top-2 (sparsemixer), "
                "no shared expert, hidden 256"
            ),
            build_config=_phi_proxy,
            defaults=_PROXY_DEFAULTS,
            size_limit_bytes=None,
        ),
    )
}


def get_preset(name: str) -> ArchPreset:
    """Looks up an architecture preset.

    Raises:
        ValueError: If name is not a preset.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown --arch {name!r}; expected one of {sorted(PRESETS)}.")
    return PRESETS[name]

"""The linear shapes a model's decode step runs through the batch-invariant kernels.

Read from its transformers config (``deepseek_v2``, ``qwen2_moe``, ``phimoe``): every dense
projection as ``x [M, K] @ weight[N, K]^T``, the fused ones as the runtime fuses them
(DeepSeek-V2's query and compressed-KV projections, an MLP's gate and up), and the routers in
fp32 as their modeling code runs them. Routed experts are not here: they run the grouped and
W4A16 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LinearShape", "linear_shapes"]


@dataclass(frozen=True)
class LinearShape:
    """One linear: ``[M, K] x [K, N]`` in ``dtype``.

    Attributes:
        name: what it is, e.g. ``"q_proj"`` or ``"router (fp32)"``.
        N: output features.
        K: input features.
        dtype: its input and weight dtype.
    """

    name: str
    N: int
    K: int
    dtype: torch.dtype


def _mlp(prefix: str, hidden: int, inter: int, dtype: torch.dtype) -> list[LinearShape]:
    """An MLP's gate and up projections apart and fused, and its down projection."""
    return [
        LinearShape(f"{prefix} gate_up (fused)", 2 * inter, hidden, dtype),
        LinearShape(f"{prefix} gate/up", inter, hidden, dtype),
        LinearShape(f"{prefix} down", hidden, inter, dtype),
    ]


def _attention(config: Any, hidden: int, dtype: torch.dtype) -> list[LinearShape]:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = config.num_key_value_heads * head_dim
    return [
        LinearShape("q_proj", heads * head_dim, hidden, dtype),
        LinearShape("k_proj/v_proj", kv, hidden, dtype),
        LinearShape("o_proj", hidden, heads * head_dim, dtype),
    ]


def _mla_attention(config: Any, hidden: int, dtype: torch.dtype) -> list[LinearShape]:
    heads = config.num_attention_heads
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    kv_a = config.kv_lora_rank + config.qk_rope_head_dim
    kv_b = heads * (config.qk_nope_head_dim + config.v_head_dim)
    shapes = [
        LinearShape("kv_a_proj_with_mqa", kv_a, hidden, dtype),
        LinearShape("kv_b_proj", kv_b, config.kv_lora_rank, dtype),
        LinearShape("o_proj", hidden, heads * config.v_head_dim, dtype),
    ]
    if config.q_lora_rank is None:
        shapes.insert(0, LinearShape("q_proj", heads * qk, hidden, dtype))
        shapes.insert(
            0, LinearShape("q_proj + kv_a_proj (fused)", heads * qk + kv_a, hidden, dtype)
        )
    else:
        shapes.insert(0, LinearShape("q_a_proj", config.q_lora_rank, hidden, dtype))
        shapes.insert(1, LinearShape("q_b_proj", heads * qk, config.q_lora_rank, dtype))
    return shapes


def linear_shapes(config: Any, dtype: torch.dtype = torch.float16) -> list[LinearShape]:
    """The distinct linear shapes of a model, in the order a decode step meets them.

    Args:
        config: a transformers config of type ``deepseek_v2``, ``qwen2_moe`` or ``phimoe``.
        dtype: the model's weight dtype (routers and fp32 gates are fp32 whatever it is).

    Raises:
        ValueError: another model type.
    """
    kind = getattr(config, "model_type", None)
    hidden = config.hidden_size
    fp32 = torch.float32
    if kind == "deepseek_v2":
        shapes = _mla_attention(config, hidden, dtype)
        if config.n_shared_experts:
            inter = config.n_shared_experts * config.moe_intermediate_size
            shapes += _mlp("shared", hidden, inter, dtype)
        shapes.append(LinearShape("router (fp32)", config.n_routed_experts, hidden, fp32))
        if config.first_k_dense_replace:
            shapes += _mlp("dense", hidden, config.intermediate_size, dtype)
    elif kind == "qwen2_moe":
        shapes = _attention(config, hidden, dtype)
        shapes += _mlp("shared", hidden, config.shared_expert_intermediate_size, dtype)
        shapes.append(LinearShape("router (fp32)", config.num_experts, hidden, fp32))
        shapes.append(LinearShape("shared gate (fp32)", 1, hidden, fp32))
    elif kind == "phimoe":
        shapes = _attention(config, hidden, dtype)
        shapes.append(LinearShape("router (fp32)", config.num_local_experts, hidden, fp32))
    else:
        raise ValueError(
            f"cannot list the linears of model type {kind!r}; supported model types are "
            "deepseek_v2, qwen2_moe and phimoe"
        )
    shapes.append(LinearShape("lm_head", config.vocab_size, hidden, dtype))
    distinct: dict[tuple[int, int, torch.dtype], LinearShape] = {}
    for shape in shapes:
        distinct.setdefault((shape.N, shape.K, shape.dtype), shape)
    return list(distinct.values())

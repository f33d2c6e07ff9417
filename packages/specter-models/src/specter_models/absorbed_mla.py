"""DeepSeek-V2's attention in the absorbed MLA form over the compressed KV cache.

transformers' ``DeepseekV2Attention`` caches the normed ``kv_lora_rank`` latent and the
rotary key (one head each) and, at every forward, expands the whole cache through
``kv_b_proj`` into per-head keys and values, concatenates the keys and runs SDPA: a GEMM
over every cached row, copies of ``[H, L, 192]`` keys and an attention over them, per
layer and step. :func:`install_absorbed_mla` replaces that forward with the inference form
of the MLA paper: ``kv_b_proj``'s weight, viewed as ``W_UK [H, nope, R]`` and
``W_UV [H, v, R]``, is applied to the queries and to the attention output instead of to
the cache::

    q_lat = q_nope @ W_UK                       [H, T, R]   (torch.bmm)
    o_lat = mla_attention(q_lat, q_pe, c, k_pe)  [H, T, R]   (specter-kernels)
    out   = o_lat @ W_UV^T                      [H, T, v]   (torch.bmm), then o_proj

On CUDA the last line runs inside ``mla_attention``'s merge kernel (its ``w_uv``), which
writes ``out`` as ``[T, H, v]``, the layout ``o_proj`` reads: one launch instead of the merge,
the ``bmm`` and its round trip.

The projections, the kv norm, the rotary embedding and the cache writes are transformers'
own calls in transformers' order, so the cache holds the same bits as before; only the
attention output is rounded differently (mathematically it is the same function). Under
batch invariance the ``bmm`` run on the invariant GEMM (the attention module is scoped by
``install_batch_invariance``) and ``mla_attention``, its value projection included, is
invariant by construction.

With Specter's fused RMSNorm and rotary kernels installed, on CUDA, over a
:class:`~specter_models.kv_cache.StaticKVCache`, the latent norm, both rotations and the two
cache writes run as one launch (specter-kernels ``mla_prologue``), which writes the bits
those kernels and copies write. That launch computes ``q_lat`` too in decode and verification
steps (``mla_prologue_absorb``), beside the prologue rather than after it: on an H200
DeepSeek-V2-Lite's all-resident plain step took 2.077 ms with it against 2.088 ms with the
``bmm`` after the prologue.

The replacement takes batch size one with ``sdpa`` or ``eager`` attention (what Specter
runs); anything else falls back to transformers' forward.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specter_kernels import (
    FLOAT_DTYPES,
    MAX_LATENT,
    mla_attention,
    mla_prologue,
    mla_prologue_absorb,
)
from specter_models.fused_rotary import rotary_applies
from specter_models.kv_cache import StaticKVCache, StaticKVLayer
from specter_models.module_patches import patch_forwards

SUPPORTED_IMPLEMENTATIONS = ("sdpa", "eager")

ABSORB_MAX_ROWS = 32
"""The widest forward whose queries the prologue's launch also absorbs (``q_lat = q_nope @
W_UK``, specter-kernels ``mla_prologue_absorb``): every decode and verification
step (the step graphs' widest row bucket). A prefill keeps the ``bmm``: its rows are no
decode step's, so they need not share its arithmetic."""


def fused_value_projection(q_lat: torch.Tensor) -> bool:
    """Whether the absorbed forward hands ``W_UV`` to ``mla_attention`` (its merge kernel
    applies it) instead of running a ``bmm`` after it: CUDA half-precision queries."""
    return q_lat.is_cuda and q_lat.dtype in (torch.float16, torch.bfloat16)


FUSED_Q_KV_A = "_specter_q_kv_a"
"""The attribute where ``fused_projections`` keeps a module's one GEMM for ``q_proj`` and
``kv_a_proj_with_mqa`` (``x -> [q | c_kv]``); the absorbed forward runs it when present."""


def is_mla_attention(module: nn.Module) -> bool:
    """A transformers DeepSeek-V2 attention module (MLA with a ``kv_b_proj``)."""
    return type(module).__name__ == "DeepseekV2Attention" and hasattr(module, "kv_b_proj")


def install_absorbed_mla(model: nn.Module) -> int:
    """Run every DeepSeek-V2 attention module of ``model`` in the absorbed form (once).

    Install it before ``install_fused_rotary`` (which swaps the rotary function around the
    module's forward, this one included) and before the batch-invariance scopes.

    Returns:
        How many modules were replaced by this call.
    """
    return patch_forwards(model, is_mla_attention, "_specter_absorbed", _absorbed_forward)


def _absorbed_forward(module: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
    namespace = sys.modules[type(module).__module__]

    def forward(
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        position_embeddings: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        implementation = module.config._attn_implementation
        if hidden_states.shape[0] != 1 or implementation not in SUPPORTED_IMPLEMENTATIONS:
            return plain(
                hidden_states,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        T = hidden_states.shape[1]
        H, nope, rope = module.num_heads, module.qk_nope_head_dim, module.qk_rope_head_dim
        R, v = module.kv_lora_rank, module.v_head_dim
        fused = getattr(module, FUSED_Q_KV_A, None)  # fused_projections' one GEMM
        if fused is not None:
            q, compressed = torch.split(fused(hidden_states), [H * (nope + rope), R + rope], -1)
        else:
            if module.q_lora_rank is None:
                q = module.q_proj(hidden_states)
            else:
                q = module.q_b_proj(module.q_a_layernorm(module.q_a_proj(hidden_states)))
            compressed = module.kv_a_proj_with_mqa(hidden_states)
        q = q.view(1, T, H, nope + rope).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [nope, rope], dim=-1)
        kv_nope, k_pe = torch.split(compressed, [R, rope], dim=-1)
        freqs = position_embeddings.to(q_pe.device)
        w_kv_b = module.kv_b_proj.weight.view(H, nope + v, R)
        q_lat = None
        layer = _prologue_layer(module, past_key_values, q_pe, k_pe, freqs)
        if layer is not None:
            key_pe = k_pe[0]  # [T, rope], rotated and cached by the one launch
            rows, latent, k_pe = layer.reserve(T)
            norm = module.kv_a_layernorm
            args = (
                q_pe[0].transpose(0, 1), kv_nope[0], key_pe, norm.weight, norm.variance_epsilon,
                freqs, layer.keys[0, 0], layer.values[0, 0], rows,
            )  # fmt: skip
            if T <= ABSORB_MAX_ROWS:
                q_pe, q_lat = mla_prologue_absorb(
                    *args, q_nope[0].transpose(0, 1), w_kv_b[:, :nope]
                )
            else:
                q_pe = mla_prologue(*args)
            q_pe = q_pe[None]
        else:
            latent = module.kv_a_layernorm(kv_nope).view(1, 1, T, R)
            k_pe = k_pe.view(1, 1, T, rope)
            # Looked up per call: install_fused_rotary swaps the module's function around us.
            q_pe, k_pe = namespace.apply_rotary_emb(q_pe, k_pe, freqs)
            if past_key_values is not None:
                latent, k_pe = past_key_values.update(latent, k_pe, module.layer_idx)
        L = latent.shape[2]
        if q_lat is None:
            q_lat = torch.bmm(q_nope[0], w_kv_b[:, :nope])  # [H, T, nope] @ [H, nope, R]
        mask = _mask(attention_mask, T, L)
        if fused_value_projection(q_lat):  # [T, H, v] from the kernel that merges the chunks
            out = mla_attention(
                q_lat, q_pe[0], latent[0, 0], k_pe[0, 0], module.scaling, mask, w_kv_b[:, nope:]
            )
        else:
            o_lat = mla_attention(q_lat, q_pe[0], latent[0, 0], k_pe[0, 0], module.scaling, mask)
            out = torch.bmm(o_lat, w_kv_b[:, nope:].transpose(1, 2))  # [H, T, R] @ [H, R, v]
            out = out.transpose(0, 1)
        return module.o_proj(out.reshape(1, T, H * v)), None

    return forward


def _prologue_layer(
    module: nn.Module,
    past_key_values: Any,
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    freqs: torch.Tensor,
) -> StaticKVLayer | None:
    """The cache layer the one-launch prologue writes, or None where the parts run apart:
    Specter's fused norm or rotary is not installed on this module (the
    prologue gives their bits, not transformers'), the inputs are not CUDA floats the fused
    kernels take, or the cache is not a :class:`StaticKVCache`."""
    norm = module.kv_a_layernorm
    if not (
        isinstance(past_key_values, StaticKVCache)
        and getattr(norm, "_specter_fused", False)
        and getattr(module, "_specter_fused_rotary", False)
        and norm.weight.dtype in FLOAT_DTYPES
        and norm.weight.numel() <= MAX_LATENT
    ):
        return None
    k_pe = k_pe.view(1, 1, k_pe.shape[1], k_pe.shape[2])
    if not rotary_applies(q_pe, k_pe, freqs) or freqs.shape[0] != 1:
        return None
    layer = past_key_values.layers[module.layer_idx]
    if layer.keys.dtype != q_pe.dtype or layer.keys.device != q_pe.device:
        return None
    return layer


def _mask(attention_mask: torch.Tensor | None, T: int, L: int) -> torch.Tensor | None:
    """transformers' ``[1, 1, T, >= L]`` (or ``[1, T, L]``/``[T, L]``) mask as ``[T, L]``."""
    if attention_mask is None:
        return None  # bottom-right causal: a one-row decode sees every key, a prefill is causal
    mask = attention_mask
    while mask.dim() > 2:
        if mask.shape[0] != 1:
            raise ValueError(
                f"absorbed MLA attention takes one sequence and one mask for all heads; got "
                f"an attention mask of shape {tuple(attention_mask.shape)}"
            )
        mask = mask[0]
    return mask[-T:, :L]

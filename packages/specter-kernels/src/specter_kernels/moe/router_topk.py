"""An MoE router in one kernel launch: logits, softmax, top-k, renormalisation, scaling.

transformers' softmax-then-top-k routers (DeepSeek-V2's ``greedy`` ``DeepseekV2TopkRouter``,
Qwen2-MoE's ``Qwen2MoeTopKRouter``) run as five to seven kernels per layer: casts of the
hidden state and of the weight to fp32, the product (a GEMV that cuBLAS splits in two),
the softmax, ``torch.topk`` and the scaling product. At batch size one a decode step pays
each of them per MoE layer. :func:`router_topk` does the whole router in one Triton
launch, the logits over many small programs and the selection in the last of a row's
programs to finish:

    logits = x @ weight^T               (fp32 products and sums; rounded to ``logits_dtype``)
    probs  = softmax(logits) in fp32
    ids    = the ``top_k`` largest probs, largest first, ties to the lower expert id
    w      = probs[ids] (/ their sum if ``renormalize``) * ``scaling``, in ``weights_dtype``

Each logit is reduced over fixed ``BLOCK_H`` lanes in a fixed order, so a row's result does
not depend on how many rows come with it: the kernels are batch-invariant by construction. Its
sums run in another order than cuBLAS's, so its logits differ from transformers' in the
last bits (the reference below is transformers' arithmetic, with a deterministic tie rule).
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend

MAX_EXPERTS = 1024
"""Experts the selection program keeps in registers; wider routers take the reference."""


def router_topk_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    *,
    logits_dtype: torch.dtype = torch.float32,
    renormalize: bool = False,
    scaling: float = 1.0,
    weights_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' softmax-then-top-k router in plain torch.

    Args:
        x: ``[T, H]`` hidden states.
        weight: ``[E, H]`` router weight.
        top_k: experts per token, ``1 <= top_k <= E``.
        logits_dtype: the product's dtype (DeepSeek-V2: fp32 inputs and product; Qwen2-MoE:
            the model's dtype).
        renormalize: divide the chosen weights by their sum (Qwen's ``norm_topk_prob``).
        scaling: multiply the chosen weights (DeepSeek's ``routed_scaling_factor``).
        weights_dtype: dtype of the returned weights.

    Returns:
        ``(logits [T, E] logits_dtype, weights [T, top_k] weights_dtype, ids [T, top_k]
        int64)``, the ids by descending probability, ties to the lower id.
    """
    logits = torch.nn.functional.linear(x.to(logits_dtype), weight.to(logits_dtype))
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    chosen, ids = order.values[..., :top_k], order.indices[..., :top_k]
    if renormalize:
        chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    chosen = chosen * scaling
    return logits, chosen.to(weights_dtype), ids


def router_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    *,
    logits_dtype: torch.dtype = torch.float32,
    renormalize: bool = False,
    scaling: float = 1.0,
    weights_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router of ``router_topk_reference`` in one launch (Triton on CUDA, the reference
    elsewhere); see the module docstring for the arithmetic.

    Args:
        x: ``[T, H]`` fp16, bf16 or fp32 (any row stride).
        weight: ``[E, H]`` fp16, bf16 or fp32, on ``x``'s device.
        top_k: experts per token, ``1 <= top_k <= E``.
        logits_dtype: fp32, fp16 or bf16 (the product is summed in fp32, then rounded).
        renormalize: divide the chosen weights by their sum.
        scaling: multiply the chosen weights.
        weights_dtype: fp32, fp16 or bf16.

    Returns:
        ``(logits [T, E], weights [T, top_k], ids [T, top_k] int64)``, ids largest
        probability first, ties to the lower id.

    Raises:
        TypeError: an unsupported dtype or a non-tensor.
        ValueError: shapes that do not fit, tensors on two devices, or ``top_k`` outside
            ``[1, E]``.
    """
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; router_topk takes {FLOAT_DTYPES}")
    for name, dtype in (("logits_dtype", logits_dtype), ("weights_dtype", weights_dtype)):
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be one of {FLOAT_DTYPES}, got {dtype}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"router_topk needs x [T, H] and weight [E, H], got x {tuple(x.shape)} and weight "
            f"{tuple(weight.shape)}"
        )
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} and weight on {weight.device}; use one device")
    E = weight.shape[0]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in [1, {E}] (the expert count), got {top_k!r}")
    if x.shape[0] == 0 or E > MAX_EXPERTS or select_backend(x.device) == "torch":
        return router_topk_reference(
            x,
            weight,
            top_k,
            logits_dtype=logits_dtype,
            renormalize=renormalize,
            scaling=scaling,
            weights_dtype=weights_dtype,
        )
    from specter_kernels.moe.router_topk_triton import launch_router_topk

    if x.stride(1) != 1:
        x = x.contiguous()
    return launch_router_topk(
        x,
        weight.contiguous(),
        top_k,
        logits_dtype=logits_dtype,
        renormalize=renormalize,
        scaling=float(scaling),
        weights_dtype=weights_dtype,
    )

"""Shared builders of random test problems (imported by the test modules)."""

from __future__ import annotations

import torch

import specter_kernels as sk


def random_routing(
    T: int, k: int, E: int, *, dtype=torch.int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids (distinct per token) and softmax-normalised weights, ``[T, k]`` each."""
    logits = torch.randn(T, E)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    return ids.to(dtype), weights


def random_int4(
    E: int, N: int, K: int, group_size: int, *, asymmetric: bool = False
) -> sk.Int4Weight:
    """Random stacked INT4 weights; asymmetric ones get random zero points 0..16."""
    weight = sk.quantize_int4(torch.randn(E, N, K) * 0.05, group_size)
    if asymmetric:
        zeros = torch.randint(0, 17, (E, K // group_size, N), dtype=torch.uint8)
        weight = sk.Int4Weight(weight.qweight, weight.scales, zeros, group_size)
    return weight


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; inf when out holds a NaN or inf (an unwritten element)."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))

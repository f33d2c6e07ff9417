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


STREAMED_TOLERANCE = 2e-3
"""Relative error the streamed-expert tests allow against the float64 reference."""


def streamed_problem(T, H, I, E, k, resident_count, *, stream_one=False):
    """Inputs, every expert's weights, and slots holding the first ``resident_count`` experts
    of a random order (the other slots NaN: reading one shows up in the result). With
    ``stream_one`` the first routed expert comes last in the order, so (``resident_count <
    E``) at least one routed expert is streamed whatever the draw."""
    x = torch.randn(T, H).half()
    ids, weights = random_routing(T, k, E)
    w13 = (torch.randn(E, 2 * I, H) * 0.05).half()
    w2 = (torch.randn(E, H, I) * 0.05).half()
    order = torch.randperm(E)
    if stream_one:
        first = ids[0, 0]
        order = torch.cat([order[order != first], first.reshape(1)])
    S = max(resident_count, 1) + 1
    w13_slots = torch.full((S, 2 * I, H), float("nan")).half()
    w2_slots = torch.full((S, H, I), float("nan")).half()
    slot_of = torch.full((E,), -1, dtype=torch.int32)
    for s, e in enumerate(order[:resident_count].tolist()):
        w13_slots[s + 1], w2_slots[s + 1] = w13[e], w2[e]
        slot_of[e] = s + 1
    streamed = sk.StreamedExperts.from_tensors(
        [w.clone() for w in w13], [w.clone() for w in w2], "cpu"
    )
    return x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed


def all_in_slots(x, ids, weights, w13, w2, out):
    """``grouped_moe_fp16`` with every expert resident in slot ``e`` (the streamed tests'
    baseline)."""
    E = w13.shape[0]
    every = torch.ones(E, dtype=torch.bool)
    slot_of = torch.arange(E, dtype=torch.int32)
    return sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, every, out)

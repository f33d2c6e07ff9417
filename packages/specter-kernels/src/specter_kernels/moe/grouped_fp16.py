"""The target's routed experts in FP16, straight out of expert-cache slots, in waves.

Verification computes a layer's routed experts in waves: first the experts
already resident in the slot cache, then, as transfers land, the rest. Each call
adds the contributions of the experts in ``expert_mask`` into one fp32
accumulator::

    out[t] += sum over e in topk_ids[t] with expert_mask[e]:
              w * down_e( silu(gate_e x[t]) * up_e x[t] )

where expert e's weights are ``w13_slots[expert_to_slot[e]]`` ``[2I, H]`` and
``w2_slots[expert_to_slot[e]]`` ``[H, I]``. The union of disjoint masks covering
every routed expert gives the all-at-once result (within fp32 summation order
and fp16 rounding of the intermediate); nothing is recomputed between waves.

Batch-invariant mode: pass ``out`` as fp32 ``[T, k, H]`` instead. Each wave
then *stores* ``w * down_e(...)`` of its pairs into ``out[t, j]`` (pair
``t*k+j``), with one tile config whatever T and no atomics; pairs outside the
wave are left as they were (start from zeros). :func:`sum_routed_pairs` then
adds the k pairs of each token in a fixed order, so the result is deterministic
and the same for a token whatever the number of tokens beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specter_kernels.backend import FLOAT_DTYPES, select_backend
from specter_kernels.invariant.matmul import invariant_bmm_reference
from specter_kernels.moe.routed_inputs import check_routed_inputs
from specter_kernels.norms.residual_norm import residual_add_reference
from specter_kernels.streaming.experts import StreamedExperts
from specter_kernels.streaming.fills import check_fill_vector


def _check_inputs(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
) -> None:
    T, H = check_routed_inputs(x, topk_ids, topk_weights)
    for name, slots in (("w13_slots", w13_slots), ("w2_slots", w2_slots)):
        if slots.dim() != 3 or slots.dtype != torch.float16:
            raise TypeError(
                f"{name} must be float16 [S, N, K], got {slots.dtype} {tuple(slots.shape)}"
            )
        if not slots.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    S, two_i, h_in = w13_slots.shape
    if h_in != H or two_i % 2:
        raise ValueError(f"w13_slots must be [S, 2I, H={H}], got {tuple(w13_slots.shape)}")
    I = two_i // 2
    if tuple(w2_slots.shape) != (S, H, I):
        raise ValueError(f"w2_slots must be [S={S}, H={H}, I={I}], got {tuple(w2_slots.shape)}")
    if expert_mask.dim() != 1 or expert_mask.dtype != torch.bool:
        raise TypeError(
            f"expert_mask must be bool [E], got {expert_mask.dtype} {tuple(expert_mask.shape)}"
        )
    E = expert_mask.shape[0]
    if tuple(expert_to_slot.shape) != (E,) or expert_to_slot.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise TypeError(
            f"expert_to_slot must be int32 [E={E}], got {expert_to_slot.dtype} "
            f"{tuple(expert_to_slot.shape)}"
        )
    k = topk_ids.shape[1]
    shape_ok = tuple(out.shape) in ((T, H), (T, k, H))
    if out.dtype != torch.float32 or not shape_ok or not out.is_contiguous():
        raise TypeError(
            f"out must be a contiguous float32 [T={T}, H={H}] accumulator or [T={T}, k={k}, "
            f"H={H}] per-pair output, got {out.dtype} {tuple(out.shape)}"
        )
    tensors = {
        "topk_ids": topk_ids,
        "topk_weights": topk_weights,
        "w13_slots": w13_slots,
        "w2_slots": w2_slots,
        "expert_to_slot": expert_to_slot,
        "expert_mask": expert_mask,
        "out": out,
    }
    for name, tensor in tensors.items():
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device} but x is on {x.device}")


def _check_streamed(
    streamed: StreamedExperts | None,
    streamed_flags: torch.Tensor | None,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    x: torch.Tensor,
    num_experts: int,
) -> None:
    if streamed is None:
        if streamed_flags is not None:
            raise ValueError("streamed_flags is given without streamed experts")
        return
    if not isinstance(streamed, StreamedExperts):
        raise TypeError(f"streamed must be a StreamedExperts, got {type(streamed).__name__}")
    if streamed.num_experts != num_experts:
        raise ValueError(
            f"streamed holds {streamed.num_experts} experts, the routing has {num_experts}"
        )
    shapes = (tuple(streamed.w13[0].shape), tuple(streamed.w2[0].shape))
    if shapes != (tuple(w13_slots.shape[1:]), tuple(w2_slots.shape[1:])):
        raise ValueError(
            f"streamed experts are gate_up {list(shapes[0])} and down {list(shapes[1])}, the "
            f"slots gate_up {list(w13_slots.shape[1:])} and down {list(w2_slots.shape[1:])}"
        )
    if streamed.w13_addresses.device != x.device:
        raise ValueError(
            f"streamed addresses are on {streamed.w13_addresses.device}, x on {x.device}: "
            "build the StreamedExperts for the kernel's device"
        )
    if streamed_flags is not None and (
        streamed_flags.dtype != torch.uint8
        or tuple(streamed_flags.shape) != (2, num_experts)
        or not streamed_flags.is_contiguous()
        or streamed_flags.device != x.device
    ):
        raise TypeError(
            f"streamed_flags must be a contiguous uint8 [2, E={num_experts}] tensor on "
            f"{x.device}, got {streamed_flags.dtype} {list(streamed_flags.shape)} on "
            f"{streamed_flags.device}"
        )


def _check_fills(
    fill_slots: torch.Tensor | None,
    streamed: StreamedExperts | None,
    x: torch.Tensor,
    num_experts: int,
) -> None:
    if fill_slots is None:
        return
    if streamed is None:
        raise ValueError(
            "fill_slots is given without streamed experts: only a streamed expert fills a slot"
        )
    check_fill_vector(fill_slots, "fill_slots", num_experts, x.device)


def grouped_moe_fp16(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
    pair_blocks: bool | None = None,
    streamed: StreamedExperts | None = None,
    streamed_flags: torch.Tensor | None = None,
    fill_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Add the masked experts' routing-weighted FP16 expert outputs into ``out``.

    No host synchronisation (on CUDA three launches: alignment, gate_up, down; two for
    one row, whose pairs need no alignment).

    Args:
        x: fp16 ``[T, H]``.
        topk_ids: int ``[T, k]`` experts in ``[0, E)``.
        topk_weights: float ``[T, k]`` routing weights.
        w13_slots: fp16 ``[S, 2I, H]`` gate_up weights per cache slot (gate rows first).
        w2_slots: fp16 ``[S, H, I]`` down weights per slot.
        expert_to_slot: int32 ``[E]`` on the device: the slot holding each expert.
            Read only for experts in ``expert_mask``, so others may hold anything (-1).
        expert_mask: bool ``[E]`` on the device: the experts to compute in this call.
        out: fp32 ``[T, H]`` accumulator, updated in place; or fp32 ``[T, k, H]``
            per-pair output (batch-invariant mode): the wave's pairs are
            overwritten, the others kept. Reduce it with :func:`sum_routed_pairs`.
        pair_blocks: run one block per routed pair with no alignment launch (each
            expert's weights are then read once per pair of the wave instead of once):
            fewer launches and less host work for a wave of few rows, more weight reads
            when rows share experts. None: only for one row, where nothing is shared.
            Either way a pair's result has the same bits.
        streamed: the streamed miss path (``StreamedExperts``): a masked expert whose
            ``expert_to_slot`` entry is -1 reads its weights in place from these addresses
            (pinned host memory, over PCIe) instead of a slot. Same bits as from a slot.
        streamed_flags: uint8 ``[2, E]``, with ``streamed``: set to 1 where an expert's
            gate_up (row 0) or down (row 1) weights were read from ``streamed`` (entries
            of the others are left as they were: zero it first).
        fill_slots: int32 ``[E]``, with ``streamed`` (``streamed_fills``): a streamed
            expert whose entry is a slot ``s >= 0`` is also written whole into slot ``s`` of
            ``w13_slots`` and ``w2_slots`` as it is read, for no extra transfer. The fill
            slots must hold no expert this call reads (``assign_fill_slots`` gives spares).
            With ``pair_blocks``, one row only.

    Returns:
        ``out``.

    Raises:
        TypeError, ValueError: bad dtypes, shapes or devices.
    """
    _check_inputs(x, topk_ids, topk_weights, w13_slots, w2_slots, expert_to_slot, expert_mask, out)
    E = expert_mask.shape[0]
    _check_streamed(streamed, streamed_flags, w13_slots, w2_slots, x, E)
    _check_fills(fill_slots, streamed, x, E)
    if x.shape[0] == 0:
        return out
    if streamed is not None and streamed_flags is None:
        streamed_flags = torch.empty(2, E, dtype=torch.uint8, device=x.device)  # unread
    if select_backend(x.device) == "torch":
        return grouped_moe_fp16_reference(
            x, topk_ids, topk_weights, w13_slots, w2_slots, expert_to_slot, expert_mask, out,
            streamed, streamed_flags, fill_slots,
        )  # fmt: skip
    from specter_kernels.moe import grouped_fp16_triton

    return grouped_fp16_triton.launch_grouped(
        x, topk_ids, topk_weights, w13_slots, w2_slots, expert_to_slot, expert_mask, out,
        pair_blocks=pair_blocks, streamed=streamed, streamed_flags=streamed_flags,
        fill_slots=fill_slots,
    )  # fmt: skip


def grouped_moe_fp16_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
    streamed: StreamedExperts | None = None,
    streamed_flags: torch.Tensor | None = None,
    fill_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch reference of :func:`grouped_moe_fp16` (loops over experts; syncs)."""
    _check_inputs(x, topk_ids, topk_weights, w13_slots, w2_slots, expert_to_slot, expert_mask, out)
    I = w2_slots.shape[2]
    E = expert_mask.shape[0]
    _check_streamed(streamed, streamed_flags, w13_slots, w2_slots, x, E)
    _check_fills(fill_slots, streamed, x, E)
    routed = topk_ids.long()
    in_wave = (routed >= 0) & (routed < E)
    in_wave &= expert_mask[routed.clamp(0, E - 1)]
    for expert in torch.unique(routed[in_wave]).tolist():
        tokens, slots = torch.nonzero((routed == expert) & in_wave, as_tuple=True)
        slot = int(expert_to_slot[expert])
        w13, w2 = _expert_weights(w13_slots, w2_slots, slot, expert, streamed, streamed_flags)
        fill = int(fill_slots[expert]) if fill_slots is not None and slot < 0 else -1
        if fill >= 0:
            w13_slots[fill].copy_(w13)
            w2_slots[fill].copy_(w2)
        weights = topk_weights[tokens, slots].float().unsqueeze(1)
        if out.dim() == 3:
            # Per-pair (batch-invariant) mode: one row at a time, so a pair's
            # result does not depend on how many tokens share its expert.
            gate_up = w13.T[None]
            projected = invariant_bmm_reference(x[tokens][None], gate_up, torch.float32)[0]
            # SiLU row by row too: CPU exp vectorises by position in the tensor.
            h = torch.cat([F.silu(p[:I]) * p[I:] for p in projected.unbind(0)]).view(-1, I)
            h = h.half()
            y = invariant_bmm_reference(h[None], w2.T[None], torch.float32)[0]
            out[tokens, slots] = y * weights
            continue
        projected = x[tokens].float() @ w13.float().T
        h = (F.silu(projected[:, :I]) * projected[:, I:]).half().float()
        out.index_add_(0, tokens, (h @ w2.float().T) * weights)
    return out


def _expert_weights(
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    slot: int,
    expert: int,
    streamed: StreamedExperts | None,
    streamed_flags: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """An expert's (gate_up, down): from its slot, or streamed (and flagged) without one."""
    if slot >= 0 or streamed is None:
        return w13_slots[slot], w2_slots[slot]
    if streamed_flags is not None:
        streamed_flags[:, expert] = 1
    device = w13_slots.device
    return streamed.w13[expert].to(device), streamed.w2[expert].to(device)


def sum_routed_pairs_reference(out: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Plain torch reference of :func:`sum_routed_pairs`: ``out[:, 0]`` cloned, then
    ``+= out[:, j]`` for j = 1..k-1, then one cast to ``dtype``."""
    _check_pairs(out, dtype)
    return _sum_in_pair_order(out, dtype)


def _sum_in_pair_order(out: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if out.shape[1] == 0:
        return out.new_zeros(out.shape[0], out.shape[2], dtype=dtype or torch.float32)
    total = out[:, 0].clone()
    for j in range(1, out.shape[1]):
        total += out[:, j]
    return total if dtype is None else total.to(dtype)


def sum_routed_pairs(out: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum a per-pair output ``[T, k, H]`` over its k pairs, j = 0..k-1 in order.

    Elementwise fp32 adds only, so each token's sum is independent of T. On CUDA one
    Triton launch does the adds and the cast (the torch form is ``k + 1`` launches); the
    bits are :func:`sum_routed_pairs_reference`'s.

    Args:
        out: fp32 ``[T, k, H]``.
        dtype: the result's dtype (fp32, fp16 or bf16; None: fp32), rounded once from the
            fp32 sum.

    Returns:
        ``[T, H]`` contiguous in ``dtype``.

    Raises:
        TypeError: ``out`` is not a float32 ``[T, k, H]`` tensor, or ``dtype`` is not a
            float dtype.
    """
    _check_pairs(out, dtype)
    T, k, H = out.shape
    if T == 0 or k == 0 or H == 0 or select_backend(out.device) == "torch":
        return _sum_in_pair_order(out, dtype)
    from specter_kernels.moe.routed_pair_sum_triton import launch_routed_pair_sum

    if out.stride(2) != 1:
        out = out.contiguous()
    return launch_routed_pair_sum(out, torch.float32 if dtype is None else dtype)


def residual_add_routed_pairs_reference(
    residual: torch.Tensor, pairs: torch.Tensor, shared: torch.Tensor
) -> torch.Tensor:
    """Plain torch reference of :func:`residual_add_routed_pairs`:
    ``residual + (sum_routed_pairs_reference(pairs, dtype) + shared)``."""
    _check_routed_join(residual, pairs, shared)
    return residual_add_reference(residual, _sum_in_pair_order(pairs, residual.dtype), shared)


def residual_add_routed_pairs(
    residual: torch.Tensor, pairs: torch.Tensor, shared: torch.Tensor
) -> torch.Tensor:
    """An MoE block's join, ``residual + (routed + shared)`` with ``routed`` the pair-order
    sum of ``pairs``, in one launch on CUDA (the torch form is :func:`sum_routed_pairs`
    then two adds, or ``sum_routed_pairs`` then ``residual_add``: two launches).

    Its bits are :func:`residual_add_routed_pairs_reference`'s: the pairs summed in fp32 in
    order and rounded once to the dtype, then each add in fp32 rounded to the dtype. Each
    element depends on its own column of its own row only, so it is batch-invariant.

    Args:
        residual: ``[T, H]`` fp16, bf16 or fp32 (the decoder layer's residual stream).
        pairs: fp32 ``[T, k, H]``, one row per routed pair, weighted already (the
            batch-invariant accumulator of the grouped expert kernels).
        shared: ``[T, H]``, ``residual``'s dtype and device (the shared experts' output).

    Returns:
        ``[T, H]`` contiguous in ``residual``'s dtype.

    Raises:
        TypeError: ``pairs`` is not fp32 ``[T, k, H]``, or the dtypes do not match.
        ValueError: the shapes or devices do not match.
    """
    _check_routed_join(residual, pairs, shared)
    T, k, H = pairs.shape
    if T == 0 or k == 0 or H == 0 or select_backend(pairs.device) == "torch":
        return residual_add_reference(residual, _sum_in_pair_order(pairs, residual.dtype), shared)
    from specter_kernels.moe.routed_pair_sum_triton import launch_routed_pair_sum

    if pairs.stride(2) != 1:
        pairs = pairs.contiguous()
    return launch_routed_pair_sum(pairs, residual.dtype, residual.contiguous(), shared.contiguous())


def _check_routed_join(residual: torch.Tensor, pairs: torch.Tensor, shared: torch.Tensor) -> None:
    _check_pairs(pairs, None)
    for name, t in (("residual", residual), ("shared", shared)):
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"residual_add_routed_pairs: {name} must be a float tensor "
                f"({FLOAT_DTYPES}), got {getattr(t, 'dtype', type(t).__name__)}"
            )
    if shared.dtype != residual.dtype:
        raise TypeError(
            f"residual_add_routed_pairs: shared is {shared.dtype} but residual is "
            f"{residual.dtype}; cast them to one dtype"
        )
    want = (pairs.shape[0], pairs.shape[2])
    for name, t in (("residual", residual), ("shared", shared)):
        if tuple(t.shape) != want or t.device != pairs.device:
            raise ValueError(
                f"residual_add_routed_pairs: {name} is {tuple(t.shape)} on {t.device}; "
                f"expected [T, H] = {list(want)} on {pairs.device}, the pairs' "
                f"{tuple(pairs.shape)} [T, k, H]"
            )


def _check_pairs(out: torch.Tensor, dtype: torch.dtype | None) -> None:
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.dtype != torch.float32:
        raise TypeError(
            f"out must be a float32 [T, k, H] per-pair output, got "
            f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
        )
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            f"dtype must be torch.float32, float16 or bfloat16 (or None for float32), got {dtype!r}"
        )

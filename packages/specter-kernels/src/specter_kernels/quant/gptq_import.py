"""Import of GPTQ checkpoint tensors (``qweight``, ``qzeros``, ``scales``, ``g_idx``).

GPTQ stores one linear with in_features K and out_features N as:

* ``qweight`` int32 ``[K / 8, N]``: 4-bit values packed along the input dim,
  value j of a word in bits ``4j .. 4j + 3`` (kept as-is: it is our layout);
* ``qzeros`` int32 ``[K / G, N / 8]``: zero points packed along the output dim;
* ``scales`` fp16 ``[K / G, N]``;
* ``g_idx`` int32 ``[K]``: the group of each input, ``k // G`` unless the
  checkpoint was quantized with act-order (``desc_act``), which we refuse.

Checkpoint format ``gptq`` (v1) stores each zero point minus one; ``gptq_v2``
stores it as is. v1 kernels add the one back after unpacking a nibble, so a
stored 15 means zero point 16; we do the same.
"""

from __future__ import annotations

from typing import Literal

import torch

from specter_kernels.quant.int4_quantization import unpack_int4
from specter_kernels.quant.int4_weight import PACK_FACTOR, SYMMETRIC_ZERO_POINT, Int4Weight

CheckpointFormat = Literal["gptq", "gptq_v2"]


def import_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None = None,
    *,
    bits: int = 4,
    sym: bool = True,
    checkpoint_format: CheckpointFormat = "gptq",
    desc_act: bool = False,
) -> Int4Weight:
    """Turn GPTQ tensors of one linear (or E stacked linears) into an Int4Weight.

    This runs once at load time and may synchronise with the device.

    Args:
        qweight: int32 ``[K / 8, N]`` or stacked ``[E, K / 8, N]``.
        qzeros: int32 ``[K / G, N / 8]`` or ``[E, K / G, N / 8]``.
        scales: float ``[K / G, N]`` or ``[E, K / G, N]`` (converted to fp16).
        g_idx: optional int ``[K]`` or ``[E, K]``; must be the trivial ``k // G``.
        bits: must be 4.
        sym: the checkpoint's ``sym`` flag. When True every zero point must be 8
            (after the v1 correction) and the result is symmetric (``zeros=None``).
        checkpoint_format: ``"gptq"`` (v1, zero - 1 stored) or ``"gptq_v2"``.
        desc_act: the checkpoint's ``desc_act`` flag; True is refused.

    Returns:
        An Int4Weight with a leading expert dim (E = 1 for a single linear). Asymmetric
        zero points become uint8 ``[E, K / G, N]``; if they are all 8 the weight is
        returned as symmetric.

    Raises:
        ValueError: bits != 4, desc_act, an act-order g_idx, an unknown checkpoint
            format, inconsistent shapes, or sym=True with zero points other than 8.
        TypeError: qweight or qzeros not int32.
    """
    if bits != 4:
        raise ValueError(f"only 4-bit GPTQ is supported, got bits={bits}")
    if desc_act:
        raise ValueError(
            "desc_act=True (act-order) GPTQ checkpoints are not supported: their inputs are "
            "permuted per group (g_idx), which the fused kernels do not gather. Re-quantize "
            "with desc_act=False or quantize the FP16 weights with quantize_int4."
        )
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"checkpoint_format must be 'gptq' (v1) or 'gptq_v2', got {checkpoint_format!r}"
        )
    for name, tensor in (("qweight", qweight), ("qzeros", qzeros)):
        if tensor.dtype != torch.int32:
            raise TypeError(f"GPTQ {name} must be int32, got {tensor.dtype}")
    if not scales.is_floating_point():
        raise TypeError(f"GPTQ scales must be floating point, got {scales.dtype}")
    stacked = qweight.dim() == 3
    if (
        qweight.dim() not in (2, 3)
        or qzeros.dim() != qweight.dim()
        or scales.dim() != qweight.dim()
    ):
        raise ValueError(
            "expected qweight [K/8, N], qzeros [K/G, N/8], scales [K/G, N] (or all with a leading "
            f"expert dim); got qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, "
            f"scales {tuple(scales.shape)}"
        )
    if not stacked:
        qweight, qzeros, scales = qweight.unsqueeze(0), qzeros.unsqueeze(0), scales.unsqueeze(0)
    E, k_words, N = qweight.shape
    K = k_words * PACK_FACTOR
    num_groups = scales.shape[1]
    if scales.shape[0] != E or scales.shape[2] != N or num_groups == 0 or K % num_groups:
        raise ValueError(
            f"scales {tuple(scales.shape)} do not fit qweight {tuple(qweight.shape)}: expected "
            f"[{E}, K/G, {N}] with K/G dividing K={K}"
        )
    group_size = K // num_groups
    if group_size % PACK_FACTOR:
        raise ValueError(
            f"group size {group_size} (K={K} / {num_groups} groups) is not a multiple of 8"
        )
    if N % PACK_FACTOR or tuple(qzeros.shape) != (E, num_groups, N // PACK_FACTOR):
        raise ValueError(
            f"qzeros {tuple(qzeros.shape)} does not fit N={N}: expected "
            f"[{E}, {num_groups}, {N // PACK_FACTOR}] (N must be a multiple of 8)"
        )
    if g_idx is not None:
        _check_trivial_g_idx(g_idx, E, K, group_size)

    # qzeros pack along the output dim: transpose so unpack_int4 packs along dim -2.
    zeros = unpack_int4(qzeros.transpose(1, 2).contiguous()).transpose(1, 2).to(torch.int16)
    if checkpoint_format == "gptq":
        zeros = zeros + 1  # v1 stores zero - 1
    all_eight = bool((zeros == SYMMETRIC_ZERO_POINT).all())  # load-time host sync
    if sym and not all_eight:
        raise ValueError(
            f"sym=True but qzeros hold zero points other than {SYMMETRIC_ZERO_POINT} after the "
            f"{checkpoint_format} convention: pass sym=False (asymmetric) or check "
            "checkpoint_format (v1 'gptq' stores zero - 1, 'gptq_v2' stores zero)"
        )
    return Int4Weight(
        qweight=qweight.contiguous(),
        scales=scales.to(torch.float16).contiguous(),
        zeros=None if all_eight else zeros.to(torch.uint8).contiguous(),
        group_size=group_size,
    )


def _check_trivial_g_idx(g_idx: torch.Tensor, E: int, K: int, group_size: int) -> None:
    """Refuse any g_idx other than ``k // group_size`` (act-order permutations)."""
    if g_idx.dim() == 1:
        g_idx = g_idx.unsqueeze(0).expand(E, -1)
    if tuple(g_idx.shape) != (E, K):
        raise ValueError(f"g_idx shape {tuple(g_idx.shape)} does not match K={K} (E={E})")
    trivial = torch.arange(K, device=g_idx.device) // group_size
    if not bool((g_idx.to(trivial.dtype) == trivial).all()):  # load-time host sync
        raise ValueError(
            "g_idx is not the trivial k // group_size mapping: this checkpoint permutes inputs "
            "across groups (act-order / desc_act), which is not supported. Re-quantize with "
            "desc_act=False or quantize the FP16 weights with quantize_int4."
        )

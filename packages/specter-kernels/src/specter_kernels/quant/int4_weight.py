"""The INT4 weight container: stacked expert linears in the GPTQ layout.

One ``Int4Weight`` holds E linears of the same shape (out_features N,
in_features K), quantized with group size G along the input dimension:

* ``qweight`` int32 ``[E, K // 8, N]``: eight 4-bit values per word packed along
  the input dimension; value j of a word (input index ``8 * row + j``) sits in
  bits ``4j .. 4j + 3``. This is GPTQ's ``qweight`` with a leading expert dim.
* ``scales`` fp16 ``[E, K // G, N]``: one scale per (group, output).
* ``zeros``: ``None`` for symmetric weights (implicit zero point 8), else uint8
  ``[E, K // G, N]`` holding the actual zero point of each (group, output), 0..16
  (16 occurs in GPTQ v1 checkpoints, whose stored nibble is zero - 1).

A weight value is ``(q - zero) * scale``, computed in fp16 (the integer
``q - zero`` is exact; the product is rounded once). Every tensor is contiguous
and on one device. transformers' stacked experts use this orientation:
``gate_up_proj`` ``[E, 2I, H]`` is an ``Int4Weight`` with N = 2I, K = H, gate rows
first; ``down_proj`` ``[E, H, I]`` has N = H, K = I.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PACK_FACTOR = 8  # 4-bit values per int32 word
SYMMETRIC_ZERO_POINT = 8


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """Stacked INT4 expert weights in the GPTQ layout (see the module docstring).

    Attributes:
        qweight: int32 ``[E, K // 8, N]``, eight 4-bit values per word along K.
        scales: fp16 ``[E, K // G, N]``.
        zeros: ``None`` (symmetric, zero point 8) or uint8 ``[E, K // G, N]`` zero points.
        group_size: G, the number of consecutive inputs sharing one scale; a
            multiple of 8 that divides K.

    Raises:
        TypeError: a tensor has the wrong dtype.
        ValueError: shapes disagree, a tensor is not contiguous, or tensors sit
            on different devices.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int

    def __post_init__(self) -> None:
        qweight, scales, zeros, group_size = self.qweight, self.scales, self.zeros, self.group_size
        if qweight.dtype != torch.int32:
            raise TypeError(f"Int4Weight.qweight must be int32, got {qweight.dtype}")
        if scales.dtype != torch.float16:
            raise TypeError(
                f"Int4Weight.scales must be float16, got {scales.dtype}; convert with .half()"
            )
        if qweight.dim() != 3 or scales.dim() != 3:
            raise ValueError(
                "Int4Weight expects qweight [E, K//8, N] and scales [E, K//G, N] (3-D); got "
                f"qweight {tuple(qweight.shape)} and scales {tuple(scales.shape)}. "
                "For one linear, add a leading expert dim with .unsqueeze(0)."
            )
        if not isinstance(group_size, int) or group_size <= 0 or group_size % PACK_FACTOR:
            raise ValueError(f"group_size must be a positive multiple of 8, got {group_size!r}")
        E, k_words, N = qweight.shape
        K = k_words * PACK_FACTOR
        if K % group_size:
            raise ValueError(
                f"in_features K={K} is not a multiple of group_size={group_size}; "
                "the group size must divide K"
            )
        expected = (E, K // group_size, N)
        if tuple(scales.shape) != expected:
            raise ValueError(
                f"scales shape {tuple(scales.shape)} does not match qweight {tuple(qweight.shape)}"
                f" with group_size={group_size}: expected {expected}"
            )
        tensors = {"qweight": qweight, "scales": scales}
        if zeros is not None:
            if zeros.dtype != torch.uint8:
                raise TypeError(f"Int4Weight.zeros must be uint8 zero points, got {zeros.dtype}")
            if tuple(zeros.shape) != expected:
                raise ValueError(f"zeros shape {tuple(zeros.shape)} != expected {expected}")
            tensors["zeros"] = zeros
        for name, tensor in tensors.items():
            if not tensor.is_contiguous():
                raise ValueError(f"Int4Weight.{name} must be contiguous; call .contiguous() first")
            if tensor.device != qweight.device:
                raise ValueError(
                    f"Int4Weight.{name} is on {tensor.device} but qweight is on {qweight.device}"
                )

    @property
    def num_experts(self) -> int:
        """E, the number of stacked linears."""
        return self.qweight.shape[0]

    @property
    def out_features(self) -> int:
        """N, outputs per linear."""
        return self.qweight.shape[2]

    @property
    def in_features(self) -> int:
        """K, inputs per linear."""
        return self.qweight.shape[1] * PACK_FACTOR

    @property
    def symmetric(self) -> bool:
        """True when every zero point is the implicit 8."""
        return self.zeros is None

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """Bytes held by all tensors (what a kernel reads to touch every expert)."""
        total = self.qweight.nbytes + self.scales.nbytes
        return total + (self.zeros.nbytes if self.zeros is not None else 0)

    @property
    def nbytes_per_expert(self) -> int:
        """Bytes one expert's linear occupies."""
        return self.nbytes // max(self.num_experts, 1)

    def experts(self, index: int | slice | torch.Tensor) -> Int4Weight:
        """A view (slice) or copy (index tensor) holding a subset of the experts.

        Args:
            index: an int (kept as a length-1 expert dim), a slice, or an index tensor.
        """
        if isinstance(index, int):
            index = slice(index, index + 1)
        zeros = self.zeros[index] if self.zeros is not None else None
        return Int4Weight(
            self.qweight[index].contiguous(),
            self.scales[index].contiguous(),
            zeros.contiguous() if zeros is not None else None,
            self.group_size,
        )

    def to(self, device: torch.device | str) -> Int4Weight:
        """A copy on ``device``."""
        zeros = self.zeros.to(device) if self.zeros is not None else None
        return Int4Weight(self.qweight.to(device), self.scales.to(device), zeros, self.group_size)


def stack_int4_experts(weights: Sequence[Int4Weight]) -> Int4Weight:
    """Stack per-expert INT4 linears into one ``[E, ...]`` weight.

    Args:
        weights: E weights of equal shape and group size, each holding one or more
            experts (their expert dims are concatenated in order).

    Returns:
        One Int4Weight with the experts concatenated along dim 0. If some inputs are
        symmetric and others not, the symmetric ones get explicit zero points 8.

    Raises:
        ValueError: the list is empty or the shapes or group sizes differ.
    """
    if not weights:
        raise ValueError("stack_int4_experts needs at least one weight")
    first = weights[0]
    for i, w in enumerate(weights):
        if (w.in_features, w.out_features, w.group_size) != (
            first.in_features,
            first.out_features,
            first.group_size,
        ):
            raise ValueError(
                f"weight {i} has (K, N, G)=({w.in_features}, {w.out_features}, {w.group_size}), "
                f"expected ({first.in_features}, {first.out_features}, {first.group_size})"
            )
    zeros = _merge_zeros([w.zeros for w in weights], [w.scales for w in weights], dim=0)
    return Int4Weight(
        torch.cat([w.qweight for w in weights], dim=0),
        torch.cat([w.scales for w in weights], dim=0),
        zeros,
        first.group_size,
    )


def concat_gate_up(gate: Int4Weight, up: Int4Weight) -> Int4Weight:
    """Concatenate gate and up projections along N into transformers' gate_up layout.

    Args:
        gate: ``[E, I, H]`` gate projection (N = I, K = H).
        up: ``[E, I, H]`` up projection of the same shape and group size.

    Returns:
        ``[E, 2I, H]`` with gate outputs in rows ``[0, I)`` and up in ``[I, 2I)``.

    Raises:
        ValueError: shapes or group sizes differ.
    """
    if (gate.num_experts, gate.in_features, gate.out_features, gate.group_size) != (
        up.num_experts,
        up.in_features,
        up.out_features,
        up.group_size,
    ):
        raise ValueError(
            "gate and up must share (E, K, N, group_size); got "
            f"gate ({gate.num_experts}, {gate.in_features}, {gate.out_features}, "
            f"{gate.group_size}) and up ({up.num_experts}, {up.in_features}, "
            f"{up.out_features}, {up.group_size})"
        )
    zeros = _merge_zeros([gate.zeros, up.zeros], [gate.scales, up.scales], dim=2)
    return Int4Weight(
        torch.cat([gate.qweight, up.qweight], dim=2).contiguous(),
        torch.cat([gate.scales, up.scales], dim=2).contiguous(),
        zeros,
        gate.group_size,
    )


def _merge_zeros(
    zeros: Sequence[torch.Tensor | None], scales: Sequence[torch.Tensor], dim: int
) -> torch.Tensor | None:
    """Concatenate zero points, filling symmetric parts with explicit 8s."""
    if all(z is None for z in zeros):
        return None
    parts = [
        z
        if z is not None
        else torch.full(s.shape, SYMMETRIC_ZERO_POINT, dtype=torch.uint8, device=s.device)
        for z, s in zip(zeros, scales, strict=True)
    ]
    return torch.cat(parts, dim=dim).contiguous()

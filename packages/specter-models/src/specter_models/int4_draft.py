"""The draft's INT4 routed experts: round-to-nearest quantization, one expert at a time.

The draft is the target with its routed experts in INT4 (W4A16). Each layer's experts end up
in two stacked ``Int4Weight`` s in transformers' orientation (``gate_up [E, 2I, H]``,
``down [E, H, I]``) that ``fused_moe_w4a16`` reads. They are quantized on the device one
expert at a time into preallocated per-layer tensors, so the FP16 experts never sit on the
device together. Group size 128 when the input dimension allows it, else 64 or 32
(the sizes the kernels support).
"""

from __future__ import annotations

import torch

from specter_kernels import SUPPORTED_GROUP_SIZES, Int4Weight, quantize_int4

PACK_FACTOR = 8  # 4-bit values per int32 word
PREFERRED_GROUP_SIZES = tuple(sorted(SUPPORTED_GROUP_SIZES, reverse=True))


def draft_group_size(in_features: int, requested: int | None = None) -> int:
    """The INT4 group size for a linear with ``in_features`` inputs.

    Args:
        in_features: ``K``.
        requested: a group size to use instead of the largest that divides ``K``.

    Returns:
        ``requested`` if given, else the largest of 128, 64, 32 dividing ``K``.

    Raises:
        ValueError: ``requested`` is unsupported or does not divide ``K``, or no supported
            size divides ``K``.
    """
    if requested is not None:
        if requested not in SUPPORTED_GROUP_SIZES or in_features % requested:
            raise ValueError(
                f"draft group size {requested} does not work for in_features={in_features}: it "
                f"must be one of {SUPPORTED_GROUP_SIZES} and divide in_features"
            )
        return requested
    for size in PREFERRED_GROUP_SIZES:
        if in_features % size == 0:
            return size
    raise ValueError(
        f"in_features={in_features} is not a multiple of any INT4 group size "
        f"{SUPPORTED_GROUP_SIZES}; this model's experts cannot be quantized for the draft"
    )


def int4_linear_bytes(out_features: int, in_features: int, group_size: int) -> int:
    """Bytes of one symmetric INT4 linear: packed weights plus fp16 scales."""
    return (
        in_features // PACK_FACTOR * out_features * 4 + in_features // group_size * out_features * 2
    )


def int4_expert_bytes(hidden: int, intermediate: int, group_size: int | None = None) -> int:
    """Bytes of one expert's INT4 draft weights (gate_up and down, symmetric RTN)."""
    g1 = draft_group_size(hidden, group_size)
    g2 = draft_group_size(intermediate, group_size)
    return int4_linear_bytes(2 * intermediate, hidden, g1) + int4_linear_bytes(
        hidden, intermediate, g2
    )


class Int4LayerBuilder:
    """Preallocated INT4 tensors of one layer, filled expert by expert.

    Args:
        num_experts: ``E``.
        hidden: ``H``.
        intermediate: ``I``.
        device: where the INT4 weights live.
        group_size: force a group size (default: the largest that divides each K).

    Example:
        >>> builder = Int4LayerBuilder(num_experts=2, hidden=64, intermediate=32, device="cpu")
        >>> for e in range(2):
        ...     builder.quantize(e, torch.randn(64, 64), torch.randn(64, 32))
        >>> gate_up, down = builder.finish()
        >>> gate_up.num_experts, gate_up.group_size, down.group_size
        (2, 64, 32)
    """

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        intermediate: int,
        device: torch.device | str,
        group_size: int | None = None,
    ):
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.group_sizes = (
            draft_group_size(hidden, group_size),
            draft_group_size(intermediate, group_size),
        )
        self._gate_up = _allocate(
            num_experts, 2 * intermediate, hidden, self.group_sizes[0], device
        )
        self._down = _allocate(num_experts, hidden, intermediate, self.group_sizes[1], device)
        self._filled = [False] * num_experts

    def quantize(self, expert: int, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """RTN-quantize one expert on the builder's device and store it.

        Args:
            expert: its index.
            gate_up: ``[2I, H]`` float weights (any device; moved here).
            down: ``[H, I]`` float weights.

        Raises:
            ValueError: a shape that is not this layer's.
        """
        self._check(expert, gate_up, down)
        device = self._gate_up[0].device
        for (qweight, scales), weight, group in (
            (self._gate_up, gate_up, self.group_sizes[0]),
            (self._down, down, self.group_sizes[1]),
        ):
            q = quantize_int4(weight.to(device, non_blocking=True).unsqueeze(0), group)
            qweight[expert].copy_(q.qweight[0])
            scales[expert].copy_(q.scales[0])
        self._filled[expert] = True

    def finish(self) -> tuple[Int4Weight, Int4Weight]:
        """The layer's ``(gate_up [E, 2I, H], down [E, H, I])`` INT4 weights.

        Raises:
            RuntimeError: some expert was never quantized.
        """
        missing = [e for e, done in enumerate(self._filled) if not done]
        if missing:
            raise RuntimeError(f"INT4 experts {missing[:8]} of this layer were never filled")
        return (
            Int4Weight(*self._gate_up, None, self.group_sizes[0]),
            Int4Weight(*self._down, None, self.group_sizes[1]),
        )

    def _check(self, expert: int, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        H, I = self.hidden, self.intermediate
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert must be in [0, {self.num_experts}), got {expert}")
        if tuple(gate_up.shape) != (2 * I, H) or tuple(down.shape) != (H, I):
            raise ValueError(
                f"expert {expert}: gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} "
                f"do not match this layer's [{2 * I}, {H}] and [{H}, {I}]"
            )


def _allocate(
    num_experts: int, out_features: int, in_features: int, group_size: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    qweight = torch.empty(
        num_experts, in_features // PACK_FACTOR, out_features, dtype=torch.int32, device=device
    )
    scales = torch.empty(
        num_experts, in_features // group_size, out_features, dtype=torch.float16, device=device
    )
    return qweight, scales

"""Tile shapes of the batch-invariant matmul, a function of (N, K, dtype) only.

The config must never look at M or the batch size: a different tile along K, or
a split of K across programs, changes the order in which a row's products are
summed, and so its rounding. BLOCK_M is fixed at 16 (the smallest tensor-core
tile): at decode and verification sizes (M <= 64) the matmul is bound by
reading the weight, so a larger BLOCK_M would only waste lanes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_M = 16


@dataclass(frozen=True)
class MatmulConfig:
    """Tile shape of one invariant matmul launch.

    Attributes:
        block_m: output rows per program (fixed, see the module docstring).
        block_n: output columns per program, >= 16 (tensor-core minimum).
        block_k: reduction step, >= 16; fixes the summation order of each row.
        num_warps: warps per program.
        num_stages: software-pipelining depth (loads in flight).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def _pow2_at_least(value: int, floor: int) -> int:
    return max(floor, 1 << max(0, value - 1).bit_length())


def matmul_config(N: int, K: int, dtype: torch.dtype) -> MatmulConfig:
    """The tile shape for an ``[*, K] x [K, N]`` product of ``dtype`` inputs.

    Narrow outputs get narrow tiles so that small N (2048-wide projections)
    still spreads over the GPU's ~132 SMs without splitting K; wide ones
    (vocab projections) use 64 or 128 columns per program.

    Args:
        N: output columns.
        K: reduction length.
        dtype: input dtype (fp16, bf16 or fp32).

    Returns:
        The config; equal arguments always give an equal config.
    """
    if N >= 32768:
        block_n = 128
    elif N >= 8192:
        block_n = 64
    elif N >= 4096:
        block_n = 32
    else:
        block_n = 16
    if dtype == torch.float32:
        # fp32 operands are twice as wide and multiply on CUDA cores: smaller K step.
        return MatmulConfig(BLOCK_M, block_n, min(64, _pow2_at_least(K, 16)), 4, 3)
    return MatmulConfig(BLOCK_M, block_n, min(128, _pow2_at_least(K, 16)), 4, 4)

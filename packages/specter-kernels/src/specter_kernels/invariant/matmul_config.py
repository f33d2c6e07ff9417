"""Tile shapes of the batch-invariant matmul, a function of (N, K, dtype) only.

The config must never look at M or the batch size: a different tile along K, or
a different split of K across programs, changes the order in which a row's products
are summed, and so its rounding. A split fixed by (N, K, dtype) is fine: its partial
sums are added in a fixed order (see :mod:`specter_kernels.invariant.matmul_triton`).
BLOCK_M is fixed at 16 (the smallest tensor-core tile): at decode and verification sizes
(M <= 64) the matmul is bound by reading the weight, so a larger BLOCK_M would only waste
lanes.

Tiles measured best on a GPU model (``scripts/sweep_invariant_matmul.py``) are kept in
``tuned/invariant_matmul_<gpu>.json`` beside this module, keyed by (N, K, dtype). Shapes not
in the file get the heuristic below. Either way the tile is a function of (N, K, dtype, GPU model)
and never of M, so tuning keeps the kernel batch-invariant.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

TUNED_DIR = Path(__file__).parent / "tuned"

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
        split_k: stretches K is cut into, each a program of its own, summed by a second
            kernel in a fixed order (1: one pass, no workspace).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.split_k < 1:
            raise ValueError(f"split_k must be at least 1, got {self.split_k}")


def _pow2_at_least(value: int, floor: int) -> int:
    return max(floor, 1 << max(0, value - 1).bit_length())


def tuned_config_path(device_name: str) -> Path:
    """The tuned-tile file of a GPU model: ``tuned/invariant_matmul_<gpu>.json``
    (``"NVIDIA H200"`` -> ``nvidia_h200``)."""
    return _config_path(device_name, TUNED_DIR)


@functools.cache
def _config_path(device_name: str, tuned_dir: Path) -> Path:
    # Cached: every matmul launch asks.
    return tuned_dir / f"invariant_matmul_{device_slug(device_name)}.json"


def device_slug(device_name: str) -> str:
    """A GPU model's name as tuned files spell it: ``"NVIDIA H200"`` -> ``nvidia_h200``."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


@functools.cache
def _tuned_table(path: Path) -> dict[tuple[int, int, str], MatmulConfig]:
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())["configs"]
        table = {}
        for e in entries:
            tile = (int(e["block_n"]), int(e["block_k"]), int(e["num_warps"]), int(e["num_stages"]))
            split = int(e.get("split_k", 1))
            key = (int(e["N"]), int(e["K"]), str(e["dtype"]))
            table[key] = MatmulConfig(BLOCK_M, *tile, split_k=split)
        return table
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tuned invariant-matmul file ({type(error).__name__}: {error}); "
            "expected {'configs': [{'N', 'K', 'dtype', 'block_n', 'block_k', 'num_warps', "
            "'num_stages'[, 'split_k']}, ...]}; fix it or write it again with "
            "scripts/sweep_invariant_matmul.py --write-config"
        ) from error


def tuned_matmul_config(
    N: int, K: int, dtype: torch.dtype, device_name: str
) -> MatmulConfig | None:
    """The tuned tile of this shape on this GPU model, or None when none was measured."""
    key = (N, K, str(dtype).removeprefix("torch."))
    return _tuned_table(tuned_config_path(device_name)).get(key)


def matmul_config(
    N: int, K: int, dtype: torch.dtype, device_name: str | None = None
) -> MatmulConfig:
    """The tile shape for an ``[*, K] x [K, N]`` product of ``dtype`` inputs.

    With ``device_name`` (a CUDA device's name) a tuned tile of that GPU model is used
    when one exists for (N, K, dtype); otherwise the heuristic below.

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
    if device_name is not None:
        tuned = tuned_matmul_config(N, K, dtype, device_name)
        if tuned is not None:
            return tuned
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

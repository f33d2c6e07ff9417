"""Tile shapes of the W4A16 kernels, chosen per problem size.

Chosen from sweeps on one H200 (the tensor-core path's with
``scripts/bench_kernels.py --sweep``). Under the Triton interpreter (CPU tests) small
fixed shapes keep the tests fast while still exercising split-K, masking and
every ``tl.dot`` dim >= 16.

The gemv path's tiles can be tuned per GPU model: ``specter tune int4 --model M
--write-config`` times :func:`gemv_gate_up_candidates` and :func:`gemv_down_candidates`
for one MoE layer and writes ``tuned/w4a16_gemv_<gpu>.json`` beside this module, keyed by
(H, I, top_k); a layer shape listed there takes its tuned pair, others the defaults below.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch
import triton

from specter_kernels.moe.w4a16_triton import GemvConfig, TileConfig
from specter_kernels.tuned_files import device_slug, read_tuned_entries

TUNED_DIR = Path(__file__).parent / "tuned"
"""Where the tuned gemv-path files of GPU models are."""
KEY_FIELDS = ("H", "I", "top_k")
"""The fields naming a layer shape in a tuned file."""

GEMV_MATH = 3
"""The gemv path's inner-loop math on CUDA (``GemvConfig.math``): the packed f16x2 math of
``int4_triton.int4_word_dot8``. One T = 1 MoE layer in a CUDA graph on an H200 took 19.3 us
for DeepSeek-V2-Lite with it and these tiles against 24.3 us with fp16 dequantization and the
wider tiles, Phi-3.5-MoE 39 against 60 us (one T = 1 layer timed in a CUDA graph over four
rotating weight sets)."""


def default_gemv_configs(I: int) -> tuple[GemvConfig, GemvConfig]:
    """(gate_up, down) configs of the gemv path on CUDA for a layer shape the tuned file does
    not list.

    Swept at T = 1 on DeepSeek-V2-Lite and Phi-3.5-MoE shapes inside CUDA graphs: the
    launches are latency-bound, so narrow tiles (more programs in flight) are faster than
    wider ones; the pipelining depth hardly matters. DeepSeek-V2-Lite's layer: 24.3 us with
    (32, 256) / (64, 128) tiles and fp16 math, 19.3 us with these and the packed math;
    Phi-3.5-MoE's 60 -> 39 us.
    """
    return (
        GemvConfig(16, 512, split_k=1, num_warps=4, num_stages=3, math=GEMV_MATH),
        GemvConfig(32, 128, split_k=min(4, triton.cdiv(I, 128)), num_warps=4, math=GEMV_MATH),
    )


def gemv_configs(
    device: torch.device, T: int, top_k: int, H: int, I: int
) -> tuple[GemvConfig, GemvConfig]:
    """(gate_up, down) configs of the gemv path: the GPU model's tuned pair for (H, I,
    top_k) when its tuned file lists one, else :func:`default_gemv_configs`."""
    if device.type != "cuda":
        # The interpreter's cost is per program and per op, not per element.
        return GemvConfig(64, 64, split_k=2), GemvConfig(64, 128, split_k=2)
    tuned = tuned_gemv_configs(H, I, top_k, _gpu_name(device))
    return tuned if tuned is not None else default_gemv_configs(I)


@functools.cache
def _gpu_name(device: torch.device) -> str | None:
    """A CUDA device's GPU model (asked once), None where CUDA is not available."""
    return torch.cuda.get_device_name(device) if torch.cuda.is_available() else None


def tuned_gemv_path(gpu_name: str) -> Path:
    """The tuned gemv-path file of a GPU model: ``tuned/w4a16_gemv_<gpu>.json``."""
    return TUNED_DIR / f"w4a16_gemv_{device_slug(gpu_name)}.json"


def tuned_gemv_configs(
    H: int, I: int, top_k: int, gpu_name: str | None
) -> tuple[GemvConfig, GemvConfig] | None:
    """The tuned (gate_up, down) pair of a layer shape on a GPU model, or None when its
    file does not list the shape (or there is no file, or no GPU is named)."""
    if gpu_name is None:
        return None
    return _tuned_table(tuned_gemv_path(gpu_name)).get((H, I, top_k))


@functools.cache
def _tuned_table(path: Path) -> dict[tuple[int, int, int], tuple[GemvConfig, GemvConfig]]:
    try:
        return {
            (int(e["H"]), int(e["I"]), int(e["top_k"])): (
                _gemv_config_of(e["gate_up"]),
                _gemv_config_of(e["down"]),
            )
            for e in read_tuned_entries(path)
        }
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tuned W4A16 gemv file ({type(error).__name__}: {error}); "
            "expected {'configs': [{'H', 'I', 'top_k', 'gate_up': {'block_n', 'block_k', "
            "'split_k', 'num_warps', 'num_stages', 'math'}, 'down': {...}}, ...]}; fix it or "
            "write it again with specter tune int4 --model M --write-config on that GPU"
        ) from error


def _gemv_config_of(fields: dict[str, Any]) -> GemvConfig:
    names = [f.name for f in dataclasses.fields(GemvConfig)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"unknown GemvConfig fields {unknown} (known: {names})")
    return GemvConfig(**{k: int(v) for k, v in fields.items()})


def gemv_gate_up_candidates() -> list[GemvConfig]:
    """The gate_up tiles a tuning times (packed math): BLOCK_N 16 or 32, BLOCK_K 256-1024,
    2-8 warps, unsplit or split in two; the default first."""
    return [
        GemvConfig(16, 512, 1, 4, 3, GEMV_MATH),
        GemvConfig(16, 256, 1, 4, 2, GEMV_MATH),
        GemvConfig(16, 1024, 1, 4, 3, GEMV_MATH),
        GemvConfig(16, 512, 1, 2, 3, GEMV_MATH),
        GemvConfig(16, 512, 1, 8, 3, GEMV_MATH),
        GemvConfig(16, 512, 2, 4, 3, GEMV_MATH),
        GemvConfig(32, 256, 1, 8, 3, GEMV_MATH),
        GemvConfig(32, 256, 1, 4, 2, GEMV_MATH),
    ]


def gemv_down_candidates(I: int) -> list[GemvConfig]:
    """The down tiles a tuning times for an expert intermediate size ``I`` (packed math):
    BLOCK_N 16-64, BLOCK_K 64-256, K split 2-8 ways; the default first."""
    split = min(4, triton.cdiv(I, 128))
    found = [
        GemvConfig(32, 128, split, 4, 2, GEMV_MATH),
        GemvConfig(16, 128, split, 4, 2, GEMV_MATH),
        GemvConfig(16, 128, 8, 4, 2, GEMV_MATH),
        GemvConfig(32, 128, split, 2, 2, GEMV_MATH),
        GemvConfig(32, 64, 8, 4, 2, GEMV_MATH),
        GemvConfig(32, 256, 2, 4, 2, GEMV_MATH),
        GemvConfig(64, 128, split, 4, 2, GEMV_MATH),
    ]
    return list(dict.fromkeys(found))


def gemv_tuned_entry(
    H: int, I: int, top_k: int, gate_up: GemvConfig, down: GemvConfig, times: dict[str, float]
) -> dict[str, Any]:
    """The tuned-file entry of a layer shape's (gate_up, down) pair, with the measured
    ``times`` (microseconds, rounded to 0.01) beside it."""
    entry: dict[str, Any] = {"H": H, "I": I, "top_k": top_k}
    entry["gate_up"] = dataclasses.asdict(gate_up)
    entry["down"] = dataclasses.asdict(down)
    entry.update({name: round(us, 2) for name, us in times.items()})
    return entry


def tile_configs(
    device: torch.device, T: int, top_k: int, E: int, H: int, I: int
) -> tuple[TileConfig, TileConfig]:
    """(gate_up, down) configs of the tensor-core path (equal block_m)."""
    if device.type != "cuda":
        return TileConfig(16, 64, 128, split_k=2), TileConfig(16, 64, 128, split_k=2)
    pairs = T * top_k
    tokens_per_expert = pairs / E
    block_m = 16 if tokens_per_expert <= 16 else (32 if tokens_per_expert <= 48 else 64)
    # Swept at block_m 16: gate_up unsplit, down split 2 (T <= 8) or 1-2 (T 16-32).
    down_split = 2 if block_m == 16 else 1
    return (
        TileConfig(block_m, 64, 128, split_k=1, num_warps=4, num_stages=3),
        TileConfig(block_m, 64, 128, split_k=down_split, num_warps=4, num_stages=3),
    )

"""Sweep the batch-invariant matmul's tiles and K splits on the GPU, timed inside CUDA graphs.

A decode step replays its linears from a CUDA graph, each on a different weight, so a
linear's cost there is its kernel's device time with the weight coming from HBM, not the
launch overhead an isolated timing adds (a 2048 x 2048 GEMV reads 8 MB: 2 us at 4 TB/s,
against 10-16 us measured one launch at a time). This sweep therefore captures ``R``
launches over ``R`` distinct weights (at least 256 MB in all, so L2 holds none of them)
in one graph and divides the replay's time by ``R``; ``F.linear`` (cuBLAS) is timed the
same way beside it.

For each linear shape of the three models (routers in fp32, as their modeling code runs
them) and each candidate (BLOCK_N, BLOCK_K, warps, stages, split_k), at M = 1 (a decode
step) and M = 5 (a K = 4 verification): the time, and whether the first row's bits equal
at both M. The best invariant candidate per shape (least M=1 + M=5 time) goes to
``--write-config`` in the tuned-tile format.

    source scripts/gpu-env.sh && python3 scripts/sweep_invariant_matmul.py \\
        --out $OUT/sweep.jsonl --write-config $OUT/invariant_matmul_nvidia_h200.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time

import torch
import torch.nn.functional as F
import triton
from bench_kernels import time_graph  # a sibling script (scripts/ is on sys.path)

from specter_kernels.invariant.matmul_config import (
    BLOCK_M,
    MatmulConfig,
    matmul_config,
    tuned_config_path,
)
from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

# (name, N, K, dtype): DeepSeek-V2-Lite first (the targets' model), then Qwen1.5-MoE and
# Phi-3.5-MoE.
SHAPES = (
    ("dsv2 q_kv_a (fused)", 3648, 2048, torch.float16),
    ("dsv2 q_proj", 3072, 2048, torch.float16),
    ("dsv2 o_proj / qwen q,k,v,o", 2048, 2048, torch.float16),
    ("dsv2 kv_a_proj", 576, 2048, torch.float16),
    ("dsv2 kv_b_proj", 4096, 512, torch.float16),
    ("dsv2 shared gate/up", 2816, 2048, torch.float16),
    ("dsv2 shared down", 2048, 2816, torch.float16),
    ("dsv2 router (fp32)", 64, 2048, torch.float32),
    ("dsv2 lm_head", 102400, 2048, torch.float16),
    ("dsv2 dense gate_up (fused)", 21888, 2048, torch.float16),
    ("dsv2 dense down", 2048, 10944, torch.float16),
    ("qwen shared gate_up (fused)", 11264, 2048, torch.float16),
    ("qwen shared gate/up", 5632, 2048, torch.float16),
    ("qwen shared down", 2048, 5632, torch.float16),
    ("qwen router (fp32)", 60, 2048, torch.float32),
    ("qwen shared gate (fp32)", 1, 2048, torch.float32),
    ("qwen lm_head", 151936, 2048, torch.float16),
    ("phi q,o", 4096, 4096, torch.float16),
    ("phi k,v", 1024, 4096, torch.float16),
    ("phi router (fp32)", 16, 4096, torch.float32),
    ("phi lm_head", 32064, 4096, torch.float16),
)
ROWS = (1, 5)
GRAPH_BYTES = 256 << 20
"""Weight bytes one timing graph streams (distinct copies: more than the H200's L2)."""


def candidates(N: int, K: int, dtype: torch.dtype) -> list[MatmulConfig]:
    """Tiles worth timing: enough programs to fill ~132 SMs, few enough to stay cheap.

    A split costs one launch (its partials are summed by the tile's last arrival), so deep
    splits of K are candidates wherever the columns alone give too few programs.
    """
    found = []
    block_ns = (16, 32) if dtype == torch.float32 else (16, 32, 64)
    block_ks = (32, 64) if dtype == torch.float32 else (128, 256, 512)
    # Narrow outputs (routers, Qwen's one-column shared-expert gate) give a handful of
    # column tiles: only deep splits of K fill the GPU there.
    splits = (1, 2, 4, 8, 16) if N >= 256 else (1, 4, 16, 32, 64)
    for bn, bk, stages, split in itertools.product(block_ns, block_ks, (3,), splits):
        warps = 8 if bn * bk >= 64 * 256 else 4
        programs = triton.cdiv(N, bn) * split
        if split > 1 and (programs > 2048 or K // split < bk):
            continue
        if split == 1 or programs >= min(128, 16 * split):
            found.append(MatmulConfig(BLOCK_M, bn, bk, warps, stages, split))
    return found


def graph_us(launch, copies: int) -> float:
    """Device microseconds per launch: ``launch(0) .. launch(copies - 1)`` (distinct weights)
    in one CUDA graph, replayed (``bench_kernels.time_graph``)."""
    fns = [functools.partial(launch, i) for i in range(copies)]
    return time_graph(fns, reps=copies, budget_s=0.02)


def sweep_shape(name: str, N: int, K: int, dtype: torch.dtype, max_seconds: float, f):
    """Time cuBLAS and every candidate at each row count; one JSON line per candidate."""
    shape_start = time.perf_counter()
    size = dtype.itemsize
    copies = max(4, min(64, GRAPH_BYTES // (N * K * size)))
    weights = torch.randn(copies, N, K, device="cuda", dtype=dtype) / K**0.5
    x = torch.randn(max(ROWS), K, device="cuda", dtype=dtype)
    outs = {m: torch.empty(1, m, N, device="cuda", dtype=dtype) for m in ROWS}
    linear = {m: graph_us(lambda i, m=m: F.linear(x[:m], weights[i]), copies) for m in ROWS}
    default = matmul_config(N, K, dtype)
    shipped = matmul_config(N, K, dtype, torch.cuda.get_device_name())
    results = []
    for config in dict.fromkeys([default, shipped, *candidates(N, K, dtype)]):
        if time.perf_counter() - shape_start > max_seconds:
            break
        if config.block_k > 2 * K and config.block_k > 128:
            continue
        try:
            us = {
                m: graph_us(
                    lambda i, m=m, config=config: launch_invariant_bmm(
                        x[None, :m], weights[i].T[None], outs[m], config=config
                    ),
                    copies,
                )
                for m in ROWS
            }
        except Exception as exc:  # a tile that does not compile or fit
            print(f"{name} {config}: {type(exc).__name__}: {exc}", flush=True)
            continue
        # Both hold the last graph launch's product (weights[-1]): row 0 alone, and
        # row 0 beside four others.
        invariant = torch.equal(outs[1][0, 0], outs[5][0, 0])
        record = {
            "shape": name, "N": N, "K": K, "dtype": str(dtype).removeprefix("torch."),
            "config": config.__dict__, "default": config == default,
            "shipped": config == shipped, "invariant": invariant,
            **{f"us_m{m}": us[m] for m in ROWS},
            **{f"linear_us_m{m}": linear[m] for m in ROWS},
            "gbps_m1": N * K * size / us[1] / 1e3,
        }  # fmt: skip
        results.append(record)
        f.write(json.dumps(record) + "\n")
    return results, linear


def _shipped_entries() -> list[dict]:
    """The tuned-tile file's entries for this GPU model (empty when there is none)."""
    path = tuned_config_path(torch.cuda.get_device_name())
    return json.loads(path.read_text())["configs"] if path.is_file() else []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=240.0)
    p.add_argument("--max-seconds-per-shape", type=float, default=20.0)
    p.add_argument(
        "--write-config",
        default=None,
        help="write the best invariant tile per shape as a tuned-tile file "
        "(specter_kernels/invariant/tuned/invariant_matmul_<gpu>.json format)",
    )
    p.add_argument("--shapes", default=None, help="comma-separated name prefixes to sweep")
    args = p.parse_args()
    start = time.perf_counter()
    torch.manual_seed(0)
    tuned: list[dict] = []
    shapes = SHAPES
    if args.shapes:
        prefixes = args.shapes.split(",")
        shapes = tuple(s for s in SHAPES if s[0].startswith(tuple(prefixes)))
    with open(args.out, "w") as f:
        for name, N, K, dtype in shapes:
            if time.perf_counter() - start > args.max_seconds:
                print(f"time limit: stopped before {name}", flush=True)
                break
            results, linear = sweep_shape(name, N, K, dtype, args.max_seconds_per_shape, f)
            good = [r for r in results if r["invariant"]]
            if not good:
                print(f"{name}: no invariant candidate timed", flush=True)
                continue
            best = min(good, key=lambda r: r["us_m1"] + r["us_m5"])
            ship = next((r for r in results if r["shipped"]), best)
            tile = {k: v for k, v in best["config"].items() if k != "block_m"}
            tuned.append({
                "N": N, "K": K, "dtype": best["dtype"], **tile,
                "graph_us_m1": round(best["us_m1"], 2), "graph_us_m5": round(best["us_m5"], 2),
                "linear_graph_us_m1": round(linear[1], 2),
            })  # fmt: skip
            print(
                f"{name:26s} N={N:6d} K={K:5d} cuBLAS {linear[1]:6.1f}/{linear[5]:6.1f} us"
                f" | shipped {ship['us_m1']:6.1f}/{ship['us_m5']:6.1f}"
                f" | best {best['us_m1']:6.1f}/{best['us_m5']:6.1f} us"
                f" ({best['gbps_m1']:.0f} GB/s) {tile} | {len(results)} timed,"
                f" non-invariant {len(results) - len(good)}",
                flush=True,
            )
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    if args.write_config:
        swept = {(t["N"], t["K"], t["dtype"]) for t in tuned}
        kept = [  # the shipped tiles of shapes this run did not sweep stay in the file
            entry
            for entry in _shipped_entries()
            if (entry["N"], entry["K"], entry["dtype"]) not in swept
        ]
        tuned = tuned + kept
        table = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "source": "scripts/sweep_invariant_matmul.py (CUDA-graph timing, least M=1 + M=5, "
            "bit-invariant)",
            "configs": tuned,
        }
        with open(args.write_config, "w") as f:
            json.dump(table, f, indent=1)
        print(f"wrote {len(tuned)} tuned tiles to {args.write_config}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

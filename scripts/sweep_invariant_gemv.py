"""Sweep the batch-invariant GEMV (``specter_kernels.invariant_gemv_triton``) against the
tensor-core invariant matmul's shipped tile and cuBLAS, timed inside CUDA graphs.

Each timing graph replays launches over distinct weights (more bytes than the L2 holds, see
``sweep_invariant_matmul.py``), so a launch's time is what a decode step pays for it. For each
shape and candidate (BLOCK_N, warps, rows a pass): the time at
M = 1 and M = 5, whether row 0's bits are equal at both, and the largest error against an
fp32 reference. The best invariant candidate per shape goes to ``--write-config``.

    source scripts/gpu-env.sh && python3 scripts/sweep_invariant_gemv.py --out $OUT/gemv.jsonl
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
from sweep_invariant_matmul import SHAPES, graph_us  # a sibling script (scripts/ on sys.path)

from specter_kernels.invariant_gemv_config import GemvConfig
from specter_kernels.invariant_gemv_triton import launch_invariant_gemv
from specter_kernels.invariant_matmul_config import matmul_config
from specter_kernels.invariant_matmul_triton import launch_invariant_bmm

ROWS = (1, 5)
GRAPH_BYTES = 256 << 20


def candidates(N: int, K: int, dtype: torch.dtype) -> list[GemvConfig]:
    """Tiles whose weight stretch is 8-128 elements a thread (64 for fp32), 1-8 rows a pass."""
    width = triton.next_power_of_2(K)
    found = []
    for bn, warps, rows in itertools.product((1, 2, 4, 8), (4, 8), (1, 2, 4, 8)):
        per_thread = bn * width / (32 * warps)
        if 8 <= per_thread <= 128 * 2 // dtype.itemsize and bn <= triton.next_power_of_2(N):
            found.append(GemvConfig(bn, warps, rows))
    return found


def sweep_shape(name: str, N: int, K: int, dtype: torch.dtype, device_name: str, f):
    """Time cuBLAS, the MMA kernel's shipped tile and every GEMV candidate at one shape; one
    JSON line per candidate to ``f``; the best invariant candidate's tuned entry (or None)."""
    copies = max(4, min(64, GRAPH_BYTES // (N * K * dtype.itemsize)))
    weights = torch.randn(copies, N, K, device="cuda", dtype=dtype) / K**0.5
    x = torch.randn(max(ROWS), K, device="cuda", dtype=dtype)
    ref = (x.double() @ weights[-1].double().T).float()
    outs = {m: torch.empty(m, N, device="cuda", dtype=dtype) for m in ROWS}
    linear = {m: graph_us(lambda i, m=m: F.linear(x[:m], weights[i]), copies) for m in ROWS}
    mma = matmul_config(N, K, dtype, device_name)
    mma_us = {
        m: graph_us(
            lambda i, m=m: launch_invariant_bmm(
                x[None, :m], weights[i].T[None], outs[m][None], config=mma
            ),
            copies,
        )
        for m in ROWS
    }
    results = []
    for config in candidates(N, K, dtype):
        launch = functools.partial(launch_invariant_gemv, config=config)
        try:
            us = {
                m: graph_us(
                    lambda i, m=m, launch=launch: launch(x[:m], weights[i], outs[m], None),
                    copies,
                )
                for m in ROWS
            }
        except Exception as exc:  # a tile that does not compile or fit
            print(f"{name} {config}: {type(exc).__name__}: {exc}", flush=True)
            continue
        record = {
            "kind": "gemv", "shape": name, "N": N, "K": K,
            "dtype": str(dtype).removeprefix("torch."),
            "block_n": config.block_n, "num_warps": config.num_warps, "rows": config.rows,
            "invariant": torch.equal(outs[1][0], outs[5][0]),
            "max_err": (outs[5].float() - ref).abs().max().item(),
            **{f"us_m{m}": us[m] for m in ROWS},
            **{f"mma_us_m{m}": mma_us[m] for m in ROWS},
            **{f"linear_us_m{m}": linear[m] for m in ROWS},
            "gbps_m1": N * K * dtype.itemsize / us[1] / 1e3,
        }  # fmt: skip
        results.append(record)
        f.write(json.dumps(record) + "\n")
        f.flush()
    good = [r for r in results if r["invariant"]]
    if not good:
        print(f"{name}: no invariant candidate", flush=True)
        return None
    best = min(good, key=lambda r: r["us_m1"] + r["us_m5"])
    print(
        f"{name:26s} N={N:6d} K={K:5d} cuBLAS {linear[1]:6.2f}/{linear[5]:6.2f} us"
        f" | mma {mma_us[1]:6.2f}/{mma_us[5]:6.2f} | gemv {best['us_m1']:6.2f}/"
        f"{best['us_m5']:6.2f} ({best['gbps_m1']:.0f} GB/s) bn={best['block_n']} "
        f"w={best['num_warps']} rows={best['rows']} err={best['max_err']:.1e}"
        f" | {len(results)} timed, non-invariant {len(results) - len(good)}",
        flush=True,
    )
    return {
        "N": N, "K": K, "dtype": best["dtype"], "block_n": best["block_n"],
        "num_warps": best["num_warps"], "rows": best["rows"],
        "graph_us_m1": round(best["us_m1"], 2), "graph_us_m5": round(best["us_m5"], 2),
        "mma_graph_us_m1": round(mma_us[1], 2), "mma_graph_us_m5": round(mma_us[5], 2),
        "linear_graph_us_m1": round(linear[1], 2),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=None, help="comma-separated name prefixes")
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--write-config", default=None)
    args = p.parse_args()
    start = time.perf_counter()
    torch.manual_seed(0)
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(s for s in SHAPES if s[0].startswith(tuple(args.shapes.split(","))))
    tuned = []
    device_name = torch.cuda.get_device_name()
    with open(args.out, "w") as f:
        for name, N, K, dtype in shapes:
            if time.perf_counter() - start > args.max_seconds:
                print(f"time limit: stopped before {name}", flush=True)
                break
            entry = sweep_shape(name, N, K, dtype, device_name, f)
            if entry is not None:
                tuned.append(entry)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    if args.write_config:
        with open(args.write_config, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "triton": triton.__version__, "configs": tuned}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

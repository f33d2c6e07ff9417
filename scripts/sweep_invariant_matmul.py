"""Sweep the batch-invariant matmul's tile shapes on the GPU (decode and verify sizes).

For each linear shape of the three models and each candidate tile (BLOCK_N, BLOCK_K,
warps, stages), times ``launch_invariant_bmm`` at M = 1 and M = 33 against ``F.linear``
and checks that the first row's bits do not depend on M. Prints the best invariant tile
per shape and writes every timing as JSON lines to ``--out``.

    source scripts/gpu-env.sh && python3 scripts/sweep_invariant_matmul.py --out $OUT/sweep.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing

from specter_kernels.invariant_matmul_config import BLOCK_M, MatmulConfig, matmul_config
from specter_kernels.invariant_matmul_triton import launch_invariant_bmm

# (name, N, K): DeepSeek-V2-Lite, Qwen1.5-MoE and Phi-3.5-MoE projections and LM heads.
SHAPES = (
    ("dsv2 o_proj / qwen q,k,v,o", 2048, 2048),
    ("dsv2 q_proj", 3072, 2048),
    ("dsv2 kv_a_proj", 576, 2048),
    ("dsv2 kv_b_proj", 4096, 512),
    ("dsv2 shared gate/up", 2816, 2048),
    ("dsv2 shared down", 2048, 2816),
    ("dsv2 lm_head", 102400, 2048),
    ("qwen shared gate/up", 5632, 2048),
    ("qwen shared down", 2048, 5632),
    ("qwen lm_head", 151936, 2048),
    ("phi q,o", 4096, 4096),
    ("phi k,v", 1024, 4096),
    ("phi lm_head", 32064, 4096),
)
CANDIDATES = [
    MatmulConfig(BLOCK_M, n, k, w, s)
    for n, k, w, s in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4))
]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=15, return_mode="median")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=100.0)
    p.add_argument(
        "--write-config",
        default=None,
        help="write the best invariant tile per shape as a tuned-tile file "
        "(specter_kernels/tuned/invariant_matmul_<gpu>.json format)",
    )
    args = p.parse_args()
    start = time.perf_counter()
    torch.manual_seed(0)
    records = []
    tuned: list[dict] = []
    with open(args.out, "w") as f:
        for name, N, K in SHAPES:
            if time.perf_counter() - start > args.max_seconds:
                print(f"time limit: stopped before {name}", flush=True)
                break
            w = torch.randn(N, K, device="cuda", dtype=torch.float16) / K**0.5
            x = torch.randn(33, K, device="cuda", dtype=torch.float16)
            ref = {m: bench(lambda m=m, x=x, w=w: F.linear(x[:m], w)) for m in (1, 33)}
            default = matmul_config(N, K, torch.float16)
            results = []
            for config in [default, *CANDIDATES]:
                if config.block_k > 2 * K and config.block_k > 128:
                    continue
                out = {m: torch.empty(1, m, N, device="cuda", dtype=torch.float16) for m in (1, 33)}
                try:
                    ms = {
                        m: bench(
                            lambda m=m, x=x, w=w, out=out, config=config: launch_invariant_bmm(
                                x[None, :m], w.T[None], out[m], config=config
                            )
                        )
                        for m in (1, 33)
                    }
                except Exception as exc:  # a tile that does not compile or fit
                    print(f"{name} {config}: {type(exc).__name__}", flush=True)
                    continue
                invariant = torch.equal(out[1][0, 0], out[33][0, 0])
                record = {
                    "shape": name, "N": N, "K": K, "config": config.__dict__,
                    "default": config == default, "ms_m1": ms[1], "ms_m33": ms[33],
                    "linear_ms_m1": ref[1], "linear_ms_m33": ref[33], "invariant": invariant,
                    "gbps_m1": N * K * 2 / ms[1] / 1e6,
                }  # fmt: skip
                results.append(record)
                records.append(record)
                f.write(json.dumps(record) + "\n")
            good = [r for r in results if r["invariant"]]
            best = min(good, key=lambda r: r["ms_m1"] + r["ms_m33"]) if good else None
            if best is not None:
                tile = {k: v for k, v in best["config"].items() if k != "block_m"}
                timing = {"us_m1": round(best["ms_m1"] * 1e3, 1), "linear_us_m1": ref[1] * 1e3}
                tuned.append({"N": N, "K": K, "dtype": "float16", **tile, **timing})
            dflt = next(r for r in results if r["default"])
            print(
                f"{name:22s} N={N:6d} K={K:5d} linear {ref[1] * 1e3:6.1f}/{ref[33] * 1e3:6.1f} us"
                f" | default {dflt['ms_m1'] * 1e3:6.1f}/{dflt['ms_m33'] * 1e3:6.1f} us"
                f" | best {best['ms_m1'] * 1e3:6.1f}/{best['ms_m33'] * 1e3:6.1f} us "
                f"{best['config']} | non-invariant tiles: {len(results) - len(good)}",
                flush=True,
            )
    print(f"{len(records)} records in {time.perf_counter() - start:.0f} s", flush=True)
    if args.write_config:
        table = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "source": "scripts/sweep_invariant_matmul.py (best of M=1 + M=33, bit-invariant)",
            "configs": tuned,
        }
        with open(args.write_config, "w") as f:
            json.dump(table, f, indent=1)
        print(f"wrote {len(tuned)} tuned tiles to {args.write_config}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

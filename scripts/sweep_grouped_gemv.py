"""Sweep the grouped FP16 expert GEMV (``specter_kernels.grouped_gemv_fp16_triton``) against
the per-pair tensor-core kernels (``grouped_fp16_triton``, the batch-invariant mode's), timed
inside CUDA graphs at one routed row and five.

Each timing graph replays launches that route to different experts of one layer's 64 slots
(``--experts``; DeepSeek-V2-Lite: 1.1 GB, far more than the L2 holds), so a launch's time is
what a decode step pays for it. gate_up and down are swept apart (the other one at its
heuristic tile); every record says whether a pair's bits at one row equal its bits beside
four other rows, and the largest error against the torch reference.

    source scripts/gpu-env.sh && python3 scripts/sweep_grouped_gemv.py --out /tmp/ggemv.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
from bench_kernels import time_graph  # a sibling script (scripts/ is on sys.path)

from specter_kernels import grouped_fp16_triton as mma
from specter_kernels import grouped_gemv_fp16_triton as gemv
from specter_kernels.grouped_moe_fp16 import grouped_moe_fp16_reference

MODELS = {  # H, I, E, top_k
    "deepseek-v2-lite": (2048, 1408, 64, 6),
    "qwen1.5-moe": (2048, 1408, 60, 4),
    "phi-3.5-moe": (4096, 6400, 16, 2),
}
ROWS = (1, 5)
CALLS = 24  # distinct routings in one timing graph


def candidates(K: int, tiles: int) -> list[gemv.GroupedGemvConfig]:
    width = triton.next_power_of_2(K)
    found = []
    for bn, warps in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8)):
        per_thread = tiles * bn * width / (32 * warps)
        if 16 <= per_thread <= 256:
            found.append(gemv.GroupedGemvConfig(bn, warps))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deepseek-v2-lite", choices=sorted(MODELS))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    H, I, E, k = MODELS[args.model]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.float16, generator=g) / H**0.5
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.float16, generator=g) / I**0.5
    e2s = torch.arange(E, device=dev, dtype=torch.int32)
    mask = torch.ones(E, device=dev, dtype=torch.bool)
    x = torch.randn(max(ROWS), H, device=dev, dtype=torch.float16, generator=g)
    ids = [
        torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(max(ROWS))])
        .int()
        .contiguous()
        for _ in range(CALLS)
    ]
    weights = torch.rand(max(ROWS), k, device=dev, generator=g)
    outs = {m: torch.zeros(m, k, H, device=dev) for m in ROWS}
    heur = gemv.grouped_gemv_configs(H, I)

    def run_mma(m, i):
        mma.launch_grouped(x[:m], ids[i][:m], weights[:m], w13, w2, e2s, mask, outs[m])

    def run_gemv(m, i, up, down):
        gemv.launch_grouped_gemv(
            x[:m], ids[i][:m], weights[:m], w13, w2, e2s, mask, outs[m], up, down
        )

    def us(fn, m):
        return time_graph([lambda i=i: fn(m, i) for i in range(CALLS)], reps=CALLS, budget_s=0.05)

    def check(up, down):
        """(row 0's bits equal at 1 and 5 rows, max error against the reference at 5)."""
        one = gemv.launch_grouped_gemv(x[:1], ids[0][:1], weights[:1], w13, w2, e2s, mask,
                                       torch.zeros(1, k, H, device=dev), up, down)  # fmt: skip
        five = gemv.launch_grouped_gemv(x[:5], ids[0][:5], weights[:5], w13, w2, e2s, mask,
                                        torch.zeros(5, k, H, device=dev), up, down)  # fmt: skip
        ref = grouped_moe_fp16_reference(x[:5], ids[0][:5], weights[:5], w13, w2, e2s, mask,
                                         torch.zeros(5, H, device=dev))  # fmt: skip
        err = (five.sum(1) - ref).abs().max().item()
        return bool(torch.equal(one[0], five[0])), err

    records = []
    base = {m: us(run_mma, m) for m in ROWS}
    print(f"mma per-pair: 1 row {base[1]:.2f} us, 5 rows {base[5]:.2f} us", flush=True)
    records.append({"kernel": "mma", "us_m1": base[1], "us_m5": base[5]})
    for part, tiles, K in (("gate_up", 2, H), ("down", 1, I)):
        for c in candidates(K, tiles):
            up, down = (c, heur[1]) if part == "gate_up" else (heur[0], c)
            try:
                t = {m: us(lambda m, i: run_gemv(m, i, up, down), m) for m in ROWS}
                equal, err = check(up, down)
            except Exception as error:  # a tile the compiler rejects (registers, shared)
                print(f"{part} {c}: {type(error).__name__}: {str(error)[:100]}", flush=True)
                continue
            r = {"kernel": "gemv", "part": part, "block_n": c.block_n, "num_warps": c.num_warps,
                 "us_m1": t[1], "us_m5": t[5], "invariant": equal, "max_err": err,
                 "other": (heur[1] if part == "gate_up" else heur[0]).__dict__}  # fmt: skip
            records.append(r)
            print(f"{part:7s} bn={c.block_n:2d} w={c.num_warps}: 1 row {t[1]:6.2f} us, 5 rows "
                  f"{t[5]:6.2f} us, invariant {equal}, err {err:.1e}", flush=True)  # fmt: skip
    with open(args.out, "a") as f:
        for r in records:
            f.write(json.dumps({"model": args.model, **r}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

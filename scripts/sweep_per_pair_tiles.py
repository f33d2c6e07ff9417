"""Sweep the per-pair (batch-invariant) tiles of the grouped FP16 expert kernels
(``specter_kernels.moe.grouped_fp16_triton.per_pair_configs``), timed inside CUDA graphs at one
routed row and five, gate_up and down apart.

Each timing graph replays launches that route to different experts of one layer's slots
(DeepSeek-V2-Lite: 64 experts, 1.1 GB, far more than the L2 holds), so a launch's time is
what a decode step pays for it. A candidate changes one projection's tile (the other keeps
the shipped one); every record says whether a pair's bits at one row equal its bits beside
four other rows (the tile is one for every row count, so they must), and the largest error
against the torch reference. The shipped tile is timed first, and again at the end.

    source scripts/gpu-env.sh && python3 scripts/sweep_per_pair_tiles.py --out /tmp/tiles.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
from bench_kernels import time_graph  # a sibling script (scripts/ is on sys.path)

from specter_kernels.moe import grouped_fp16_triton as grouped
from specter_kernels.moe.grouped_fp16 import grouped_moe_fp16_reference
from specter_kernels.moe.grouped_fp16_triton import GroupedConfig

MODELS = {  # H, I, E, top_k
    "deepseek-v2-lite": (2048, 1408, 64, 6),
    "qwen1.5-moe": (2048, 1408, 60, 4),
    "phi-3.5-moe": (4096, 6400, 16, 2),
}
ROWS = (1, 5)
CALLS = 24  # distinct routings in one timing graph
SHIPPED = grouped.per_pair_configs


def candidates() -> list[GroupedConfig]:
    return [
        GroupedConfig(16, bn, bk, num_warps=w, num_stages=s)
        for bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (2, 4, 8), (3, 5))
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deepseek-v2-lite", choices=sorted(MODELS))
    p.add_argument("--max-seconds", type=float, default=120.0, help="per projection")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    H, inter, E, k = MODELS[args.model]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(E, 2 * inter, H, device=dev, dtype=torch.float16, generator=g) / H**0.5
    w2 = torch.randn(E, H, inter, device=dev, dtype=torch.float16, generator=g) / inter**0.5
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
    shipped = SHIPPED(dev)
    ref = grouped_moe_fp16_reference(x[:5], ids[0][:5], weights[:5], w13, w2, e2s, mask,
                                     torch.zeros(5, H, device=dev))  # fmt: skip

    def launch(m, i):
        grouped.launch_grouped(x[:m], ids[i][:m], weights[:m], w13, w2, e2s, mask, outs[m])

    def measure(tiles) -> dict:
        grouped.per_pair_configs = lambda device: tiles
        try:
            us = {
                m: time_graph(
                    [lambda i=i, m=m: launch(m, i) for i in range(CALLS)], reps=CALLS, budget_s=0.05
                )
                for m in ROWS
            }
            one, five = torch.zeros(1, k, H, device=dev), torch.zeros(5, k, H, device=dev)
            grouped.launch_grouped(x[:1], ids[0][:1], weights[:1], w13, w2, e2s, mask, one)
            grouped.launch_grouped(x[:5], ids[0][:5], weights[:5], w13, w2, e2s, mask, five)
        finally:
            grouped.per_pair_configs = SHIPPED
        return {
            "us_m1": us[1], "us_m5": us[5], "invariant": bool(torch.equal(one[0], five[0])),
            "max_err": (five.sum(1) - ref).abs().max().item(),
        }  # fmt: skip

    records = []

    def record(part, tile, result):
        r = {"model": args.model, "part": part, "tile": tile.__dict__, **result}
        records.append(r)
        print(f"{part:8s} bn={tile.block_n:3d} bk={tile.block_k:3d} w={tile.num_warps} "
              f"s={tile.num_stages}: 1 row {r['us_m1']:6.2f} us, 5 rows {r['us_m5']:6.2f} us, "
              f"invariant {r['invariant']}, err {r['max_err']:.1e}", flush=True)  # fmt: skip

    record("shipped", shipped[0], measure(shipped))
    for part in ("gate_up", "down"):
        begin = time.perf_counter()
        for tile in candidates():
            if time.perf_counter() - begin > args.max_seconds:
                break
            if tile == shipped[0]:
                continue
            tiles = (tile, shipped[1]) if part == "gate_up" else (shipped[0], tile)
            try:
                record(part, tile, measure(tiles))
            except Exception as error:  # a tile the compiler rejects (shared memory)
                print(f"{part} {tile}: {type(error).__name__}: {str(error)[:80]}", flush=True)
    record("shipped", shipped[0], measure(shipped))
    with open(args.out, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sweep the absorbed MLA attention's key chunk (``SPLIT``) and key block (``BLOCK_L``) on the
GPU, timed inside CUDA graphs at DeepSeek-V2-Lite's sizes.

``mla_attention`` runs one program per (query row, ``SPLIT``-key chunk), all 16 heads in
each; at a decode step's 200-300 cached positions and ``SPLIT = 64`` that is 4-5 programs on
132 SMs, each walking its chunk ``BLOCK_L`` keys at a time. Smaller chunks give more programs
and shorter chains, and more partials for the merge. Each point captures 27 calls (one per
layer, each over its own cache, so the cache comes from HBM as in a step) in one graph and
divides the replay by 27; it also checks the result against the fp32 reference.

    source scripts/gpu-env.sh && python3 scripts/sweep_mla_split.py --out $OUT/mla-split.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from bench_kernels import time_graph  # a sibling script (scripts/ is on sys.path)

import specter_kernels as sk
from specter_kernels.attention import mla_attention_triton as kernel

H, R, P, LAYERS = 16, 512, 64, 27


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="64,200,264,600,1100,2100")
    p.add_argument("--rows", default="1,5")
    p.add_argument("--points", default="64:32,32:32,32:16,16:16")
    p.add_argument("--out", default="mla-split.jsonl")
    args = p.parse_args()
    shipped = (kernel.SPLIT, kernel.BLOCK_L)
    points = [tuple(int(v) for v in point.split(":")) for point in args.points.split(",")]
    records = []
    gen = torch.Generator("cuda").manual_seed(0)
    for L in (int(v) for v in args.lengths.split(",")):
        caches = [
            (
                torch.randn(L, R, device="cuda", generator=gen).half(),
                torch.randn(L, P, device="cuda", generator=gen).half(),
            )
            for _ in range(LAYERS)
        ]
        for T in (int(v) for v in args.rows.split(",")):
            qs = [
                (
                    (0.1 * torch.randn(H, T, R, device="cuda", generator=gen)).half(),
                    (0.1 * torch.randn(H, T, P, device="cuda", generator=gen)).half(),
                )
                for _ in range(LAYERS)
            ]

            def call(i: int, qs=qs, caches=caches) -> torch.Tensor:
                (q, qp), (c, k) = qs[i], caches[i]
                return sk.mla_attention(q, qp, c, k, 0.1)

            ref = sk.mla_attention_reference(
                qs[0][0].float(), qs[0][1].float(), caches[0][0].float(), caches[0][1].float(), 0.1
            )
            for split, block_l in points:
                kernel.SPLIT, kernel.BLOCK_L = split, block_l
                out = call(0).float()
                err = float((out - ref).abs().max() / ref.abs().max())
                us = time_graph([functools.partial(call, i) for i in range(LAYERS)], reps=LAYERS)
                record = {"L": L, "T": T, "split": split, "block_l": block_l, "us": us,
                          "max_rel_err": err, "shipped": (split, block_l) == shipped}  # fmt: skip
                records.append(record)
                print(json.dumps(record), flush=True)
            kernel.SPLIT, kernel.BLOCK_L = shipped
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

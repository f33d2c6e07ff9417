"""Warps per program of the decode step's small latency-bound kernels, timed alone.

The all-resident DeepSeek-V2-Lite step (docs/benchmarks.md, thirty-fifth session) spends
about 7 us a layer in the router, 7.6 in the MLA chunk kernel and 2 in each RMSNorm, far
above what their bytes take. Each runs 8 warps a program today. This probe times each at
other warp counts, captured ``--calls`` times in one CUDA graph (median over ``--repeats``
replays, microseconds a call): DeepSeek-V2-Lite's router (64 experts, top-6, fp32 logits),
the RMSNorm of one 2048-wide row, and the absorbed MLA attention of one row with the value
projection over ``--keys`` keys. Another warp count changes the reductions' order, so the
bits (not the math) of each kernel's output: a default changed after this probe changes
committed tokens' bits, and is for a measured A/B of the whole step to decide.

    source scripts/gpu-env.sh && python3 scripts/small_kernel_warps_probe.py
"""

from __future__ import annotations

import argparse

import torch
from routed_layer_probe import graph_us, json_lines  # this folder: the same timing

import specter_kernels as sk
from specter_kernels.attention import mla_attention_triton
from specter_kernels.moe import router_topk_triton
from specter_kernels.norms import rms_norm_triton


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=26)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--keys", default="410,1024")
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    torch.manual_seed(0)
    emit = json_lines(args.out)

    x = torch.randn(1, 2048, device="cuda").half()
    gates = [(0.02 * torch.randn(64, 2048, device="cuda")).half() for _ in range(args.calls)]
    shipped_router = router_topk_triton.router_warps
    for warps in (2, 4, 8):
        router_topk_triton.router_warps = lambda block_h, w=warps: w

        def route(i):
            return sk.router_topk(x, gates[i], 6, logits_dtype=torch.float32,
                                  weights_dtype=torch.float32)  # fmt: skip

        emit(
            {
                "kernel": "router",
                "warps": warps,
                "us": round(graph_us(route, args.calls, args.repeats), 2),
            }
        )
    router_topk_triton.router_warps = shipped_router
    rows = [torch.randn(1, 2048, device="cuda").half() for _ in range(args.calls)]
    weight = torch.ones(2048, device="cuda").half()
    shipped_norm = rms_norm_triton.NUM_WARPS
    for warps in (2, 4, 8):
        rms_norm_triton.NUM_WARPS = warps
        us = graph_us(lambda i: sk.rms_norm(rows[i], weight, 1e-6), args.calls, args.repeats)
        emit({"kernel": "rms_norm", "warps": warps, "us": round(us, 2)})
    rms_norm_triton.NUM_WARPS = shipped_norm
    shipped_mla = mla_attention_triton.NUM_WARPS
    w_uv = (0.02 * torch.randn(16, 128, 512, device="cuda")).half()
    for keys in (int(k) for k in args.keys.split(",")):
        q_lat = torch.randn(16, 1, 512, device="cuda").half()
        q_pe = torch.randn(16, 1, 64, device="cuda").half()
        caches = [
            (
                torch.randn(keys, 512, device="cuda").half(),
                torch.randn(keys, 64, device="cuda").half(),
            )
            for _ in range(args.calls)
        ]
        for warps in (4, 8):
            mla_attention_triton.NUM_WARPS = warps

            def attend(i, q_lat=q_lat, q_pe=q_pe, caches=caches):
                c_kv, k_pe = caches[i]
                return sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.07, None, w_uv=w_uv)

            emit({"kernel": "mla_attention+W_UV", "keys": keys, "warps": warps,
                  "us": round(graph_us(attend, args.calls, args.repeats), 2)})  # fmt: skip
    mla_attention_triton.NUM_WARPS = shipped_mla
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

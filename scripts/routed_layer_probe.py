"""How close one routed-expert layer at one row comes to the memory's rate, per tile.

Plain decoding with every expert resident (the unlimited cell) runs DeepSeek-V2-Lite's
routed experts as the per-pair (batch-invariant) ``grouped_moe_fp16`` launch: gate_up then
down, six pairs of one row, 104 MB of FP16 weights a layer. This probe times that launch at
DeepSeek-V2-Lite's shapes (H 2048, I 1408, 64 experts, top-6) inside a CUDA graph of
``--calls`` launches, each on six other experts (so no launch finds its weights in L2),
for the shipped per-pair tile and each ``--tiles`` entry (``gate_up[:down]``, each
``block_n/stages/warps/block_k``), and beside it cuBLAS reading the same bytes (one
``[1, H] x [H, 6 * 2I]`` product over six adjacent experts' gate_up, then a batched
``[6, 1, I] x [6, I, H]`` down) and a plain device-to-device copy of them. Prints each
arm's microseconds a layer and the weight bytes' rate (median of ``--repeats`` replays).
Every tile's output is checked against the shipped tile's (a different block_k sums in
another order, so only closeness is asserted: the largest relative difference is printed).

Set ``SPECTER_KERNELS_PDL=0`` for each launch's own time with its launch gap; with PDL the
kernels overlap their neighbours' ramps as in a decode step.

    source scripts/gpu-env.sh && python3 scripts/routed_layer_probe.py --out /tmp/routed.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import specter_kernels as sk
from specter_kernels.moe import grouped_fp16_triton
from specter_kernels.moe.grouped_fp16_triton import GroupedConfig, parse_per_pair_tile

H, INTER, E, K = 2048, 1408, 64, 6
LAYER_BYTES = K * 3 * H * INTER * 2


def graph_us(fn, calls: int, repeats: int) -> float:
    """Median microseconds a call of ``fn(i)`` for ``i < calls``, captured in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):  # compile and warm outside the capture
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    times = []
    for r in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        if r >= 2:
            times.append(1e3 * a.elapsed_time(b) / calls)
    return statistics.median(times)


def json_lines(path: str | None):
    """``emit(record)``: print the record as a JSON line and append it to ``path`` (if any)."""

    def emit(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return emit


def _tile(text: str) -> tuple[GroupedConfig, GroupedConfig]:
    gate_up, _, down = text.partition(":")
    g = parse_per_pair_tile(gate_up)
    return g, parse_per_pair_tile(down) if down else g


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tiles",
        default="64/4/4/128,32/4/4/256,64/3/4/256,16/4/4/256,32/6/4/64,32/8/4/128,"
        "128/3/8/128,32/4/4/128:64/4/4/128,32/4/4/128:16/4/4/128",
    )
    p.add_argument("--calls", type=int, default=32, help="launches in one graph (<= E / 6 * 6)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    torch.manual_seed(0)
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(E, H, INTER, device="cuda") * 0.02).half()
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    slots = torch.arange(E, device="cuda", dtype=torch.int32)
    groups = E // K  # call i reads experts of group i % groups: six adjacent ones
    x = (torch.randn(1, H, device="cuda") * 0.5).half()
    weights = torch.rand(1, K, device="cuda")
    ids = [torch.arange(K, device="cuda").view(1, K) + K * (i % groups) for i in range(args.calls)]
    outs = [torch.zeros(1, K, H, device="cuda") for _ in range(args.calls)]
    shipped = grouped_fp16_triton.per_pair_configs

    def routed(i: int) -> None:
        sk.grouped_moe_fp16(x, ids[i], weights, w13, w2, slots, every, outs[i])

    write = json_lines(args.out)

    def emit(arm: str, us: float, **extra) -> None:
        write({"arm": arm, "us_per_layer": round(us, 2),
               "weights_tb_per_s": round(LAYER_BYTES / us / 1e6, 3), **extra})  # fmt: skip

    emit("per-pair shipped", graph_us(routed, args.calls, args.repeats),
         tile=str(shipped(x.device)[0]))  # fmt: skip
    expected = [o.clone() for o in outs]
    for text in (t for t in args.tiles.split(",") if t):
        g, d = _tile(text)
        grouped_fp16_triton.per_pair_configs = lambda device, g=g, d=d: (g, d)
        try:
            us = graph_us(routed, args.calls, args.repeats)
        finally:
            grouped_fp16_triton.per_pair_configs = shipped
        diff = max(
            float((o - e).abs().max() / e.abs().max().clamp_min(1e-12))
            for o, e in zip(outs, expected, strict=True)
        )
        emit(f"per-pair {text}", us, max_rel_diff=diff)

    # cuBLAS on the same bytes: six adjacent experts' gate_up as one product, then down.
    h = torch.empty(K, 1, INTER, device="cuda", dtype=torch.float16)
    y = torch.empty(K, 1, H, device="cuda", dtype=torch.float16)

    def cublas(i: int) -> None:
        base = K * (i % groups)
        gu = torch.nn.functional.linear(x, w13[base : base + K].reshape(-1, H))  # [1, 6*2I]
        gu = gu.view(K, 2, INTER)
        torch.mul(torch.nn.functional.silu(gu[:, 0]), gu[:, 1], out=h.view(K, INTER))
        torch.bmm(h, w2[base : base + K].transpose(1, 2), out=y)

    emit("cublas gemv + bmm (+ silu)", graph_us(cublas, args.calls, args.repeats))
    dst = torch.empty(K, 3 * H * INTER, device="cuda", dtype=torch.float16)

    def copy(i: int) -> None:
        base = K * (i % groups)
        dst[:, : 2 * H * INTER].copy_(w13[base : base + K].reshape(K, -1))
        dst[:, 2 * H * INTER :].copy_(w2[base : base + K].reshape(K, -1))

    emit("device copy of the weights (read + write)", graph_us(copy, args.calls, args.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

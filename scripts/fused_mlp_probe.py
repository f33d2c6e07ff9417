"""The fused per-pair expert MLP against the two-launch per-pair path, at DeepSeek-V2-Lite's shapes.

Times, inside a CUDA graph of ``--calls`` launches each on six other experts (so no launch
finds its weights in L2), one routed layer of ``--rows`` rows: the shipped per-pair
``grouped_moe_fp16`` (gate_up then down) and ``fused_expert_mlp_triton`` for each
``--configs`` entry (``block_i/block_k/block_h/warps/stages[/reduce_block]``), with and
without its slices' sum. Checks on the GPU that each config's rows are bit-equal to the same
rows computed alone (batch invariance) and prints the largest difference from the shipped
path (another summation order, so closeness only).

    source scripts/gpu-env.sh && python3 scripts/fused_mlp_probe.py --out /tmp/fused.jsonl
"""

from __future__ import annotations

import argparse

import torch
from routed_layer_probe import INTER, LAYER_BYTES, E, H, K, graph_us, json_lines

import specter_kernels as sk
from specter_kernels import fused_expert_mlp_triton as fm
from specter_kernels.fused_expert_mlp_triton import FusedMLPConfig


def parse_config(text: str) -> FusedMLPConfig:
    parts = [int(p) for p in text.split("/")]
    block_i, block_k, block_h, warps, stages = parts[:5]
    reduce_block = parts[5] if len(parts) > 5 else 256
    return FusedMLPConfig(16, block_i, block_k, block_h, warps, stages, reduce_block)


def measure(rows: int, args: argparse.Namespace, experts: tuple, write) -> None:
    """One row count: the shipped path, then each config (see the module)."""
    w13, w2, every, slots = experts
    groups = E // K
    x = (torch.randn(rows, H, device="cuda") * 0.5).half()
    weights = torch.rand(rows, K, device="cuda")
    ids = []
    for i in range(args.calls):
        g = torch.Generator().manual_seed(i)
        ids.append(
            torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(rows)]).int().cuda()
            if rows > 1
            else (torch.arange(K).view(1, K) + K * (i % groups)).int().cuda()
        )
    outs = [torch.zeros(rows, K, H, device="cuda") for _ in range(args.calls)]

    def shipped(i: int) -> None:
        sk.grouped_moe_fp16(x, ids[i], weights, w13, w2, slots, every, outs[i])

    us = graph_us(shipped, args.calls, args.repeats)
    distinct = sum(len(set(t.view(-1).tolist())) for t in ids) / len(ids)
    layer_bytes = LAYER_BYTES / K * distinct
    write({"arm": "per-pair shipped", "rows": rows, "us_per_layer": round(us, 2),
           "weights_tb_per_s": round(layer_bytes / us / 1e6, 3)})  # fmt: skip
    expected = [o.clone() for o in outs]
    for text in (t for t in args.configs.split(",") if t):
        config = parse_config(text)

        def fused(i: int, config=config) -> None:
            fm.launch_fused_per_pair(
                x, ids[i], weights, w13, w2, slots, every, outs[i], config=config
            )

        try:
            us = graph_us(fused, args.calls, args.repeats)
        except Exception as e:  # a config the compiler refuses
            write({"arm": f"fused {text}", "rows": rows, "error": repr(e)[:300]})
            continue
        diff = max(
            float((o - e).abs().max() / e.abs().max().clamp_min(1e-12))
            for o, e in zip(outs, expected, strict=True)
        )
        together = torch.zeros(rows, K, H, device="cuda")
        fm.launch_fused_per_pair(x, ids[0], weights, w13, w2, slots, every, together,
                                 config=config)  # fmt: skip
        invariant = True
        for t in range(rows):
            alone = torch.zeros(1, K, H, device="cuda")
            fm.launch_fused_per_pair(
                x[t : t + 1], ids[0][t : t + 1], weights[t : t + 1], w13, w2, slots,
                every, alone, config=config,
            )  # fmt: skip
            invariant &= torch.equal(alone[0], together[t])
        write({"arm": f"fused {text}", "rows": rows, "us_per_layer": round(us, 2),
               "weights_tb_per_s": round(layer_bytes / us / 1e6, 3),
               "max_rel_diff": diff, "batch_invariant": invariant})  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        default="64/128/128/4/3,64/64/128/4/4,32/128/128/4/4,64/128/64/4/3,128/64/64/8/3,"
        "64/128/128/8/3,64/128/256/4/3,32/128/256/4/3,64/128/128/4/3/512,64/128/128/4/3/128",
    )
    p.add_argument("--rows", default="1,3")
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(E, H, INTER, device="cuda") * 0.02).half()
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    slots = torch.arange(E, device="cuda", dtype=torch.int32)
    write = json_lines(args.out)
    weights_ = (w13, w2, every, slots)
    for rows in (int(r) for r in args.rows.split(",")):
        measure(rows, args, weights_, write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

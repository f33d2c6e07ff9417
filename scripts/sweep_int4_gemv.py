"""Sweep the W4A16 gemv path's tiles and inner-loop math at decode sizes on one CUDA GPU.

The draft's routed experts at T = 1 run the gemv path (``w4a16_triton.launch_gemv``): one
gate_up launch, one down launch. This times one MoE layer (both launches) inside a CUDA graph
of 8 calls rotating 4 weight sets and 4 inputs (``bench_kernels.time_graph``), varying one
projection's ``GemvConfig`` at a time with the other at its default, for ``math`` 0
(dequantize to fp16, widen, fp32 FMAs) and 3 (packed f16x2 products, ``int4_word_dot8``).
Then it times the best gate_up with the best down together against the defaults.

    source scripts/gpu-env.sh
    python3 scripts/sweep_int4_gemv.py --out "$OUT/int4-gemv-sweep.jsonl"

Not a test: it times things. Prints one line per config and a summary per model.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from bench_kernels import MODELS, NUM_SETS, make_inputs, make_weights, rel_err, time_graph

import specter_kernels as sk
from specter_kernels.moe import w4a16_configs, w4a16_triton
from specter_kernels.moe.w4a16_triton import GemvConfig


def gate_up_grid() -> list[GemvConfig]:
    grid = [GemvConfig(32, 256, 1, 4, 2, 0)]  # the tiles before the twenty-first session
    for math in (0, 3):
        grid += [
            GemvConfig(16, 512, 1, 4, 3, math),
            GemvConfig(16, 256, 1, 4, 2, math),
            GemvConfig(16, 1024, 1, 4, 3, math),
            GemvConfig(16, 512, 1, 2, 3, math),
            GemvConfig(16, 512, 1, 8, 3, math),
            GemvConfig(16, 512, 2, 4, 3, math),
            GemvConfig(32, 256, 1, 8, 3, math),
        ]
    return grid


def down_grid(inter: int) -> list[GemvConfig]:
    split = min(4, -(-inter // 128))
    grid = [GemvConfig(64, 128, split, 4, 2, 0)]  # the tiles before the twenty-first session
    for math in (0, 3):
        grid += [
            GemvConfig(32, 128, split, 4, 2, math),
            GemvConfig(16, 128, split, 4, 2, math),
            GemvConfig(16, 128, 8, 4, 2, math),
            GemvConfig(32, 128, split, 2, 2, math),
            GemvConfig(32, 64, 8, 4, 2, math),
            GemvConfig(32, 256, 2, 4, 2, math),
        ]
    return grid


def layer_us(sets, inputs, ref, gu: GemvConfig, dn: GemvConfig) -> tuple[float, float]:
    """(median microseconds per MoE layer, relative error against the reference)."""
    fns = [
        lambda ws=ws, i=i: w4a16_triton.launch_gemv(i.x, i.ids, i.weights, ws.w13, ws.w2, gu, dn)
        for ws, i in zip(sets, inputs, strict=True)
    ]
    err = rel_err(fns[0](), ref)
    return time_graph(fns), err


def sweep_model(name: str, T: int, out) -> None:
    """Every config of both grids, then the best pair against the defaults, twice."""
    shape = MODELS[name]
    H, inter, k = shape.hidden, shape.intermediate, shape.top_k
    sets = [make_weights(shape, seed) for seed in range(NUM_SETS)]
    inputs = [make_inputs(shape, T, 500 + i) for i in range(NUM_SETS)]
    ref = sk.fused_moe_w4a16_reference(
        inputs[0].x, inputs[0].ids, inputs[0].weights, sets[0].w13, sets[0].w2
    )
    d_gu, d_dn = w4a16_configs.gemv_configs(inputs[0].x.device, T, k, H, inter)
    best = {}
    for varied, grid in (("gate_up", gate_up_grid()), ("down", down_grid(inter))):
        rows = []
        for cfg in grid:
            gu, dn = (cfg, d_dn) if varied == "gate_up" else (d_gu, cfg)
            try:
                us, err = layer_us(sets, inputs, ref, gu, dn)
            except Exception as error:  # a config may not compile: say so, go on
                print(f"{name} T={T} {varied} {cfg}: {type(error).__name__} {error}")
                continue
            rows.append((us, cfg))
            rec = {"model": name, "T": T, "varied": varied, "config": cfg.__dict__}
            rec.update({"us": round(us, 2), "rel_err": err})
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"{name} T={T} {varied:7s} {cfg} {us:7.2f} us err {err:.1e}", flush=True)
        rows.sort(key=lambda r: r[0])
        best[varied] = rows[0][1]
        print(f"== {name} T={T} {varied}: best {rows[0][0]:.2f} us {rows[0][1]}")
    pairs = [("default", d_gu, d_dn), ("best", best["gate_up"], best["down"])]
    for label, gu, dn in pairs + pairs:
        us, err = layer_us(sets, inputs, ref, gu, dn)
        rec = {"model": name, "T": T, "varied": f"layer-{label}", "us": round(us, 2)}
        rec.update({"gate_up": gu.__dict__, "down": dn.__dict__, "rel_err": err})
        out.write(json.dumps(rec) + "\n")
        print(f"== {name} T={T} layer {label}: {us:.2f} us err {err:.1e}", flush=True)
    del sets, inputs
    torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON lines file")
    p.add_argument("--models", default="deepseek-v2-lite,phi-3.5-moe")
    p.add_argument("--tokens", default="1")
    args = p.parse_args()
    t0 = time.perf_counter()
    with open(args.out, "a") as out:
        for name in args.models.split(","):
            for T in [int(t) for t in args.tokens.split(",")]:
                sweep_model(name, T, out)
            print(f"{name} done at {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

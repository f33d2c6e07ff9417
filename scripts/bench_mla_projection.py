"""Time DeepSeek-V2-Lite's absorbed attention block on the GPU, its value projection apart
(the merge kernel, then the invariant ``bmm`` with ``W_UV``) and inside the merge kernel
(``mla_attention(..., w_uv)``), with the query absorption (the invariant ``bmm`` with
``W_UK``) and the parts alone beside them.

Each figure is microseconds per layer: 27 calls over 27 layers' own weights and caches
(so they come from HBM, as in a step) captured in one CUDA graph and replayed. ``--splits``
names the key chunk of each pass.

    source scripts/gpu-env.sh && python3 scripts/bench_mla_projection.py --out $OUT/mla-uv.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from bench_kernels import time_graph  # a sibling script (scripts/ is on sys.path)

import specter_kernels as sk
from specter_kernels.attention import mla_attention_triton as kernel

H, NOPE, ROPE, V, R, LAYERS = 16, 128, 64, 128, 512, 27


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, device="cuda", generator=gen)).half()


def point(gen: torch.Generator, weights: list, L: int, T: int, tag: dict) -> list[dict]:
    """The records of one cache length ``L`` and row count ``T``."""
    caches = [(randn(gen, L, R), randn(gen, L, ROPE)) for _ in range(LAYERS)]
    q = [randn(gen, 1, T, H, NOPE + ROPE).transpose(1, 2)[0] for _ in range(LAYERS)]
    o_lat = [randn(gen, H, T, R, scale=0.1) for _ in range(LAYERS)]

    def w_uk(i):
        return sk.invariant_bmm(q[i][..., :NOPE], weights[i][:, :NOPE])

    def attention(i, lat=None, w_uv=None):
        c, k = caches[i]
        lat = o_lat[i] if lat is None else lat
        return sk.mla_attention(lat, q[i][..., NOPE:], c, k, 0.1, None, w_uv)

    def w_uv_bmm(i, o=None):
        o = o_lat[i] if o is None else o
        return sk.invariant_bmm(o, weights[i][:, NOPE:].transpose(1, 2)).transpose(0, 1)

    def apart(i):
        return w_uv_bmm(i, attention(i, w_uk(i)))

    def fused(i):
        return attention(i, w_uk(i), weights[i][:, NOPE:])

    diff = float((apart(0).float() - fused(0).float()).abs().max() / apart(0).float().abs().max())
    records = []
    for name, fn in (
        ("w_uk_bmm", w_uk),
        ("attention", attention),
        ("attention_w_uv", lambda i: attention(i, w_uv=weights[i][:, NOPE:])),
        ("w_uv_bmm", w_uv_bmm),
        ("block_apart", apart),
        ("block_fused", fused),
    ):
        us = time_graph([functools.partial(fn, i) for i in range(LAYERS)], reps=LAYERS)
        records.append({"L": L, "T": T, "part": name, "us": us, "rel_diff": diff, **tag})
        print(json.dumps(records[-1]), flush=True)
    return records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="264,1100")
    p.add_argument("--rows", default="1,5")
    p.add_argument("--splits", default=f"{kernel.SPLIT}")
    p.add_argument("--out", default="mla-uv.jsonl")
    args = p.parse_args()
    gen = torch.Generator("cuda").manual_seed(0)
    weights = [
        randn(gen, H * (NOPE + V), R, scale=0.03).view(H, NOPE + V, R) for _ in range(LAYERS)
    ]
    records = []
    shipped = kernel.SPLIT
    for split in (int(v) for v in args.splits.split(",")):
        kernel.SPLIT = split
        tag = {"split": split}
        for L in (int(v) for v in args.lengths.split(",")):
            for T in (int(v) for v in args.rows.split(",")):
                records += point(gen, weights, L, T, tag)
    kernel.SPLIT = shipped
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

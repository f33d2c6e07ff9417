"""The small kernels on a decode step's critical path, timed alone: the router, the argmax.

Each arm is captured ``--calls`` times in one CUDA graph (the router on a new weight each
call, like successive layers) and timed over ``--repeats`` replays (median microseconds a
call):

* DeepSeek-V2-Lite's router (64 experts, top-6, fp32 logits, one launch) and Qwen1.5-MoE's
  (60, top-4, renormalised); with ``SPECTER_ROUTER_RANK_SELECT`` known to the router module
  (the thirty-fifth session's selection by place, measured and removed), both selections;
* the greedy argmax of one row of DeepSeek-V2-Lite's (102400) and Qwen's (151936) logits:
  specter-kernels' ``argmax_last_dim`` against ``torch.argmax``.

Set ``SPECTER_KERNELS_PDL=0`` for each launch's own time with its launch gap.

    source scripts/gpu-env.sh && python3 scripts/decode_glue_probe.py --out /tmp/glue.jsonl
"""

from __future__ import annotations

import argparse

import torch
from routed_layer_probe import graph_us, json_lines  # this folder: the same timing

import specter_kernels as sk
from specter_kernels.moe import router_topk_triton


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=26)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    torch.manual_seed(0)
    emit = json_lines(args.out)

    routers = {
        "deepseek-v2-lite": (64, 6, {"logits_dtype": torch.float32, "scaling": 1.0,
                                     "weights_dtype": torch.float32}),
        "qwen1.5-moe": (60, 4, {"logits_dtype": torch.float16, "renormalize": True,
                                "weights_dtype": torch.float16}),
    }  # fmt: skip
    for model, (E, k, kwargs) in routers.items():
        x = torch.randn(1, 2048, device="cuda").half()
        weights = [(0.02 * torch.randn(E, 2048, device="cuda")).half()
                   for _ in range(args.calls)]  # fmt: skip
        for rank in (True, False) if hasattr(router_topk_triton, "RANK_SELECT") else (None,):
            if rank is not None:
                router_topk_triton.RANK_SELECT = rank

            def route(i, x=x, w=weights, k=k, kw=kwargs):
                return sk.router_topk(x, w[i], k, **kw)

            us = graph_us(route, args.calls, args.repeats)
            emit({"arm": "router", "model": model,
                  "select": "rounds" if not rank else "place", "us": round(us, 2)})  # fmt: skip
    for model, V in (("deepseek-v2-lite", 102400), ("qwen1.5-moe", 151936)):
        logits = [torch.randn(1, V, device="cuda").half() for _ in range(args.calls)]
        for name, fn in (("argmax_last_dim", sk.argmax_last_dim),
                         ("torch.argmax", lambda t: t.argmax(dim=-1))):  # fmt: skip
            us = graph_us(lambda i, fn=fn, rows=logits: fn(rows[i]), args.calls, args.repeats)
            same = all(torch.equal(sk.argmax_last_dim(t), t.argmax(dim=-1)) for t in logits)
            emit({"arm": "argmax", "model": model, "kernel": name, "us": round(us, 2),
                  "equal": same})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

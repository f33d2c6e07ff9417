"""Time decode steps of a full-size preset eagerly and as CUDA graphs, side by side.

Four loads of the model, one JSON line per measurement to ``--out``:

1. every expert resident (so the target's steps can be graphed whole): the median wall
   time (synchronised) of the draft's one-row step and the target's steps of 1 and K+1
   rows, eagerly (``cuda_graphs`` off) and replayed; then plain and speculative decoding
   with graphs, checking the tokens agree;
2. the same resident model with one fusion off at a time, replayed: without the fused
   RMSNorm (``fused_norms=False``), the fused rotary embedding (``fused_rotary=False``),
   the fused routers (``fused_routers=False``), the absorbed MLA attention
   (``absorbed_mla=False``) and the fused gate/up MLPs (``fused_mlp=False``): what each
   saves per step, with each step's kernel count (``--kernels``);
3. at ``--budget-gb`` (default 24): the target's steps eagerly and as piecewise graphs
   (``piecewise_graphs=True``: graphs between the eager routed-expert calls), with the
   experts of the repeated rows resident after the first call (compute, not transfers),
   and plain decoding with and without piecewise graphs, checking the tokens agree.

    source scripts/gpu-env.sh && python3 scripts/gpu_step_graphs.py --model deepseek-v2-lite \\
        --out $OUT/step-graphs.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specter_models
from specter_bench.model_loading import release_memory
from specter_spec import SpecController


def step_ms(adapter, ids: torch.Tensor, start: int, repeats: int) -> float:
    """Median ms of ``adapter.forward(ids, start)`` (the cache is cropped to ``start``)."""
    times = []
    for _ in range(repeats):
        adapter.truncate(start)
        torch.cuda.synchronize()
        t = time.perf_counter()
        adapter.forward(ids, start)
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def kernel_summary(prof, label: str, steps: int) -> str:
    """``"<label>: N kernels, T ms summed device time (U us per kernel)"`` per step of a
    torch.profiler capture of ``steps`` steps (CUDA kernel events only)."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    count = len(kernels) / steps
    total_us = sum(e.time_range.elapsed_us() for e in kernels) / steps
    return (
        f"{label}: {count:.0f} kernels, {total_us / 1e3:.3f} ms summed device time "
        f"({total_us / max(count, 1):.2f} us per kernel)"
    )


def add_draft_linears_argument(p: argparse.ArgumentParser) -> None:
    """``--draft-linears default|invariant|cublas`` (and its earlier spelling
    ``--invariant-draft-linears``): how a loaded model's draft runs its linears."""
    p.add_argument(
        "--draft-linears",
        choices=("default", "invariant", "cublas"),
        default="default",
        help="the draft's linears: the library's default (the invariant GEMV on CUDA), the "
        "invariant kernel, or torch's (load(invariant_draft_linears=))",
    )
    p.add_argument(
        "--invariant-draft-linears", dest="draft_linears", action="store_const", const="invariant"
    )


def draft_linears_value(args: argparse.Namespace) -> bool | None:
    """``load(invariant_draft_linears=)`` for :func:`add_draft_linears_argument`'s choice."""
    return {"default": None, "invariant": True, "cublas": False}[args.draft_linears]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--budget-gb", type=float, default=24.0)
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated parts to skip: eager,fused,rotary,routers,mla,mlp,budget",
    )
    p.add_argument("--prompt-len", type=int, default=200, help="prompt tokens before the steps")
    p.add_argument(
        "--kernels", action="store_true", help="count each step's kernels (torch.profiler)"
    )
    add_draft_linears_argument(p)
    p.add_argument(
        "--shared-overlap",
        choices=("on", "off"),
        default="on",
        help="the shared experts on a side stream (load(shared_overlap=))",
    )
    p.add_argument("--tag", default=None, help="a label added to every record")
    p.add_argument("--out", default="step-graphs.jsonl")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    records = []

    def emit(**record) -> None:
        record["model"] = args.model
        if args.tag:
            record["tag"] = args.tag
        records.append(record)
        print(json.dumps(record), flush=True)
        with open(args.out, "w") as f:  # rewritten each time: a cut run keeps what it has
            f.writelines(json.dumps(r) + "\n" for r in records)

    max_seq_len = max(1024, args.prompt_len + 2 * args.tokens + 64)

    def load(**kwargs):
        t = time.perf_counter()
        lm = specter_models.load(
            args.model,
            device="cuda",
            max_seq_len=max_seq_len,
            invariant_draft_linears=draft_linears_value(args),
            shared_overlap=args.shared_overlap == "on",
            **kwargs,
        )
        print(f"built {lm!r} {kwargs} in {time.perf_counter() - t:.1f} s", flush=True)
        return lm

    prompt = torch.arange(3, 3 + args.prompt_len, device="cuda").unsqueeze(0)
    start = prompt.shape[1]
    token = torch.ones(1, 1, dtype=torch.long, device="cuda")
    rows = torch.ones(1, args.depth + 1, dtype=torch.long, device="cuda")

    def time_steps(lm, label: dict, roles) -> None:
        lm.reset()
        lm.target.forward(prompt, 0)
        for role, ids in roles:
            adapter = getattr(lm, role)
            step_ms(adapter, ids, start, 3)  # warm-up: compiled, captured, experts loaded
            ms = step_ms(adapter, ids, start, 20)
            extra = {}
            if args.kernels:  # counted eagerly: a replayed graph is one launch to the profiler
                graphs, lm.cuda_graphs = lm.cuda_graphs, False
                step_ms(adapter, ids, start, 1)
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]
                ) as prof:
                    step_ms(adapter, ids, start, 3)
                lm.cuda_graphs = graphs
                extra["kernels"] = kernel_summary(prof, "eager step", 3)
            emit(kind="step", role=role, rows=ids.shape[1], ms=ms, **label, **extra)
        emit(kind="graph_stats", stats=lm.graph_stats(), **label)

    def decode(lm, depth: int, label: dict) -> list[int]:
        ids = prompt[0].tolist()
        for _ in range(2):  # the first decode captures what the second replays
            lm.reset()
            controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
            t = time.perf_counter()
            result = controller.generate(ids, args.tokens)
            seconds = time.perf_counter() - t
        # ms_per_token: the whole generate (its eager prefill included) per token, as before;
        # tpot_ms: the decode alone, as the bench reports it.
        emit(
            kind="decode", depth=depth, tokens=len(result.tokens),
            ms_per_token=1e3 * seconds / len(result.tokens),
            tpot_ms=1e3 * result.stats.tpot_s,
            prefill_ms=1e3 * result.stats.prefill_time_s,
            acceptance=result.stats.acceptance_rate if depth else None,
            graph_stats=lm.graph_stats(), **label,
        )  # fmt: skip
        return result.tokens

    all_roles = [("draft", token), ("target", token), ("target", rows)]
    lm = load()
    for graphs in (False, True) if "eager" not in skip else (True,):
        lm.cuda_graphs = graphs
        time_steps(lm, {"budget_gb": None, "cuda_graphs": graphs, "fused_norms": True}, all_roles)
    lm.cuda_graphs = True
    label = {"budget_gb": None, "cuda_graphs": True, "fused_norms": True}
    plain, spec = decode(lm, 0, label), decode(lm, args.depth, label)
    emit(kind="decode_equal", equal=plain == spec, **label)
    del lm
    release_memory()  # the next load reuses the pinned host blocks

    switches = (
        ("fused", "fused_norms"),
        ("rotary", "fused_rotary"),
        ("routers", "fused_routers"),
        ("mla", "absorbed_mla"),
        ("mlp", "fused_mlp"),
    )
    for part, switch in switches:
        if part in skip:
            continue
        lm = load(**{switch: False})  # one fusion off, the rest as by default
        time_steps(lm, {"budget_gb": None, "cuda_graphs": True, switch: False}, all_roles)
        del lm
        release_memory()

    if "budget" not in skip:
        lm = load(gpu_memory_gb=args.budget_gb, piecewise_graphs=True)
        tokens = {}
        for piecewise in (False, True):
            if piecewise:
                lm.enable_step_graphs(piecewise=True)
            else:
                lm.disable_step_graphs()
            label = {"budget_gb": args.budget_gb, "cuda_graphs": piecewise, "piecewise": piecewise}
            time_steps(lm, label, [("target", token), ("target", rows)])
            tokens[piecewise] = decode(lm, 0, label)
        emit(kind="decode_equal", equal=tokens[False] == tokens[True], budget_gb=args.budget_gb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

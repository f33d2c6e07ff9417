"""Where a streamed plain decode step's time goes: device busy time against wall time.

Loads a preset without a draft at ``--budget-gb`` on the streamed miss path with fills (the
bench's ``specter-plain-fill``), captures its one-row graphs, decodes a HumanEval prompt
plainly once to warm and once timed (TPOT), then ``--profiled`` tokens under torch.profiler.
Each profiled number is the difference between a profiled decode of ``1 + --profiled``
tokens and one of 1 token, per token, so the prompt's prefill (and its expert loads) is in
neither: the wall time, the time some kernel ran (the union of kernel intervals, so
side-stream overlap counts once), the copy engine's time, and the kernels with the most
device time; each kind of copy's device time and count, and the
host's CUDA runtime calls with the most time (where it waits: event and stream syncs, copies
from pageable memory). Where busy time is far below the wall time, the
host bounds the step; where it is near, the kernels do. ``--budget-gb 0`` loads every
expert resident (the same decode, nothing streamed), for comparison.

    source scripts/gpu-env.sh && python3 scripts/plain_step_probe.py --model qwen1.5-moe \\
        --budget-gb 14 --out /tmp/plain-step.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e3  # profiler times are in microseconds


def _sequence(spans: list[tuple[float, float, str]], calls: dict[str, float]) -> list[list]:
    """One token's kernels in launch order as ``[name, median us, median gap us]``.

    Tokens are cut at a kernel launched once a token (``calls``: per-token call counts); of
    the last 5 whole tokens before the final one, those of the most common length are
    aligned by position; each position's median duration and idle gap before it.
    """
    once = [n for n, c in calls.items() if abs(c - 1.0) < 1e-9]
    if not once:
        return []
    starts = [i for i, s in enumerate(spans) if s[2] == once[0][:48]]
    tokens = [spans[max(i - 1, 0) : j] for i, j in zip(starts[-7:-2], starts[-6:-1], strict=True)]
    if not tokens:
        return []
    common = max({len(t) for t in tokens}, key=[len(t) for t in tokens].count)
    tokens = [t for t in tokens if len(t) == common]  # each with the kernel before it first
    out = []
    for j in range(1, common):
        durs = sorted(t[j][1] - t[j][0] for t in tokens)
        gaps = sorted(t[j][0] - t[j - 1][1] for t in tokens)
        mid = len(tokens) // 2
        out.append([tokens[-1][j][2], round(durs[mid], 2), round(gaps[mid], 2)])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen1.5-moe")
    p.add_argument("--budget-gb", type=float, default=14.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--profiled", type=int, default=16)
    p.add_argument("--fills", type=int, default=8)
    p.add_argument("--top", type=int, default=14)
    p.add_argument(
        "--no-pipelined",
        action="store_true",
        help="count each step before the next launches (default: pipelined records, as "
        "`specter generate` and `specter-plain-pipe` decode)",
    )
    p.add_argument(
        "--sequence",
        action="store_true",
        help="also record one token's kernels in launch order: each kernel's name, its median "
        "duration over the last 4 profiled tokens and the idle gap before it (us); with "
        "SPECTER_KERNELS_PDL=0 the durations are each kernel's own, with PDL they include "
        "the wait for the kernel before",
    )
    p.add_argument("--out", default=None, help="append one JSON line here")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (no graphs, no device)")
    args = p.parse_args()
    cuda = args.device == "cuda"

    import specter_models
    from specter_bench.engine_systems import DecodeWindow
    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval
    from specter_spec import SpecController

    budget = args.budget_gb or None
    lm = specter_models.load(
        args.model,
        device=args.device,
        max_seq_len=1024,
        gpu_memory_gb=budget,
        draft=None,
        miss_path="stream" if budget else "load",
        stream_fills=args.fills if budget else 0,
    )
    vocab = lm.model.config.vocab_size
    prompt = encode_prompt(
        load_humaneval(1)[0].text, ByteTokenizer(vocab_size=vocab), vocab_size=vocab
    )
    if not budget:
        lm.prefetch_all()
    if cuda:
        lm.capture_step_graphs(min_length=len(prompt), max_rows=1)
    record = lm.runtime.stream_record
    if budget and record is not None and record.deferred:
        record.pipelined = not args.no_pipelined
    window = DecodeWindow(lm.cache, None, streamed_plain=bool(budget))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def decode(tokens: int):
        lm.reset()
        return SpecController(None, lm.target, cache=window, depth=0).generate(prompt, tokens)

    decode(args.tokens)  # warm: compile, fill the cache
    started = time.perf_counter()
    out = decode(args.tokens)
    wall_s = time.perf_counter() - started
    tpot_ms = 1e3 * out.stats.tpot_s
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def profiled(tokens: int) -> dict[str, object]:
        """Totals of one profiled decode of ``tokens`` new tokens (its prefill included)."""
        sync()
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            decode(tokens)
            sync()
            wall_ms = 1e3 * (time.perf_counter() - t0)
        kernels, copies = [], []
        sums: dict[str, collections.Counter] = {
            k: collections.Counter() for k in ("kernel_ms", "kernel_calls", "copy_ms",
                                               "copy_calls", "runtime_ms", "runtime_calls")
        }  # fmt: skip
        for ev in prof.events():
            span = (ev.time_range.start, ev.time_range.end)
            ms = (span[1] - span[0]) / 1e3
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                if ev.name.startswith("cuda"):  # runtime calls: where the host waits
                    sums["runtime_ms"][ev.name[:60]] += ms
                    sums["runtime_calls"][ev.name[:60]] += 1
                continue
            if "Memcpy" in ev.name or "memcpy" in ev.name:
                copies.append(span)
                sums["copy_ms"][ev.name[:80]] += ms
                sums["copy_calls"][ev.name[:80]] += 1
            else:
                kernels.append(span)
                sums["kernel_ms"][ev.name[:80]] += ms
                sums["kernel_calls"][ev.name[:80]] += 1
        spans = sorted(
            (ev.time_range.start, ev.time_range.end, ev.name[:48])
            for ev in prof.events()
            if ev.device_type == torch.autograd.DeviceType.CUDA
            and "emcpy" not in ev.name
            and "emset" not in ev.name
        )
        return {
            "spans": spans,
            "wall_ms": wall_ms,
            "kernel_busy_ms": _union_ms(kernels),
            "copy_busy_ms": _union_ms(copies),
            "kernels": len(kernels),
            **sums,
        }

    # The prefill (and its loads) is in both runs; their difference is decode steps alone.
    base, full = profiled(1), profiled(1 + args.profiled)
    steps = args.profiled

    def per_token(key: str, top: int | None = None) -> dict[str, float]:
        diff = {n: (full[key][n] - base[key].get(n, 0)) / steps for n in full[key]}
        ranked = sorted(diff.items(), key=lambda kv: -kv[1])
        return {n: round(v, 4) for n, v in ranked[:top]}

    cache = lm.cache.stats()["total"]
    result = {
        "model": args.model,
        "budget_gb": budget,
        "tpot_ms": tpot_ms,
        "decode_wall_s": wall_s,
        "slots_per_layer": lm.memory.plan.slots_per_layer,
        "pipelined_records": bool(getattr(record, "pipelined", False)),
        "hit_rate": cache["hit_rate"],
        "profiled_tokens": steps,
        "profiled_wall_ms_per_token": (full["wall_ms"] - base["wall_ms"]) / steps,
        "kernel_busy_ms_per_token": (full["kernel_busy_ms"] - base["kernel_busy_ms"]) / steps,
        "copy_busy_ms_per_token": (full["copy_busy_ms"] - base["copy_busy_ms"]) / steps,
        "kernels_per_token": (full["kernels"] - base["kernels"]) / steps,
        "top_kernels_ms_per_token": per_token("kernel_ms", args.top),
        "top_kernel_calls_per_token": per_token("kernel_calls", args.top),
        "copies_ms_per_token": per_token("copy_ms"),
        "copies_per_token": per_token("copy_calls"),
        "runtime_ms_per_token": per_token("runtime_ms", args.top),
        "runtime_calls_per_token": per_token("runtime_calls", args.top),
    }
    if args.sequence:
        result["sequence"] = _sequence(full["spans"], per_token("kernel_calls"))
    print(json.dumps({k: v for k, v in result.items() if k != "sequence"}, indent=1))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

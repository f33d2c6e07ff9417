"""How busy the PCIe link and the SMs are over a budgeted speculative decode, per phase.

Loads a preset at ``--budget-gb`` (with the pinned hot set of a ``specter bench`` results
file, ``--hot-experts``) on the streamed miss path, captures its graphs, decodes one
HumanEval prompt at fixed depth ``--depth`` once to warm, then once under torch.profiler.
From the device events it prints, for the whole decode and for each phase (draft,
verify, the rest), in ms: the phase's wall span on the device, the time some kernel ran,
the time some host-to-device copy ran (the copy engine; streamed reads run inside
kernels), the time both ran and the time neither did. A phase is the device time from a
forward's first marker kernel (``torch.cuda._sleep``, launched before each draft and target
forward) to the next forward's: its kernels, then the host work before the next launch.

    source scripts/gpu-env.sh && python3 scripts/timeline_probe.py --hot-experts \\
        benchmarks/results/bench-deepseek-v2-lite-2026-12-01-batched-prefetch-24gb.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable

import torch

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals: list[Interval], window: Interval) -> list[Interval]:
    return intersect(intervals, [window])


def busy(kernels: list[Interval], copies: list[Interval], window: Interval) -> dict[str, float]:
    """Kernel, copy, both and idle time (ms) inside ``window`` (us in, ms out)."""
    k, c = clip(kernels, window), clip(copies, window)
    both = length(intersect(k, c))
    span = window[1] - window[0]
    return {
        "span_ms": span / 1e3,
        "kernel_ms": length(k) / 1e3,
        "copy_ms": length(c) / 1e3,
        "both_ms": both / 1e3,
        "idle_ms": (span - length(k) - length(c) + both) / 1e3,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--budget-gb", type=float, default=24.0)
    p.add_argument("--hot-experts", default=None)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--humaneval", type=int, default=0)
    p.add_argument("--out", default=None, help="append one JSON line here")
    args = p.parse_args()

    import specter_models
    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval
    from specter_spec import SpecController

    hot = None
    if args.hot_experts:
        from specter_bench.hot_sets import read_hot_experts

        hot = read_hot_experts(args.hot_experts, args.budget_gb)
    lm = specter_models.load(
        args.model,
        device="cuda",
        max_seq_len=1024,
        gpu_memory_gb=args.budget_gb,
        hot_experts=hot,
        miss_path="stream",
    )
    print(f"built {lm!r}; captured {lm.capture_step_graphs(1024)}", flush=True)
    vocab = lm.model.config.vocab_size
    prompt = load_humaneval(args.humaneval + 1)[args.humaneval]
    ids = encode_prompt(prompt.text, ByteTokenizer(vocab_size=vocab), vocab_size=vocab)

    # Each forward is bracketed by a tiny marker kernel on the compute stream: the device
    # time from one call's first marker to the next call's is that call's phase (its
    # kernels, then the host work before the next launch).
    calls: list[str] = []
    for role, name in ((lm.draft, "draft"), (lm.target, "verify")):
        forward = role.forward

        def bracketed(input_ids, start_pos, _forward=forward, _name=name):
            calls.append("prefill" if input_ids.shape[1] > args.depth + 1 else _name)
            torch.cuda._sleep(8)
            logits = _forward(input_ids, start_pos)
            torch.cuda._sleep(8)
            return logits

        role.forward = bracketed

    def decode():
        lm.reset()
        controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=args.depth)
        return controller.generate(ids, args.tokens)

    decode()  # warm
    calls.clear()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        result = decode()
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    markers = sorted(e.time_range.start for e in device if "spin" in e.name)
    if len(markers) != 2 * len(calls):
        raise RuntimeError(f"{len(markers)} marker kernels for {len(calls)} forwards")
    copies = union((e.time_range.start, e.time_range.end) for e in device if "HtoD" in e.name)
    kernels = union(
        (e.time_range.start, e.time_range.end)
        for e in device
        if "Memcpy" not in e.name and "spin" not in e.name
    )
    begins = markers[0::2]
    ends = [*begins[1:], max(b for _, b in [*kernels, *copies])]
    record = {
        "model": args.model,
        "budget_gb": args.budget_gb,
        "depth": args.depth,
        "tpot_ms": 1e3 * result.stats.tpot_s,
        "iterations": result.stats.num_iterations,
    }
    keys = ("span_ms", "kernel_ms", "copy_ms", "both_ms", "idle_ms")
    for phase in ("draft", "verify"):
        parts = [
            busy(kernels, copies, (b, e))
            for name, b, e in zip(calls, begins, ends, strict=True)
            if name == phase
        ]
        record[phase] = {k: sum(part[k] for part in parts) for k in keys} | {"calls": len(parts)}
    decoding = (begins[calls.index("draft") if "draft" in calls else 0], ends[-1])
    record["decode"] = busy(kernels, copies, decoding)
    print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

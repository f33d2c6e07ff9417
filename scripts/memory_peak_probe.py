"""What is allocated on the GPU at a load's or a decode's peak, and where it was allocated.

Written for the bench's loads without a draft that peaked about 1 GB over their plan
(`lru` at DeepSeek-V2-Lite 24 GB, `spec-lru`'s decode): it found 33 cuBLAS workspaces of 32
MiB, one a piecewise capture's stream (fixed in the thirty-third session; docs/benchmarks.md).
This probe loads one system's engine in a fresh process (as the bench's stage would, its CUDA
graphs captured ahead), decodes one HumanEval prompt, and with torch's allocator history on
replays every allocation and free to find each phase's peak; it prints the bytes live then,
grouped by the innermost frames of this repository that allocated them, beside the memory
plan's parts.

    source scripts/gpu-env.sh && python3 scripts/memory_peak_probe.py --system lru \\
        --budget-gb 24 --out "$OUT/memory-peak.json"
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch

GB = 1e9
REPO_MARKERS = ("specter_", "scripts/")


def live_at_peak(events: Iterable[dict[str, Any]]) -> tuple[int, int, list[dict[str, Any]]]:
    """Replay allocator trace events (``alloc`` / ``free_completed``, each with ``addr`` and
    ``size``): ``(peak bytes, index of the event that reached it, the allocations live
    then)``. Bytes live before the first event (allocated before the history started) are
    not counted."""
    live: dict[int, dict[str, Any]] = {}
    total = peak = 0
    peak_at = -1
    peak_live: list[dict[str, Any]] = []
    for i, ev in enumerate(events):
        action = ev.get("action")
        if action == "alloc":
            live[ev["addr"]] = ev
            total += ev["size"]
            if total > peak:
                peak, peak_at = total, i
                peak_live = list(live.values())
        elif action in ("free_completed", "free") and ev["addr"] in live:
            total -= live.pop(ev["addr"])["size"]
    return peak, peak_at, peak_live


def by_site(allocations: Sequence[dict[str, Any]], top: int = 12) -> list[dict[str, Any]]:
    """Live allocations grouped by their innermost frame in this repository (else the
    innermost frame), largest total first."""
    sums: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for a in allocations:
        frames = a.get("frames") or []
        site = next(
            (f for f in frames if any(m in f.get("filename", "") for m in REPO_MARKERS)),
            frames[0] if frames else None,
        )
        key = f"{site['filename'].split('/')[-1]}:{site['line']} {site['name']}" if site else "?"
        sums[key][0] += a["size"]
        sums[key][1] += 1
    ranked = sorted(sums.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"site": k, "gb": v[0] / GB, "allocations": v[1]} for k, v in ranked]


def largest(allocations: Sequence[dict[str, Any]], top: int = 12, depth: int = 8) -> list[str]:
    """The ``top`` largest live allocations: size in MB and their innermost ``depth`` Python
    frames (file:line function), innermost first. The allocator's own C++ frames come first in
    a trace and say nothing of the caller (the thirty-third session's first listing held only
    those), so frames outside ``.py`` files are left out."""
    ranked = sorted(allocations, key=lambda a: -a["size"])[:top]
    return [
        f"{a['size'] / 1e6:.2f} MB <- "
        + " <- ".join(
            f"{f['filename'].split('/')[-1]}:{f.get('line')} {f.get('name')}"
            for f in [f for f in a.get("frames") or [] if f.get("filename", "").endswith(".py")][
                :depth
            ]
        )
        for a in ranked
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--budget-gb", type=float, default=24.0)
    p.add_argument("--system", default="lru")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt-index", type=int, default=0, help="which HumanEval prompt")
    p.add_argument("--max-seq-len", type=int, default=640)
    p.add_argument("--largest", type=int, default=12, help="largest live allocations listed")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("memory_peak_probe needs a CUDA device", file=sys.stderr)
        return 2

    from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
    from specter_bench.model_loading import load_engine
    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval

    system = ENGINE_SYSTEMS[args.system]
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    loaded = load_engine(
        args.model, budget_gb=args.budget_gb, with_draft=system.needs_draft,
        policy="predictive" if system.needs_draft else "lru", device="cuda",
        dtype=torch.float16, seed=0, max_seq_len=args.max_seq_len,
    )  # fmt: skip
    load_mark = len(torch.cuda.memory._snapshot()["device_traces"][0])
    if hasattr(loaded, "miss_path"):
        loaded.miss_path = system.miss_path
    loaded.capture_step_graphs(args.max_seq_len)
    capture_mark = len(torch.cuda.memory._snapshot()["device_traces"][0])
    vocab = loaded.model.config.vocab_size
    prompt = encode_prompt(
        load_humaneval(args.prompt_index + 1)[args.prompt_index].text,
        ByteTokenizer(vocab_size=vocab),
        vocab_size=vocab,
    )
    runner = EngineSystemRunner(loaded, system, "auto")
    runner.generate(prompt, args.tokens)
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    plan = loaded.memory.as_dict()["plan"]
    result: dict[str, Any] = {
        "model": args.model,
        "budget_gb": args.budget_gb,
        "system": args.system,
        "plan_gb": {k: v / GB for k, v in plan.items() if k.endswith("_bytes")},
        "max_allocated_gb": torch.cuda.max_memory_allocated() / GB,
    }
    for name, (lo, hi) in {
        "load": (0, load_mark),
        "load+capture": (0, capture_mark),
        "whole": (0, len(events)),
    }.items():
        peak, at, live = live_at_peak(events[lo:hi])
        result[name] = {
            "peak_gb": peak / GB,
            "event": at,
            "by_site": by_site(live),
            "largest": largest(live, args.largest),
        }
    result["graphs"] = loaded.graph_stats()
    target_graphs = getattr(loaded.target, "graphs", None)
    if target_graphs is not None:  # (rows bucket, window, whole) of each captured target graph
        result["target_keys"] = sorted({(k[0], k[1], k[3]) for k in target_graphs.stats.keys})
    result["max_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a resident step's device time goes, kernel by kernel: the draft (1 row) and the
target (1 and 5 rows) of a full-size preset, every expert resident, the current defaults.

For each step: the replayed CUDA graph's wall time (median of 20), then torch.profiler over
3 replays and over 3 eager steps. Each capture gives the kernels per step, their summed
device time and the busy time (the union of the kernels' intervals, so side-stream overlap is
not counted twice); wall minus busy is the device's idle time between kernels. The eager
capture's per-kernel table (name, calls per step, us per call, us per step) is printed too.

    source scripts/gpu-env.sh && python3 scripts/profile_steps.py --out /tmp/steps.jsonl
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import time

import torch
from gpu_step_graphs import (  # a sibling script (scripts/ is on sys.path)
    add_draft_linears_argument,
    draft_linears_value,
    step_ms,
)
from torch.profiler import ProfilerActivity, profile

import specter_models


def kernel_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def busy_us(events) -> float:
    """Microseconds covered by at least one of ``events`` (the union of their intervals)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, end = 0.0, None
    for s, e in spans:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def capture(adapter, ids, start: int, steps: int):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            adapter.truncate(start)
            adapter.forward(ids, start)
        torch.cuda.synchronize()
    return kernel_events(prof)


def per_step_busy(events, steps: int) -> float:
    """Busy us per step: events split into ``steps`` runs at the largest gaps."""
    spans = sorted(events, key=lambda e: e.time_range.start)
    if not spans:
        return 0.0
    gaps = (
        sorted(
            range(1, len(spans)),
            key=lambda i: spans[i].time_range.start - spans[i - 1].time_range.end,
        )[-(steps - 1) :]
        if steps > 1
        else []
    )
    cuts = [0, *sorted(gaps), len(spans)]
    return sum(busy_us(spans[a:b]) for a, b in itertools.pairwise(cuts)) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--rows", default="1,5", help="target step rows")
    p.add_argument("--top", type=int, default=30)
    add_draft_linears_argument(p)
    p.add_argument("--tag", default=None)
    p.add_argument("--out", default="profile-steps.jsonl")
    args = p.parse_args()
    t = time.perf_counter()
    lm = specter_models.load(
        args.model,
        device="cuda",
        max_seq_len=512,
        invariant_draft_linears=draft_linears_value(args),
    )
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    prompt = torch.arange(3, 203, device="cuda").unsqueeze(0)
    lm.target.forward(prompt, 0)
    start = prompt.shape[1]
    records = []
    roles = [("draft", 1)] + [("target", int(r)) for r in args.rows.split(",")]
    for role, rows in roles:
        adapter = getattr(lm, role)
        ids = torch.ones(1, rows, dtype=torch.long, device="cuda")
        step_ms(adapter, ids, start, 3)
        wall = step_ms(adapter, ids, start, 20)
        graph_events = capture(adapter, ids, start, 3)
        with adapter.graphs_paused():
            step_ms(adapter, ids, start, 2)
            eager_wall = step_ms(adapter, ids, start, 10)
            eager_events = capture(adapter, ids, start, 3)
        table = collections.defaultdict(lambda: [0, 0.0])
        for e in eager_events:
            table[e.name][0] += 1
            table[e.name][1] += e.time_range.elapsed_us()
        kernels = sorted(
            (
                {"name": n[:90], "calls": c / 3, "us_per_call": us / c, "us_per_step": us / 3}
                for n, (c, us) in table.items()
            ),
            key=lambda k: -k["us_per_step"],
        )
        record = {
            "kind": "profile_step",
            "model": args.model,
            "role": role,
            "rows": rows,
            "graph_ms": wall,
            "graph_kernels": len(graph_events) / 3,
            "graph_busy_ms": per_step_busy(graph_events, 3) / 1e3,
            "graph_summed_ms": sum(e.time_range.elapsed_us() for e in graph_events) / 3e3,
            "eager_ms": eager_wall,
            "eager_kernels": len(eager_events) / 3,
            "eager_summed_ms": sum(e.time_range.elapsed_us() for e in eager_events) / 3e3,
            "kernels": kernels,
            "tag": args.tag,
        }
        records.append(record)
        print(
            f"{role} rows={rows}: graph {wall:.3f} ms, {record['graph_kernels']:.0f} kernels "
            f"busy {record['graph_busy_ms']:.3f} summed {record['graph_summed_ms']:.3f}; "
            f"eager {eager_wall:.3f} ms, {record['eager_kernels']:.0f} kernels summed "
            f"{record['eager_summed_ms']:.3f}",
            flush=True,
        )
        for k in kernels[: args.top]:
            print(
                f"  {k['us_per_step']:8.1f} us/step {k['calls']:6.1f} x {k['us_per_call']:6.2f} us"
                f"  {k['name']}",
                flush=True,
            )
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

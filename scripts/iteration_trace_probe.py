"""Each iteration of ``specter generate``, with what else happened inside it.

Runs ``specter generate ARGS...`` in this process and records every ``IterationStats`` the
controller makes (depth, accepted, the draft, verify and whole iteration's seconds, whether a
plain step was pipelined) with the run's phase (``load`` until the decode graphs' capture,
``capture``, ``warmup`` for ``--depth auto``'s unrecorded warm-up, ``decode`` after) and the
events that fell inside the iteration's wall time: CUDA graph captures and eager window
forwards (``StepGraphs``, per role and key) and Triton kernels used for the first time.
One JSON line per iteration to ``--out``, then the generate's own statistics line.

The point: a cost ``AdaptiveDepth`` learns from one iteration that captured a graph or
compiled a kernel is not the step's cost (the thirty-eighth session's kept 24 GB costs priced
drafting 3 and 4 proposals at 44-45 ms against 3.9 and 6.3 for 1 and 2).

    python scripts/iteration_trace_probe.py --out it.jsonl -- --model deepseek-v2-lite \
        --gpu-memory-gb 24 --max-new-tokens 64 --prompt-file p.txt --json --no-stream
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time

import triton

EVENTS: list[dict] = []
ITERATIONS: list[dict] = []
STATE = {"phase": "load", "pending": {}, "calls": []}
HOST_CALLS = (
    "specter_cache.expert_cache:ExpertCache.settle",
    "specter_cache.expert_cache:ExpertCache.prefetch",
    "specter_cache.expert_cache:ExpertCache.set_plan",
    "specter_cache.streamed_misses:StreamedMisses.prepare_fills",
    "specter_cache.expert_cache:ExpertCache.release_copies",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher.on_draft_start",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher.on_draft_token",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher.on_verify_start",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher.on_verify_end",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher._finish_boundary",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher._layerwise_final",
    "specter_cache.speculative_prefetcher:SpeculativePrefetcher._feed_measurements",
    "specter_cache.routing_counter:RoutingCounter.snapshot_async",
    "specter_cache.routing_counter:RoutingCounter.begin_forward",
    "specter_cache.routing_counter:PendingSnapshot.result",
    "specter_cache.copy_engine:CudaCopyEngine.record_compute",
    "specter_cache.expert_cache:ExpertCache.every_layer_resident",
    "specter_cache.expert_cache:ExpertCache.lookup",
    "specter_cache.prefetch_planner:PrefetchPlanner.is_boundary",
    "specter_models.spec_adapters:DraftModel.forward",
    "specter_models.spec_adapters:TargetModel.forward",
    "specter_models.spec_adapters:_Adapter.argmax",
)
"""Methods whose host time each iteration sums (``host_ms``: the calls that started inside
the iteration; nested calls count in both)."""


def _event(kind: str, started: float, **fields) -> None:
    EVENTS.append({"kind": kind, "start": started, "end": time.perf_counter(), **fields})


def _pre(*, key, **_):
    STATE["pending"][id(key)] = time.perf_counter()
    return False


def _post(*, key, fn, **_):
    started = STATE["pending"].pop(id(key), None)
    if started is not None:
        _event("compile", started, name=fn.name, phase=STATE["phase"])


def _timed_method(spec: str) -> None:
    import importlib

    module_name, qualified = spec.split(":")
    owner_name, method = qualified.split(".")
    owner = getattr(importlib.import_module(module_name), owner_name)
    original = getattr(owner, method)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            STATE["calls"].append((qualified, started, time.perf_counter() - started))

    setattr(owner, method, wrapper)


def _host_ms(since: float) -> dict[str, float]:
    """The host time per wrapped method of the calls that started at ``since`` or later
    (every call recorded so far is then forgotten)."""
    out: dict[str, float] = {}
    for name, started, seconds in STATE["calls"]:
        if started >= since:
            out[name] = out.get(name, 0.0) + seconds * 1e3
    STATE["calls"] = []
    return {k: round(v, 3) for k, v in out.items()}


def _install() -> None:
    for spec in HOST_CALLS:
        _timed_method(spec)
    triton.knobs.runtime.jit_cache_hook = _pre
    triton.knobs.runtime.jit_post_compile_hook = _post

    import specter_spec.controller as controller
    from specter_models import step_graphs
    from specter_spec.statistics import IterationStats

    class TracedIterationStats(IterationStats):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            ITERATIONS.append(
                {
                    "phase": STATE["phase"],
                    "end": time.perf_counter(),
                    "depth": self.depth,
                    "accepted": self.accepted,
                    "verified": self.verified,
                    "pipelined": self.pipelined,
                    "draft_ms": self.draft_time_s * 1e3,
                    "verify_ms": self.verify_time_s * 1e3,
                    "total_ms": self.total_time_s * 1e3,
                    "host_ms": _host_ms(time.perf_counter() - self.total_time_s),
                }
            )

    controller.IterationStats = TracedIterationStats

    graphs = step_graphs.StepGraphs
    capture, window_forward = graphs._capture, graphs._window_forward

    def traced_capture(self, key, step, window, end):
        started = time.perf_counter()
        try:
            return capture(self, key, step, window, end)
        finally:
            _event("capture", started, role=self.mode.value, key=list(key), phase=STATE["phase"])

    def traced_window_forward(self, step, window, end, split):
        started = time.perf_counter()
        try:
            return window_forward(self, step, window, end, split)
        finally:
            _event("eager", started, role=self.mode.value, window=window, phase=STATE["phase"])

    step_graphs.StepGraphs._capture = traced_capture
    step_graphs.StepGraphs._window_forward = traced_window_forward


def _sync_after_prefill() -> None:
    import torch

    from specter_models.spec_adapters import _Adapter

    prefill = _Adapter.prefill

    def wrapper(self, *args, **kwargs):
        try:
            return prefill(self, *args, **kwargs)
        finally:
            if torch.cuda.is_available():
                started = time.perf_counter()
                torch.cuda.synchronize()
                _event("prefill_sync", started, role=self.role, phase=STATE["phase"])

    _Adapter.prefill = wrapper


def _warm_snapshot_after_capture(text_generation) -> None:
    capture = text_generation.capture_decode_graphs

    def wrapper(loaded, **kwargs):
        out = capture(loaded, **kwargs)
        if getattr(loaded, "prefetcher", None) is not None:
            started = time.perf_counter()
            loaded.counter.snapshot_async(loaded.prefetcher.top_m).result()
            loaded.counter.clear()
            _event("warm_snapshot", started, phase=STATE["phase"])
            print(f"warm snapshot {(time.perf_counter() - started) * 1e3:.1f} ms", file=sys.stderr)
        return out

    text_generation.capture_decode_graphs = wrapper


def _phased(module, name: str, phase: str, after: str) -> None:
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        STATE["phase"] = phase
        try:
            return original(*args, **kwargs)
        finally:
            STATE["phase"] = after

    setattr(module, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--sync-prefill",
        action="store_true",
        help="synchronise the device after each prefill (an event `prefill_sync` with its "
        "wait), so that work the prefill left queued does not land in the first iteration",
    )
    parser.add_argument(
        "--warm-snapshot",
        action="store_true",
        help="after the decode graphs' capture, take one routing-count snapshot and read it "
        "(its pinned buffer and kernels then exist before the first draft's)",
    )
    parser.add_argument("generate_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    rest = [a for a in args.generate_args if a != "--"]
    _install()
    if args.sync_prefill:
        _sync_after_prefill()
    from specter_bench import text_generation
    from specter_bench.cli import main as cli_main

    _phased(text_generation, "capture_decode_graphs", "capture", "decode")
    if args.warm_snapshot:
        _warm_snapshot_after_capture(text_generation)
    _phased(text_generation, "warm_adaptive_depth", "warmup", "decode")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli_main(["generate", *rest])
    lines = stdout.getvalue().strip().splitlines()
    with open(args.out, "w") as f:
        for i, it in enumerate(ITERATIONS):
            start = it["end"] - it["total_ms"] / 1e3
            inside = [
                {k: v for k, v in e.items() if k not in ("start", "end")}
                | {"ms": (e["end"] - e["start"]) * 1e3}
                for e in EVENTS
                if e["end"] >= start and e["start"] <= it["end"]
            ]
            f.write(json.dumps({"kind": "iteration", "index": i, **it, "events": inside}) + "\n")
        for e in EVENTS:  # every event, those between iterations too (a prefill's sync)
            if e["kind"] != "compile" or e.get("phase") == "decode":
                f.write(json.dumps({**e, "kind": "event", "event": e["kind"],
                                    "ms": (e["end"] - e["start"]) * 1e3}) + "\n")  # fmt: skip
        if lines and lines[-1].startswith("{"):
            f.write(json.dumps({"kind": "generate", **json.loads(lines[-1])}) + "\n")
    for it in ITERATIONS:
        if it["phase"] != "decode":
            continue
        start = it["end"] - it["total_ms"] / 1e3
        kinds = sorted({e["kind"] for e in EVENTS if e["end"] >= start and e["start"] <= it["end"]})
        print(
            f"K={it['depth']} acc={it['accepted']} draft {it['draft_ms']:.2f} verify "
            f"{it['verify_ms']:.2f} total {it['total_ms']:.2f} {' '.join(kinds)}",
            file=sys.stderr,
        )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

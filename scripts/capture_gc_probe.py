"""Which garbage breaks a CUDA graph capture when Python's collector frees it mid-capture.

torch 2.11's ``torch.cuda.graph`` no longer runs ``gc.collect()`` before a capture (only
with ``TORCH_CUDAGRAPH_GC=1``), so a collection that the capture's own Python allocations
trigger can free a cycle an earlier caller left behind, and run its CUDA teardown on the
capturing thread. This probe makes one kind of cyclic garbage at a time, drops it, starts a
``thread_local`` capture of a small computation and allocates enough inside it that the
collector runs on its own, then reports whether the capture survived; and the same with the
collector paused (``specter_models.step_graphs.paused_collection``), as the step graphs
capture now.

Run on a CUDA machine (repo root)::

    source scripts/gpu-env.sh && python3 scripts/capture_gc_probe.py --out "$OUT/capture-gc.jsonl"
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys

import torch

from specter_models.step_graphs import paused_collection


class _Cycle:
    """An object in a reference cycle holding ``payload`` (freed only by the collector)."""

    def __init__(self, payload: object) -> None:
        self.payload = payload
        self.me = self


def _captured_graph() -> torch.cuda.CUDAGraph:
    x = torch.ones(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.mul_(2.0)
    return graph


def _garbage(kind: str) -> object:
    side = torch.cuda.Stream()
    if kind == "nothing":
        return None
    if kind == "graph":  # a captured graph and its private pool
        return _captured_graph()
    if kind == "event":
        event = torch.cuda.Event()
        event.record()
        return event
    if kind == "external-event":
        event = torch.cuda.Event(external=True)
        event.record()
        return event
    if kind == "pinned":  # pinned host memory a copy read
        host = torch.ones(1 << 20, pin_memory=True)
        dev = torch.empty(1 << 20, device="cuda")
        dev.copy_(host, non_blocking=True)
        return host
    if kind == "side-stream-tensor":  # device memory used on another stream
        t = torch.ones(1 << 20, device="cuda")
        with torch.cuda.stream(side):
            t.add_(1.0)
        t.record_stream(side)
        return t
    raise ValueError(kind)


KINDS = ("nothing", "graph", "event", "external-event", "pinned", "side-stream-tensor")


def _churn(n: int = 20000) -> None:
    """Allocate ``n`` cyclic lists: with the collector on, automatic collections run (the
    garbage made just before is young, so the first generation-0 collection frees it)."""
    for _ in range(n):
        a: list[object] = []
        a.append(a)


def _trial(kind: str, paused: bool) -> dict[str, object]:
    """One capture with ``kind``'s garbage pending. The collector is off while the garbage
    is made and the capture starts (so nothing frees it earlier); inside the capture, the
    unpaused arm turns it back on before allocating, as a forward's allocations would
    trigger a collection; the paused arm turns it on before ``paused_collection``."""
    gc.collect()
    torch.cuda.synchronize()
    gc.disable()
    _Cycle(_garbage(kind))  # dropped at once: only the collector can free it
    y = torch.zeros(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    error = None
    try:
        if paused:
            gc.enable()
            with paused_collection(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                y.add_(1.0)
                _churn()
                y.add_(1.0)
        else:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                y.add_(1.0)
                gc.enable()
                _churn()
                y.add_(1.0)
        graph.replay()
        torch.cuda.synchronize()
        ok = float(y[0]) == 2.0
    except Exception as exc:  # the capture was invalidated
        ok, error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
    finally:
        gc.enable()
    gc.collect()
    return {"kind": kind, "paused": paused, "captured": ok, "error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON lines file (default: stdout only)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("capture_gc_probe needs a CUDA device", file=sys.stderr)
        return 2
    rows = []
    for paused in (False, True):
        for kind in KINDS:
            row = _trial(kind, paused)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

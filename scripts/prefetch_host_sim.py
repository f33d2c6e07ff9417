"""The draft-guided prefetcher's host time per draft token, on the CPU, at a model's shape.

Builds specter-cache's ``ExpertCache`` on the CPU with tiny experts but a full-size model's
layers, experts, slots and pinned hot set (default DeepSeek-V2-Lite at 24 GB: 26 layers, 64
experts, 39 slots of which 36 pinned), drives ``SpeculativePrefetcher`` with random top-k
draft routing for ``--iterations`` draft/verify iterations of depth ``--depth``, and prints
the mean host time of ``on_draft_token`` and ``on_verify_start`` and the prefetch loads per
iteration, then cProfile's functions by cumulative time. The CPU copies are real (tiny);
a GPU's copy calls cost more, so this measures the Python side of a boundary.

    PYTHONPATH=packages/specter-cache/src python scripts/prefetch_host_sim.py
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time

import torch

from specter_cache import (
    ExpertCache,
    ExpertLayout,
    ExpertStore,
    RoutingCounter,
    SpeculativePrefetcher,
)


def tiny_cache(layers: int, experts: int, slots: int, policy: str) -> ExpertCache:
    """A CPU ``ExpertCache`` with a full-size model's layers, experts and slots, and tiny
    experts (every one in the store), for timing the host's bookkeeping."""
    layout = ExpertLayout({"gate_up": ((4, 4), torch.float16), "down": ((4, 2), torch.float16)})
    store = ExpertStore(layers, experts, layout)
    for layer in range(layers):
        for e in range(experts):
            store.put(
                layer, e, {n: torch.zeros(s.shape, dtype=s.dtype) for n, s in layout.specs.items()}
            )
    return ExpertCache(store, slots_per_layer=slots, device="cpu", policy=policy)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--slots", type=int, default=39)
    p.add_argument("--pinned", type=int, default=36)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--top", type=int, default=20)
    p.add_argument(
        "--cold-rate",
        type=float,
        default=None,
        help="route each layer's token to the pinned hot set but for one other expert with "
        "this probability (DeepSeek-V2-Lite at 24 GB: about 0.85, some 20 loads an "
        "iteration); default: uniformly random routing",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    L, E = args.layers, args.experts
    cache = tiny_cache(L, E, args.slots, "predictive")
    rng = random.Random(0)
    hot = [rng.sample(range(E), args.pinned) for _ in range(L)]
    cold = [[e for e in range(E) if e not in hot[layer]] for layer in range(L)]
    for layer in range(L):
        cache.pin(layer, hot[layer])

    def routed(layer: int) -> list[int]:
        if args.cold_rate is None:
            return rng.sample(range(E), args.top_k)
        n_cold = 1 if rng.random() < args.cold_rate else 0
        return rng.sample(hot[layer], args.top_k - n_cold) + rng.sample(cold[layer], n_cold)

    counter = RoutingCounter(L, E, "cpu")
    prefetcher = SpeculativePrefetcher(cache, counter, pipelined=True)
    token_s: list[float] = []
    verify_s: list[float] = []

    def iteration() -> None:
        prefetcher.on_draft_start(args.depth)
        for i in range(args.depth):
            for layer in range(L):
                counter.observe(layer, torch.tensor([routed(layer)]))
            t = time.perf_counter()
            prefetcher.on_draft_token(i)
            token_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        prefetcher.on_verify_start(args.depth + 1)
        verify_s.append(time.perf_counter() - t)
        for layer in range(L):
            cache.lookup(layer, rng.sample(range(E), args.top_k))
        prefetcher.on_verify_end(args.depth // 2)

    for _ in range(5):  # warm
        iteration()
    token_s.clear()
    verify_s.clear()
    loads = cache.stats()["total"]["prefetch_loads"]
    for _ in range(args.iterations):  # timed without the profiler, which inflates calls
        iteration()
    loads = (cache.stats()["total"]["prefetch_loads"] - loads) / args.iterations
    print(
        f"on_draft_token {1e3 * statistics.fmean(token_s):.3f} ms, on_verify_start "
        f"{1e3 * statistics.fmean(verify_s):.3f} ms (means), {loads:.1f} prefetch loads per "
        "iteration",
        flush=True,
    )
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.iterations):
        iteration()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumtime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A streamed plain step's host bookkeeping, on the CPU, at a model's shape.

Builds specter-cache's ``ExpertCache`` on the CPU with tiny experts but a full-size model's
layers, experts and slots (default Qwen1.5-MoE at 14 GB without a draft: 24 layers, 60
experts, top-4, 23 slots), streaming, LRU, every slot filled; then times, per step,
``prepare_fills`` (each layer's fill candidates) and the stream record's count
(specter-models' ``_count_rows``: ``record_streamed`` per layer) with routing that hits the
resident experts but for one random expert a layer. Prints the medians in ms. The host does
this for every streamed step while the device waits (docs/benchmarks.md, twenty-ninth
session), so it bounds how fast such steps can follow each other.

    export PYTHONPATH=packages/specter-cache/src:packages/specter-models/src
    PYTHONPATH=$PYTHONPATH:packages/specter-kernels/src \\
        python scripts/fill_host_sim.py --layers 26 --experts 64 --top-k 6 --slots 46
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from prefetch_host_sim import tiny_cache  # a sibling script (scripts/ is on sys.path)

from specter_models.streamed_misses import _count_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--experts", type=int, default=60)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--slots", type=int, default=23)
    p.add_argument("--fills", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(1)
    L, E, k = args.layers, args.experts, args.top_k
    cache = tiny_cache(L, E, args.slots, "lru")
    cache.streaming = True
    rng = random.Random(0)
    resident = [rng.sample(range(E), args.slots) for _ in range(L)]
    cache.prefetch(dict(enumerate(resident)))
    cache.expire_prefetches()
    cache.synchronize()
    prepare_s: list[float] = []
    count_s: list[float] = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        cache.streamed.prepare_fills(args.fills)
        t1 = time.perf_counter()
        rows = []
        for layer in range(L):
            ids = [*rng.sample(resident[layer], k - 1), rng.randrange(E)]
            ids = list(dict.fromkeys(ids))
            streamed = {e for e in ids if cache.slot_of(layer, e) is None}
            rows.append(ids + [0] * (k - len(ids)) + [int(e in streamed) for e in range(E)])
            rows[-1] += [-1] * E
        t2 = time.perf_counter()
        _count_rows(cache, rows, k, E)
        t3 = time.perf_counter()
        prepare_s.append(t1 - t0)
        count_s.append(t3 - t2)
    print(
        f"L={L} E={E} k={k} slots={args.slots} fills={args.fills}: prepare_fills "
        f"{1e3 * statistics.median(prepare_s):.3f} ms, count {1e3 * statistics.median(count_s):.3f}"
        " ms a step (median)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

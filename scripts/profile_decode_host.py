"""Where a decode iteration's wall time goes on the host, for a full-size preset.

Decodes ``--tokens`` tokens with plain decoding (K = 0) and speculation (K = ``--depth``)
with CUDA graphs, every expert resident unless ``--budget-gb`` is given, and prints the
decode TPOT (prefill excluded), the mean draft / verify / commit time per iteration beside
the graphed GPU step times, and cProfile's functions by own host time over the decode.
Time spent in ``synchronize`` and ``tolist`` is the host waiting for the GPU; the rest
of the list is host work the GPU may idle behind.

    source scripts/gpu-env.sh && python3 scripts/profile_decode_host.py --model deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import specter_models
from specter_spec import SpecController


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--budget-gb", type=float, default=None)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--no-cprofile", action="store_true", help="time only (cProfile inflates host work)"
    )
    p.add_argument("--row-truncation", action="store_true", help="load(row_truncation=True)")
    args = p.parse_args()
    t = time.perf_counter()
    lm = specter_models.load(
        args.model,
        device=args.device,
        max_seq_len=1024,
        gpu_memory_gb=args.budget_gb,
        row_truncation=args.row_truncation,
    )
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    vocab = lm.model.config.vocab_size
    ids = [3 + i % (vocab - 3) for i in range(200)]
    for depth in (0, args.depth):
        for _ in range(2):  # the first run captures the graphs the second replays
            lm.reset()
            controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
            profiler = cProfile.Profile()
            if not args.no_cprofile:
                profiler.enable()
            result = controller.generate(ids, args.tokens)
            profiler.disable()
        stats = result.stats
        iterations = max(stats.num_iterations, 1)
        commit_ms = 1e3 * (stats.decode_time_s - stats.draft_time_s - stats.verify_time_s)
        print(
            f"K={depth}: TPOT {1e3 * stats.tpot_s:.2f} ms over {stats.new_tokens} tokens, "
            f"{iterations} iterations; per iteration: draft "
            f"{1e3 * stats.draft_time_s / iterations:.2f} ms, verify "
            f"{1e3 * stats.verify_time_s / iterations:.2f} ms, commit "
            f"{commit_ms / iterations:.2f} ms; verified {stats.verified} of {stats.proposed} "
            f"proposals; graphs {lm.graph_stats()}",
            flush=True,
        )
        if args.no_cprofile:
            continue
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

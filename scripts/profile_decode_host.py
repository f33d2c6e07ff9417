"""Where a decode iteration's wall time goes on the host, for a full-size preset.

Decodes ``--tokens`` tokens of a synthetic prompt (or HumanEval prompt ``--humaneval N``)
with plain decoding (K = 0) and speculation (K = ``--depth``, or ``auto``)
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
from specter_spec import AdaptiveDepth, AdaptiveDepthConfig, SpecController


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--depth", default="4", help="K, or 'auto' (AdaptiveDepth, max 16)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--budget-gb", type=float, default=None)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--no-cprofile", action="store_true", help="time only (cProfile inflates host work)"
    )
    p.add_argument("--row-truncation", action="store_true", help="load(row_truncation=True)")
    p.add_argument(
        "--hot-experts",
        default=None,
        help="a `specter bench` results file with a hot_experts record (pinned hot set)",
    )
    p.add_argument(
        "--torch-profile", action="store_true", help="also a torch.profiler table of a decode"
    )
    p.add_argument(
        "--humaneval",
        type=int,
        default=None,
        metavar="N",
        help="decode HumanEval prompt N (byte tokens, as `specter bench` encodes them for "
        "random-weight presets) instead of a synthetic 200-token prompt; a hot set chosen "
        "on HumanEval prompts then routes as in the benchmark",
    )
    p.add_argument(
        "--miss-path",
        default="load",
        choices=("load", "stream"),
        help="load(miss_path=): acquire missing experts, or stream them from the pinned store",
    )
    args = p.parse_args()
    hot = None
    if args.hot_experts:
        from specter_bench.hot_sets import read_hot_experts

        hot = read_hot_experts(args.hot_experts, args.budget_gb)
    t = time.perf_counter()
    lm = specter_models.load(
        args.model,
        device=args.device,
        max_seq_len=1024,
        gpu_memory_gb=args.budget_gb,
        row_truncation=args.row_truncation,
        hot_experts=hot,
        miss_path=args.miss_path,
    )
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    vocab = lm.model.config.vocab_size
    if args.humaneval is None:
        ids = [3 + i % (vocab - 3) for i in range(200)]
    else:
        from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
        from specter_bench.prompt_sources import load_humaneval

        prompt = load_humaneval(args.humaneval + 1)[args.humaneval]
        ids = encode_prompt(prompt.text, ByteTokenizer(vocab_size=vocab), vocab_size=vocab)
        print(f"prompt {prompt.id}: {len(ids)} tokens", flush=True)
    for depth in (0, args.depth):
        for _ in range(2):  # the first run captures the graphs the second replays
            lm.reset()
            policy = (
                AdaptiveDepth(AdaptiveDepthConfig(max_depth=16)) if depth == "auto" else int(depth)
            )
            controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=policy)
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
        print(f"cache: {lm.cache.stats()}", flush=True)
        if args.torch_profile:
            _torch_profile(lm, ids, args.tokens, policy_for=depth)
        if args.no_cprofile:
            continue
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue(), flush=True)
    return 0


def _torch_profile(lm, ids: list[int], tokens: int, policy_for: str) -> None:
    """One more decode under torch.profiler: the wall time against the summed device time
    of its kernels (the gap is the GPU idling behind the host), and the kernels by time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    lm.reset()
    auto = policy_for == "auto"
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16)) if auto else int(policy_for)
    controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=policy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        result = controller.generate(ids, tokens)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in events if "Memcpy" not in e.name]
    device_s = sum(e.device_time for e in kernels) * 1e-6
    copies_s = sum(e.device_time for e in events if "Memcpy" in e.name) * 1e-6
    print(
        f"K={policy_for} under torch.profiler: wall {wall * 1e3:.1f} ms (decode "
        f"{result.stats.decode_time_s * 1e3:.1f}), {len(kernels)} kernels, summed kernel "
        f"time {device_s * 1e3:.1f} ms, copies {copies_s * 1e3:.1f} ms",
        flush=True,
    )
    print(
        prof.key_averages().table(
            sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=50
        ),
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""How long the GPU waits on the host around each verification of a budgeted decode.

Loads a preset at ``--budget-gb`` on the streamed miss path (with the pinned hot set of a
``specter bench`` results file, ``--hot-experts``), captures its graphs, decodes HumanEval
prompts at depth ``--depth`` (an int or ``auto``) once to warm and once measured, and
times on the host, per iteration, the two stretches where nothing is queued on the device:

* ``after_verify``: from the verification's end (its stream record read) to the next
  forward's call: the record's bookkeeping, acceptance, ``on_verify_end``, the commit and
  the next iteration's start;
* ``before_verify``: from the draft's end (``on_verify_start`` entered, the compute stream
  drained) to the verification's call: the snapshot, the plan and the prefetch's loads.

It also times ``ExpertCache.prefetch`` and the stream record's count on their own. The
host stretches synchronise where the decode waits anyway, except with deferred counts:
the record's read then moves from the acceptance's read to the forward's end, so the
stretch after the verification also holds the count's queueing and the acceptance's
launches.

``--device-gaps`` measures on the device instead, with no synchronisation at all: a timing
event before and after each draft and target forward, and the device time from one
forward's end to the next one's start (the GPU idle between them, plus the few small
kernels there, such as the acceptance's), summed per kind of gap (after a verification,
before a verification, between draft tokens) over the measured decodes.

    source scripts/gpu-env.sh && python3 scripts/host_gaps_probe.py --hot-experts \\
        benchmarks/results/bench-deepseek-v2-lite-2026-12-03-final-24gb.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--budget-gb", type=float, default=24.0)
    p.add_argument("--hot-experts", default=None)
    p.add_argument("--depth", default="auto")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=None, help="append one JSON line here")
    p.add_argument(
        "--device-gaps",
        action="store_true",
        help="time the gaps between forwards on the device (events, no synchronisation) "
        "instead of the host stretches",
    )
    args = p.parse_args()

    import specter_models
    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval
    from specter_models.streamed_misses import STREAM_MAX_ROWS, StreamRecord
    from specter_spec import AdaptiveDepth, AdaptiveDepthConfig, SpecController

    hot = None
    if args.hot_experts:
        from specter_bench.hot_sets import read_hot_experts

        hot = read_hot_experts(args.hot_experts, args.budget_gb)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lm = specter_models.load(
        args.model,
        device=device,
        max_seq_len=1024,
        gpu_memory_gb=args.budget_gb if device.type == "cuda" else None,
        hot_experts=hot,
        miss_path="stream",
    )
    if device.type == "cuda":
        lm.capture_step_graphs(1024)
    vocab = lm.model.config.vocab_size
    prompts = [
        encode_prompt(pr.text, ByteTokenizer(vocab_size=vocab), vocab_size=vocab)
        for pr in load_humaneval(args.prompts)
    ]

    def drain() -> None:
        if device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    times: dict[str, list[float]] = {
        k: [] for k in ("after_verify", "before_verify", "prefetch", "count")
    }
    state: dict[str, float | None] = {"idle_from": None, "verify_idle_from": None}

    count = StreamRecord._count
    host_stretches = not args.device_gaps

    def timed_count(self, cache, rows):
        if host_stretches:
            drain()  # the record's own read waits for the verification here
        t0 = time.perf_counter()
        count(self, cache, rows)
        t1 = time.perf_counter()
        times["count"].append(t1 - t0)
        if host_stretches:
            state["idle_from"] = t0

    StreamRecord._count = timed_count  # type: ignore[method-assign]

    # (kind, rows, event before, event after) of every forward of a decode (--device-gaps)
    forwards: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []

    def bracketed(kind, forward):
        def call(input_ids, start_pos):
            if not args.device_gaps or device.type != "cuda":
                return forward(input_ids, start_pos)
            before, after = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            before.record()
            logits = forward(input_ids, start_pos)
            after.record()
            forwards.append((kind, input_ids.shape[1], before, after))
            return logits

        return call

    def close_after_verify() -> None:
        if state["idle_from"] is not None:
            times["after_verify"].append(time.perf_counter() - state["idle_from"])
            state["idle_from"] = None

    draft_forward = bracketed("draft", lm.draft.forward)

    def draft_entry(input_ids, start_pos):
        close_after_verify()
        return draft_forward(input_ids, start_pos)

    lm.draft.forward = draft_entry

    target_forward = bracketed("verify", lm.target.forward)

    def target_entry(input_ids, start_pos):
        close_after_verify()
        if state["verify_idle_from"] is not None:
            times["before_verify"].append(time.perf_counter() - state["verify_idle_from"])
            state["verify_idle_from"] = None
        return target_forward(input_ids, start_pos)

    lm.target.forward = target_entry

    on_verify_start = lm.prefetcher.on_verify_start

    def verify_start(num_tokens):
        if (
            num_tokens > 1 and host_stretches
        ):  # a draft ran: wait for it, as the snapshot's read does
            drain()
            state["verify_idle_from"] = time.perf_counter()
        on_verify_start(num_tokens)

    lm.prefetcher.on_verify_start = verify_start

    prefetch = lm.cache.prefetch

    def timed_prefetch(plan, **kwargs):
        t0 = time.perf_counter()
        out = prefetch(plan, **kwargs)
        times["prefetch"].append(time.perf_counter() - t0)
        return out

    lm.cache.prefetch = timed_prefetch

    def decode(ids):
        lm.reset()
        auto = args.depth == "auto"
        depth = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16)) if auto else int(args.depth)
        controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
        result = controller.generate(ids, args.tokens)
        state["idle_from"] = state["verify_idle_from"] = None
        return result

    gaps: dict[str, list[float]] = {"after_verify": [], "before_verify": [], "between_drafts": []}

    def collect_gaps() -> None:
        """Device gaps between the decode's forwards (prefills left out), in seconds."""
        if not forwards:
            return
        torch.cuda.synchronize()
        decoding = [f for f in forwards if f[1] <= STREAM_MAX_ROWS]
        for (kind, _, _, end), (next_kind, _, start, _) in itertools.pairwise(decoding):
            name = (
                "after_verify"
                if kind == "verify"
                else "before_verify"
                if next_kind == "verify"
                else "between_drafts"
            )
            gaps[name].append(end.elapsed_time(start) / 1e3)
        forwards.clear()

    decode(prompts[0])  # warm
    forwards.clear()
    for v in times.values():
        v.clear()
    tpots, iterations, depths = [], 0, []
    for ids in prompts:
        result = decode(ids)
        collect_gaps()
        tpots.append(1e3 * result.stats.tpot_s)
        iterations += result.stats.num_iterations
        depths.append(result.stats.mean_depth)
    record = {
        "tag": args.tag,
        "model": args.model,
        "budget_gb": args.budget_gb,
        "depth": args.depth,
        "tpot_ms": tpots,
        "tpot_median_ms": statistics.median(tpots),
        "iterations": iterations,
        "mean_depths": depths,
        "tokens": args.tokens * len(prompts),
    }
    if args.device_gaps:
        times = {"prefetch": times["prefetch"], "count": times["count"]}
        for name, values in gaps.items():
            record[f"device_{name}_gaps"] = len(values)
            record[f"device_{name}_mean_ms"] = 1e3 * statistics.fmean(values) if values else None
            record[f"device_{name}_ms_per_token"] = 1e3 * sum(values) / record["tokens"]
    for name, values in times.items():
        record[f"{name}_calls"] = len(values)
        record[f"{name}_mean_ms"] = 1e3 * statistics.fmean(values) if values else None
        record[f"{name}_ms_per_token"] = 1e3 * sum(values) / record["tokens"]
    print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

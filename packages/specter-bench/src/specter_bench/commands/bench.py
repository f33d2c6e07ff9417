"""``specter bench``: the systems x budgets x prompts benchmark; JSON lines out, a table
printed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specter_bench.commands.args import (
    add_cpu_expert_args,
    add_model_args,
    add_prompt_source_args,
    auto_or_non_negative_int,
    non_negative_float,
    non_negative_int,
    parse_budget_list,
    parse_depth,
    parse_dtype,
    parse_int_list,
    positive_int,
    prompt_source_config,
    resolve_device,
)

__all__ = [
    "bench_config_from_args",
    "parse_batch_sizes",
    "register",
    "routing_trace_of",
    "run",
]


def parse_batch_sizes(text: str) -> list[int]:
    """``1,2,4,8``: batch sizes, ints >= 1."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of batch sizes, ints >= 1 such as "
            f"1,2,4,8,16,32, got {text!r}"
        )
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter bench``."""
    bench = subparsers.add_parser(
        "bench",
        help="the systems x budgets x prompts benchmark (JSON lines out, a table printed)",
        description="Run an experiment of docs/benchmarking.md for one model: every system on the "
        "same prompts and weights; records appended as JSON lines under --out.",
    )
    add_model_args(bench, default=None)
    bench.add_argument(
        "--experiment",
        default="default",
        help="default (TPOT at the model's low/high/unlimited budgets + routing experiments), "
        "tpot, ttft, routing, depth-sweep, hot-sweep, ablations, offload (hf-offload), batch "
        "(specter, offload and transformers decoding B prompts together) or all",
    )
    bench.add_argument(
        "--batch-sizes",
        type=parse_batch_sizes,
        default=None,
        help="batch sizes B of the batch experiment (default 1,2,4,8,16,32): each system "
        "decodes the first B prompts together; it needs as many prompts as the largest B "
        "(its default --num-prompts) and cuts them to 16 tokens unless --max-prompt-tokens "
        "says otherwise",
    )
    bench.add_argument(
        "--systems", help="comma-separated systems (default: the experiment's), e.g. lru,specter"
    )
    bench.add_argument(
        "--budgets",
        type=parse_budget_list,
        default="default",
        help="comma-separated GB or 'unlimited' (default: the model's low,high,unlimited)",
    )
    add_prompt_source_args(bench)
    bench.set_defaults(max_prompt_tokens=None)  # 512, or the batch experiment's 16
    bench.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=128,
        help="tokens generated per prompt (default 128, the headline protocol's)",
    )
    bench.add_argument(
        "--runs",
        type=positive_int,
        default=1,
        help="repeat every system's measured pass over the prompts this many times on the "
        "same load (default 1; the headline protocol uses 3): tables show the median and "
        "range across runs, and a target ratio is met only at its worst run",
    )
    bench.add_argument(
        "--prompt-lengths",
        type=parse_int_list,
        default=None,
        help="prompt lengths in tokens of the ttft experiment (default 512,2048,8192): the "
        "measured prompts' text repeated to exactly each length",
    )
    bench.add_argument("--depth", type=parse_depth, default=None, help="K for speculating systems")
    bench.add_argument(
        "--no-fallback",
        action="store_true",
        help="with --depth auto, keep specter speculating at a budget where its warm-up chose "
        "K = 0 (by default it then decodes as offload, and its records say so)",
    )
    bench.add_argument(
        "--depths",
        type=parse_int_list,
        default=None,
        help="depths of the depth sweep / working set (default 0,2,4,8,16,32 / 1,2,4,8,16,32)",
    )
    bench.add_argument(
        "--sweep-prompts",
        type=positive_int,
        default=None,
        help="prompts of the depth and hot-count sweeps, the first ones (default 2)",
    )
    bench.add_argument(
        "--out",
        default="benchmarks/results",
        help="output folder (default benchmarks/results)",
    )
    bench.add_argument("--tag", default=None, help="file name tag (default model and date)")
    bench.add_argument(
        "--max-minutes",
        type=non_negative_float,
        default=None,
        help="stop starting new cells after this long; what finished is written",
    )
    bench.add_argument("--warmup", type=int, default=1, help="unrecorded runs per system")
    bench.add_argument(
        "--warmup-tokens", type=positive_int, default=32, help="tokens per warm-up run"
    )
    bench.add_argument(
        "--hf-no-compile",
        action="store_true",
        help="stop transformers from compiling its static-cache decode step for hf",
    )
    bench.add_argument(
        "--hf-decode-experts",
        choices=("auto", "batched_mm", "grouped_mm", "batched_mm_prompt_too"),
        default="auto",
        help="transformers experts implementation of hf (default auto: batched_mm_prompt_too, "
        "transformers' batched_mm for prompt and decode, for experts of at most 32 M weights "
        "as DeepSeek-V2-Lite's; grouped_mm for larger ones, as Phi-3.5-MoE's; batched_mm: "
        "batched_mm decode steps with a grouped_mm prompt)",
    )
    bench.add_argument(
        "--offload-new-tokens",
        type=positive_int,
        default=8,
        help="new tokens for hf-offload (very slow; default 8)",
    )
    bench.add_argument(
        "--offload-prompts", type=positive_int, default=1, help="prompts for hf-offload"
    )
    bench.add_argument(
        "--calibration-prompts",
        type=non_negative_int,
        default=None,
        help="prompts after the measured ones whose routing picks each budget's pinned hot "
        "set (default 8: a hot set counted on 8 decodes moved fewer experts than one counted "
        "on 2; 0: no hot sets)",
    )
    bench.add_argument(
        "--hot-counts",
        type=parse_int_list,
        default=None,
        help="pinned counts of the hot-count sweep (default: 0, the chosen count and four "
        "spread over what the high budget holds)",
    )
    bench.add_argument(
        "--hot-experts",
        type=auto_or_non_negative_int,
        default="auto",
        help="experts per layer specter pins at every budget (default auto: the count the "
        "calibration replay chooses per budget)",
    )
    bench.add_argument(
        "--draft-pruned",
        type=auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft of specter (and every system with a hot set) "
        "skips: the calibration prompts' least routed; their INT4 memory buys FP16 slots, the "
        "target still computes them (default auto: a third of the experts under a budget "
        "that leaves some expert without a slot, none otherwise; 0: none)",
    )
    bench.add_argument(
        "--dtype", default=None, help="default: float16 on a GPU, float32 on a CPU (float64 too)"
    )
    _add_routing_args(bench)
    add_cpu_expert_args(bench, sweep=True)
    bench.set_defaults(run=run)


def _add_routing_args(bench: argparse.ArgumentParser) -> None:
    """``--routing`` and ``--routing-trace``: the model's own routing or a replayed trace."""
    bench.add_argument(
        "--routing",
        choices=("random", "replay"),
        default="random",
        help="random: the model's own routing (random weights); replay: every engine system "
        "computes the experts and accepts what --routing-trace recorded on a trained model of "
        "the same topology (prompt i is the trace's sequence i)",
    )
    bench.add_argument(
        "--routing-trace",
        default=None,
        help="the trace --routing replay replays (written by `specter record-routing`)",
    )


def routing_trace_of(args: argparse.Namespace) -> Path | None:
    """The trace file of ``--routing``/``--routing-trace``, or None for random routing.

    Raises:
        ValueError: one of the two flags without the other, or a missing file.
    """
    trace = getattr(args, "routing_trace", None)
    if getattr(args, "routing", "random") == "random":
        if trace is not None:
            raise ValueError(f"--routing-trace {trace} needs --routing replay to be replayed.")
        return None
    if getattr(args, "experiment", None) == "ttft":
        raise ValueError(
            "--experiment ttft measures synthetic prompts of --prompt-lengths, which no routing "
            "trace holds; run it with --routing random."
        )
    if trace is None:
        raise ValueError(
            "--routing replay needs --routing-trace PATH (a trace written by `specter "
            "record-routing` on a trained model of the same topology)."
        )
    path = Path(trace)
    if not path.is_file():
        raise ValueError(
            f"--routing-trace {path} does not exist; write it with `specter record-routing`."
        )
    return path


def bench_config_from_args(args: argparse.Namespace, device: str) -> Any:
    """A :class:`BenchConfig` from ``specter bench``'s arguments.

    Raises:
        ValueError: a missing model, an unknown experiment or system, or bad values.
    """
    from specter_bench.experiments import (
        BATCH_PROMPT_TOKENS,
        DEFAULT_BATCH_SIZES,
        DEFAULT_CALIBRATION_PROMPTS,
        EXPERIMENTS,
        BenchConfig,
    )
    from specter_bench.model_loading import EngineOptions

    if not args.model:
        raise ValueError(
            "--model is required: a preset (deepseek-v2-lite, qwen1.5-moe, phi-3.5-moe, "
            "tiny-deepseek-v2, ...), specter-code-tiny, or a checkpoint folder."
        )
    if args.experiment not in EXPERIMENTS:
        known = ", ".join(f"{k} ({v})" for k, v in EXPERIMENTS.items())
        raise ValueError(f"unknown experiment {args.experiment!r}; expected one of: {known}.")
    systems = None
    if args.systems:
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    budgets = None if args.budgets == "default" else tuple(args.budgets)
    depth = "auto" if args.depth is None else args.depth
    out = Path(args.out)
    kwargs: dict[str, object] = {}
    if args.hot_counts is not None:
        kwargs["hot_sweep_counts"] = tuple(args.hot_counts)
    if getattr(args, "sweep_prompts", None) is not None:
        kwargs["sweep_prompts"] = args.sweep_prompts
    if args.prompt_lengths is not None:
        kwargs["prompt_lengths"] = tuple(args.prompt_lengths)
    batch = args.experiment == "batch"
    sizes = getattr(args, "batch_sizes", None)
    if sizes is not None and not batch:
        raise ValueError(
            f"--batch-sizes {','.join(map(str, sizes))} sets the batch experiment's batch "
            "sizes; add --experiment batch (or leave --batch-sizes out)."
        )
    if sizes is not None:
        kwargs["batch_sizes"] = tuple(sizes)
    max_prompt_tokens = getattr(args, "max_prompt_tokens", None)
    if max_prompt_tokens is None:
        max_prompt_tokens = BATCH_PROMPT_TOKENS if batch else 512
    default_prompts = max(sizes or DEFAULT_BATCH_SIZES) if batch else 3
    if args.depths is not None:
        kwargs["sweep_depths"] = tuple(args.depths)
        kwargs["working_set_depths"] = tuple(d for d in args.depths if d >= 1) or (1,)
    return BenchConfig(
        model=args.model,
        experiment=args.experiment,
        systems=systems,
        budgets=budgets,
        prompts=prompt_source_config(args, default_limit=default_prompts),
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        depth=depth,
        device=device,
        dtype=parse_dtype(args.dtype, device),
        seed=args.weights_seed,
        out_dir=out,
        tag=args.tag,
        max_minutes=args.max_minutes,
        warmup=args.warmup,
        warmup_tokens=args.warmup_tokens,
        hf_compile=not args.hf_no_compile,
        hf_decode_experts=args.hf_decode_experts,
        offload_new_tokens=args.offload_new_tokens,
        offload_prompts=args.offload_prompts,
        calibration_prompts=(
            DEFAULT_CALIBRATION_PROMPTS
            if args.calibration_prompts is None
            else args.calibration_prompts
        ),
        hot_experts_per_layer=None if args.hot_experts == "auto" else args.hot_experts,
        draft_pruned_per_layer=args.draft_pruned,
        engine=EngineOptions.from_args(args),
        cpu_experts=tuple(getattr(args, "cpu_experts", None) or ("off",)),
        cpu_threads=tuple(args.cpu_threads) if getattr(args, "cpu_threads", None) else None,
        command=getattr(args, "invocation", None),
        routing_trace=routing_trace_of(args),
        runs=args.runs,
        fallback=not args.no_fallback,
        **kwargs,  # type: ignore[arg-type]
    )


def run(args: argparse.Namespace) -> int:
    """Run the experiment, print the TPOT and target tables (the TTFT table for ``ttft``,
    the batch table and its targets for ``batch``) and the memory against the budget; exit
    status 0."""
    from specter_bench.bench_runner import BenchRunner
    from specter_bench.tables import memory_use_table, targets_table, tpot_table, ttft_table

    config = bench_config_from_args(args, resolve_device(args.device))
    if "on" in config.cpu_experts:
        from specter_models.cpu_experts import check_cpu_kernel

        check_cpu_kernel(config.dtype)  # --cpu-experts on where it cannot run: why, at once
    result = BenchRunner(config).run()
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    if tpot:
        print(tpot_table(tpot))
        print(targets_table(tpot))
        from specter_bench.bench_cpu import cpu_table

        placements = cpu_table(tpot)
        if placements:
            print(placements)
    ttft = [r for r in result.records if r["kind"] == "ttft"]
    if ttft:
        print(ttft_table(ttft))
    batch = [r for r in result.records if r["kind"] == "batch"]
    if batch:
        from specter_bench.batch_tables import batch_table, batch_targets_table

        print(batch_table(batch))
        print(batch_targets_table(batch))
    memory = [r for r in result.records if r["kind"] == "memory"]
    if memory:
        print(memory_use_table(memory))
    kinds = sorted({r["kind"] for r in result.records})
    print(f"wrote {len(result.records)} records ({', '.join(kinds)}) to {result.path}")
    for line in result.skipped:
        print(f"not measured: {line}")
    return 0

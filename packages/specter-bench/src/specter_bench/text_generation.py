"""``specter generate``: load a model, stream a completion, print statistics.

With no arguments it runs the built-in demo ``specter-code-tiny`` (a small trained
DeepSeek-V2-architecture MoE shipped with specter-models) on the GPU when there is one and
on the CPU otherwise, through the full Specter path: INT4 draft, expert cache, verification.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from specter_bench.bench_command import parse_dtype
from specter_bench.depth_memory import engine_setup, recall_depth_costs, write_depth_costs
from specter_bench.engine_systems import DecodeWindow, make_depth_policy
from specter_bench.hot_sets import (
    CONTINUATION_TOKENS,
    IN_PLACE_READ_COST,
    choose_prompt_engine,
    read_hot_set,
)
from specter_bench.memory_info import budget_plan, neither_fits, plain_plan
from specter_bench.model_loading import (
    FILL_CANDIDATES,
    EngineOptions,
    load_engine,
    load_tokenizer,
    model_config,
)
from specter_bench.tables import format_value
from specter_models import MemoryBudgetError
from specter_spec import AdaptiveDepth, SamplingConfig, SpecController

__all__ = [
    "CAPTURE_AHEAD_POSITIONS",
    "DEPTH_WARMUP_TOKENS",
    "capture_decode_graphs",
    "generate_hot_experts",
    "generation_summary",
    "run_generate",
    "warm_adaptive_depth",
]


def _prompt_text(args: argparse.Namespace) -> str:
    from specter_bench.cli import DEFAULT_PROMPT, CommandError

    if args.prompt is not None and args.prompt_file is not None:
        raise CommandError("give the prompt as an argument or with --prompt-file, not both.")
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise FileNotFoundError(f"--prompt-file {path}: no such file.")
        text = path.read_text(encoding="utf-8")
    else:
        text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    if not text:
        raise CommandError("the prompt is empty; give some text to complete.")
    return text


def _sampling(args: argparse.Namespace) -> SamplingConfig:
    from specter_bench.cli import CommandError

    if not 0 < args.top_p <= 1:
        raise CommandError(f"--top-p must be in (0, 1], got {args.top_p}.")
    if args.top_k < 0:
        raise CommandError(f"--top-k must be >= 0 (0 keeps every token), got {args.top_k}.")
    if args.temperature == 0:
        if args.top_p != 1 or args.top_k != 0:
            raise CommandError("--top-p/--top-k need sampling: give --temperature > 0.")
        return SamplingConfig.greedy()
    return SamplingConfig(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )


def generation_summary(loaded: Any, stats: Any, peak_gpu_bytes: int | None) -> dict[str, Any]:
    """The statistics ``generate`` prints: speed, acceptance, depth, cache, memory.

    Args:
        loaded: the ``SpecterModel``.
        stats: the stream's ``GenerationStats``.
        peak_gpu_bytes: ``torch.cuda.max_memory_allocated`` or None on a CPU.
    """
    cache = loaded.cache.stats()["total"]  # one host sync, after generation
    tokens = stats.new_tokens
    tpot = stats.tpot_s
    return {
        "new_tokens": tokens,
        "tpot_ms": 1e3 * tpot if tpot is not None else None,
        "tokens_per_s": 1.0 / tpot if tpot else None,
        "prefill_ms": 1e3 * stats.prefill_time_s,
        # Counted in TPOT, but carries the prefill's queued work and the decode's first
        # uses: at 24 GB on an H200 about twice a later iteration.
        "first_iteration_ms": (
            1e3 * stats.iterations[0].total_time_s if stats.iterations else None
        ),
        "iterations": stats.num_iterations,
        "acceptance_rate": stats.acceptance_rate,
        "accepted_per_iteration": stats.mean_accepted_per_iteration,
        "mean_depth": stats.mean_depth,
        "hit_rate": cache["hit_rate"],
        "prefetch_precision": cache["prefetch_precision"],
        "prefetch_recall": cache["prefetch_recall"],
        "h2d_mb_per_token": cache["bytes_moved"] / 1e6 / tokens if tokens else None,
        "stall_ms_per_token": 1e3 * cache["stall_seconds"] / tokens if tokens else None,
        "miss_path": getattr(loaded, "miss_path", "load"),
        "streamed_mb_per_token": (
            cache.get("streamed_bytes", 0) / 1e6 / tokens if tokens else None
        ),
        "stream_fills": getattr(loaded, "stream_fills", 0),
        "pipelined_records": bool(getattr(_stream_record(loaded), "pipelined", False)),
        "streamed_fills": cache.get("streamed_fills", 0),
        "stream_staging": getattr(loaded, "stream_staging", 0),
        "slots_per_layer": loaded.memory.plan.slots_per_layer,
        "hot_experts_per_layer": loaded.memory.plan.hot_experts_per_layer,
        "draft_pruned_per_layer": loaded.memory.plan.pruned_experts_per_layer,
        "num_experts": loaded.memory.plan.num_experts,
        "peak_gpu_memory_gb": peak_gpu_bytes / 1e9 if peak_gpu_bytes else None,
        "device": str(loaded.device),
    }


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    rows = [
        ("tokens", summary["new_tokens"]),
        ("TPOT (ms, decode only)", summary["tpot_ms"]),
        ("tokens/s", summary["tokens_per_s"]),
        ("prefill (ms)", summary["prefill_ms"]),
        ("first iteration (ms, in TPOT)", summary["first_iteration_ms"]),
        ("acceptance (per proposed token)", summary["acceptance_rate"]),
        ("accepted per iteration", summary["accepted_per_iteration"]),
        ("mean depth K", summary["mean_depth"]),
        ("expert cache hit rate", summary["hit_rate"]),
        (
            "prefetch precision / recall",
            (summary["prefetch_precision"], summary["prefetch_recall"]),
        ),
        ("host-to-device MB per token", summary["h2d_mb_per_token"]),
        ("transfer stall ms per token", summary["stall_ms_per_token"]),
        ("miss path", summary["miss_path"]),
        ("streamed MB per token", summary["streamed_mb_per_token"]),
        (
            "streamed fills (cap per layer)",
            (summary["streamed_fills"], summary["stream_fills"]),
        ),
        ("staged experts per layer (cap)", summary["stream_staging"]),
        ("expert slots per layer", f"{summary['slots_per_layer']}/{summary['num_experts']}"),
        ("pinned hot experts per layer", summary["hot_experts_per_layer"]),
        ("pruned draft experts per layer", summary.get("draft_pruned_per_layer", 0)),
        ("peak GPU memory (GB)", summary["peak_gpu_memory_gb"]),
        ("CUDA graphs captured ahead", summary.get("graphs_captured")),
        ("graph capture s (not in TPOT)", summary.get("graph_capture_s")),
        ("hot-set choice s (not in TPOT)", summary.get("hot_set_choice_s")),
        ("depth warm-up s (not in TPOT)", summary.get("depth_warmup_s")),
        ("depth costs (adaptive depth)", summary.get("depth_costs")),
        ("device", summary["device"]),
    ]
    auto = summary.get("auto_choice")
    if auto:
        rows.insert(
            -1,
            (
                "auto: replayed loads draft / plain",
                f"{auto['draft_loads']} / {auto['plain_loads']} -> {auto['decoded']}",
            ),
        )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        if isinstance(value, tuple):
            value = " / ".join(format_value(v) for v in value)
        print(f"{name:<{width}}  {format_value(value)}", file=out)


def apply_demo_defaults(args: argparse.Namespace, num_experts: int) -> bool:
    """Give the built-in demo model settings that exercise the whole Specter path.

    With every expert resident and the adaptive depth (the defaults for any other model),
    the tiny demo would mostly decode plainly: on a CPU its draft costs as much as its
    target, and the adaptive depth rightly turns speculation off. So, unless the user chose
    a depth or a memory option, the built-in model runs at depth 4 with half its experts'
    slots, so that the INT4 draft, the prefetch and expert-wise verification all do work.

    Returns:
        Whether the demo defaults were applied.
    """
    from specter_bench.cli import DEFAULT_MODEL

    chosen = args.depth is not None or args.gpu_memory_gb is not None
    chosen = chosen or args.slots_per_layer is not None
    if args.model != DEFAULT_MODEL or chosen:
        if args.depth is None:
            args.depth = "auto"
        return False
    args.depth = 4
    args.slots_per_layer = max(1, num_experts // 2)
    return True


def _stream_record(loaded: object) -> object | None:
    """The model's stream record (specter-models' ``StreamRecord``), None without one."""
    return getattr(getattr(loaded, "runtime", None), "stream_record", None)


def generate_engine_choices(
    miss_path: str, stream_fills: int | None, *, budgeted: bool, speculate: bool
) -> tuple[str, int]:
    """``generate``'s miss path and fills, with ``auto`` and None resolved.

    ``auto`` streams under a budget and loads otherwise (with every expert resident there
    is nothing to miss). Streaming is the measured faster path under a budget: on
    DeepSeek-V2-Lite at 24 GB the bench's ``specter`` (streamed) against
    ``specter-acquire``, and plain decoding streamed with fills (``specter-plain-fill``)
    against ``lru`` (acquired): 12.2 against 16.6 ms a token at 24 GB, 21.8 against 27.8
    at 16 GB (docs/benchmarks.md, twenty-eighth session). Fills default to the bench's
    width for plain streamed decoding, whose cache changes only through them, and to none
    when speculating, whose prefetches keep the free slots.

    Args:
        miss_path: ``"auto"``, ``"load"`` or ``"stream"``.
        stream_fills: candidate slots per layer, or None for the default.
        budgeted: the model is loaded under a memory budget or a slot count.
        speculate: the decode drafts (depth other than 0).

    Returns:
        ``(miss_path, stream_fills)``.
    """
    if miss_path == "auto":
        miss_path = "stream" if budgeted else "load"
    if stream_fills is None:
        stream_fills = FILL_CANDIDATES if miss_path == "stream" and not speculate else 0
    return miss_path, stream_fills


CAPTURE_AHEAD_POSITIONS = 256
"""Decode positions past the prompt whose windows ``generate`` captures before decoding (a
window spans 256 positions, so one or two windows); later windows capture at first use,
once per key, spread over the hundreds of tokens that reach them."""


def capture_decode_graphs(loaded: Any, *, prompt_length: int, speculate: bool) -> dict[str, Any]:
    """Capture, before decoding, the CUDA graphs the decode's steps will replay.

    Without this each new step shape (rows, KV window) pays an eager forward, its kernels'
    first compilation and a capture inside the timed decode: on DeepSeek-V2-Lite at 24 GB
    a 64-token plain decode measured 52 ms a token against the bench's 12 (which captures
    ahead, too). Only the windows of the first ``CAPTURE_AHEAD_POSITIONS`` decode positions
    (from ``prompt_length`` on) and only rows the decode can verify (1 when decoding
    plainly) are captured, so a long generation does not wait for windows it reaches
    hundreds of tokens later; then the model is reset.

    Args:
        loaded: the ``SpecterModel``.
        prompt_length: the prompt's tokens.
        speculate: the decode drafts (its verifications need every row bucket).

    Returns:
        ``{"graphs_captured": n, "graph_capture_s": s}``, both None where the model has no
        CUDA graphs (a CPU model).
    """
    if not getattr(loaded, "cuda_graphs", False):
        return {"graphs_captured": None, "graph_capture_s": None}
    print("capturing the decode's CUDA graphs ...", file=sys.stderr)
    started = time.perf_counter()
    captured = loaded.capture_step_graphs(
        prompt_length + CAPTURE_AHEAD_POSITIONS,
        min_length=prompt_length,
        max_rows=None if speculate else 1,
    )
    loaded.reset()  # the capturing forwards' KV rows, counts and cache statistics
    seconds = time.perf_counter() - started
    count = sum(captured.values())
    print(f"captured {count} CUDA graphs in {seconds:.1f} s", file=sys.stderr)
    return {"graphs_captured": count, "graph_capture_s": seconds}


DEPTH_WARMUP_TOKENS = 32
"""Tokens of the prompt ``generate --depth auto`` decodes once, unrecorded, before its
decode when every expert is resident (the bench's warm-up is as long)."""


def _depth_warmup_tokens(args: argparse.Namespace) -> int:
    asked = getattr(args, "depth_warmup", None)
    return DEPTH_WARMUP_TOKENS if asked is None else asked


def warm_adaptive_depth(
    controller: Any,
    loaded: Any,
    prompt_ids: list[int],
    tokens: int,
    *,
    every_expert_resident: bool,
) -> float | None:
    """With every expert resident, run ``--depth auto``'s first iterations before the decode.

    ``AdaptiveDepth`` starts knowing no draft or verify time: it speculates at its initial
    depth and its neighbours until it has measured enough to compare them with plain
    decoding. With every expert resident a draft step costs most of a target step, so on
    DeepSeek-V2-Lite those iterations are the slow part of a short generation
    (``generate`` at unlimited took 3.65 ms a token over 64 tokens where the bench, which
    warms up first, decodes plainly at 2.16). So ``controller`` decodes ``tokens`` tokens of
    the prompt, unrecorded, and then the model is reset (KV, counts, statistics). Under a
    budget nothing runs: a warm-up decode would also leave the prompt's experts in the
    cache, which the timed decode would then find.

    Args:
        controller: a greedy ``SpecController`` sharing the decode's depth policy, which
            keeps what it learns.

    Returns:
        The seconds the warm-up took, None where none ran (a fixed depth, some expert
        not resident, or no tokens).
    """
    adaptive = isinstance(controller.depth_policy, AdaptiveDepth)
    if not (adaptive and every_expert_resident and tokens >= 1):
        return None
    print(
        f"warming --depth auto up on {tokens} tokens of the prompt (every expert resident; "
        "not in TPOT) ...",
        file=sys.stderr,
    )
    started = time.perf_counter()
    controller.generate(prompt_ids, tokens)
    loaded.reset()
    return time.perf_counter() - started


def _pruned_from_file(
    stored: list[list[int]] | None, asked: int | str, args: argparse.Namespace
) -> list[list[int]] | None:
    """The pruned experts of a hot-set FILE's decode: the file's own with ``--draft-pruned
    auto`` (none if it names none), none with 0, and with a count the file's if it names
    that many (no routing here to choose others on)."""
    from specter_bench.cli import CommandError

    if asked == "auto":
        return stored
    if asked == 0:
        return None
    have = len(stored[0]) if stored else 0
    if have != asked:
        raise CommandError(
            f"--draft-pruned {asked} with --hot-experts {args.hot_experts}: that file names "
            f"{have} pruned experts per layer, and a hot-set file gives no routing to choose "
            "others on. Give --draft-pruned auto (the file's) or 0, or --hot-experts auto to "
            "choose on the prompt."
        )
    return stored


def generate_hot_experts(
    choice: str | None,
    *,
    speculate: bool,
    budget_gb: float | None,
    prompt_tokens: int,
    holds_every_expert: bool = False,
) -> str | None:
    """``generate``'s ``--hot-experts`` with its default resolved.

    By default a speculative decode under a memory budget pins a hot set chosen on the
    routing of the prompt and its first greedy tokens (``auto``), as the bench's ``specter``
    pins one: pinned experts need
    no INT4 draft copy, so the budget holds more FP16 slots, and the draft computes them
    exactly. On DeepSeek-V2-Lite at 24 GB without one, ``generate`` measured 28.3 ms a
    token with 30 slots a layer, where the bench's ``specter`` takes 10-11
    (docs/benchmarks.md, twenty-ninth session). No hot set without a budget or with one
    that holds every expert beside the draft (nothing to pin), when decoding plainly (no
    draft), or for a one-token prompt (``auto`` scores each half of the routing on the
    other).

    Args:
        choice: the option's value: None (not given), ``"none"``, ``"auto"`` or a file.
        speculate: the decode drafts (depth other than 0).
        budget_gb: ``--gpu-memory-gb`` (None: none, or unlimited).
        prompt_tokens: the prompt's length in tokens.
        holds_every_expert: the budget's plan with the draft has a slot for every expert.

    Returns:
        ``"auto"``, a file path, or None (no hot set).
    """
    if choice is None:
        pays = speculate and budget_gb is not None and not holds_every_expert
        return "auto" if pays and prompt_tokens >= 2 else None
    return None if choice == "none" else choice


def _draft_plan_holds_every_expert(config: Any, budget_gb: float | None, **plan_args: Any) -> bool:
    """Whether ``budget_gb``'s memory plan with the INT4 draft has a slot for every expert
    (False without a budget or where the plan does not fit)."""
    plan, _ = budget_plan(config, budget_gb, with_draft=True, **plan_args)
    return plan is not None and plan.slots_per_layer >= plan.num_experts


def run_generate(args: argparse.Namespace) -> int:
    """Load, stream the completion to stdout, then print statistics; exit status 0."""
    from specter_bench.cli import CommandError, resolve_device

    text = _prompt_text(args)
    sampling = _sampling(args)
    device = resolve_device(args.device)
    dtype = parse_dtype(None, device)
    config = model_config(args.model)
    num_experts = int(
        getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 1
    )
    if apply_demo_defaults(args, num_experts):
        print(
            f"demo settings: depth {args.depth}, {args.slots_per_layer} of {num_experts} expert "
            "slots per layer (choose --depth, --slots-per-layer or --gpu-memory-gb to change)",
            file=sys.stderr,
        )
    tokenizer = load_tokenizer(args.model, int(config.vocab_size))
    ids = tokenizer.encode(text)
    max_depth = 16 if args.depth == "auto" else args.depth
    need = len(ids) + args.max_new_tokens + max_depth + 2
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and need > limit:
        raise ValueError(
            f"the prompt ({len(ids)} tokens) plus --max-new-tokens {args.max_new_tokens} and "
            f"one verification of depth {max_depth} need {need} positions; {args.model} has "
            f"{limit}. Shorten the prompt or generate fewer tokens."
        )
    if args.slots_per_layer is not None and args.gpu_memory_gb is not None:
        raise ValueError("give --gpu-memory-gb or --slots-per-layer, not both.")
    max_seq_len = min(limit or need, -(-need // 64) * 64)

    def load(
        with_draft: bool,
        hot: list[list[int]] | None = None,
        pruned: list[list[int]] | None = None,
    ):
        return load_engine(
            args.model,
            budget_gb=args.gpu_memory_gb,
            slots_per_layer=args.slots_per_layer,
            with_draft=with_draft,
            policy="predictive" if with_draft else "lru",
            device=device,
            dtype=dtype,
            seed=args.weights_seed,
            max_seq_len=max_seq_len,
            options=EngineOptions.from_args(args),
            hot_experts=hot,
            draft_pruned_experts=pruned,
        )

    # Plain decoding (--depth 0) loads no INT4 draft: its memory goes to FP16 expert slots.
    speculate = args.depth != 0
    asked_path, asked_fills = args.miss_path, args.stream_fills
    budgeted = args.gpu_memory_gb is not None or args.slots_per_layer is not None
    args.miss_path, args.stream_fills = generate_engine_choices(
        asked_path, asked_fills, budgeted=budgeted, speculate=speculate
    )
    if not speculate and getattr(args, "keep_draft", False):
        raise CommandError(
            "--keep-draft keeps the INT4 draft to speculate with, but --depth 0 decodes plainly "
            "without one: leave --keep-draft out, or give --depth auto (or a depth >= 1)."
        )
    if not speculate and args.hot_experts not in (None, "none"):
        raise CommandError(
            f"--hot-experts {args.hot_experts} pins experts in place of their INT4 draft copies, "
            "but --depth 0 decodes without a draft (every expert slot is the cache's already): "
            "leave --hot-experts out, or give a depth."
        )
    chosen_by_default = args.hot_experts is None
    args.hot_experts = generate_hot_experts(
        args.hot_experts,
        speculate=speculate,
        budget_gb=args.gpu_memory_gb,
        prompt_tokens=len(ids),
        holds_every_expert=chosen_by_default
        and _draft_plan_holds_every_expert(
            config, args.gpu_memory_gb, dtype=dtype, max_seq_len=max_seq_len,
            staging_slots=args.stream_staging,
        ),
    )  # fmt: skip
    hot = pruned = None
    auto_choice = None
    choice_s = None
    if args.hot_experts == "auto":
        if args.gpu_memory_gb is None:
            raise CommandError(
                "--hot-experts auto chooses a hot set for a memory budget: give --gpu-memory-gb."
            )
        asked = getattr(args, "hot_set_tokens", CONTINUATION_TOKENS)
        continuation = min(asked, args.max_new_tokens)
        routed = (
            f"the routing of the prompt and its first {continuation} greedy tokens"
            if continuation
            else "the prompt's routing"
        )
        print(
            f"choosing the hot set on {routed} (a target-only load"
            + (
                "; the default under a budget, --hot-experts none skips it"
                if chosen_by_default
                else ""
            )
            + ") ...",
            file=sys.stderr,
        )
        # --depth auto may decode without the draft: where the same routing, replayed
        # through the draftless slots, moves fewer experts than through the hot set's.
        compare_plain = args.depth == "auto" and not getattr(args, "keep_draft", False)
        chose_from = time.perf_counter()
        try:
            prompt_choice = choose_prompt_engine(
                lambda: load(with_draft=False), args.gpu_memory_gb, ids, dtype=dtype,
                max_seq_len=max_seq_len, compare_plain=compare_plain,
                staging_slots=args.stream_staging, continuation_tokens=continuation,
                pruned_per_layer=getattr(args, "draft_pruned", "auto"),
            )  # fmt: skip
            choice = prompt_choice.hot
        except MemoryBudgetError:
            if not chosen_by_default:
                raise
            prompt_choice = choice = None  # the load below says what does not fit, and what would
        choice_s = time.perf_counter() - chose_from
        if prompt_choice is not None and prompt_choice.plain is not None:
            auto_choice = prompt_choice.as_dict()
            print(
                f"auto: the routing of {prompt_choice.routing_tokens} positions moves "
                f"{prompt_choice.draft_loads} experts with the "
                f"draft ({choice.slots_per_layer} slots a layer, {choice.per_layer} pinned) and "
                f"{prompt_choice.plain.loads} without it ({prompt_choice.plain.slots_per_layer} "
                f"slots a layer, each read in place: {IN_PLACE_READ_COST} of the draft's "
                "loads in link time): "
                + (
                    "decoding plainly, without the INT4 draft (--keep-draft speculates anyway)"
                    if prompt_choice.decode_plainly
                    else "speculating"
                ),
                file=sys.stderr,
            )
            if prompt_choice.decode_plainly:
                speculate, args.depth, choice = False, 0, None
                args.miss_path, args.stream_fills = generate_engine_choices(
                    asked_path, asked_fills, budgeted=budgeted, speculate=False
                )
        if choice is not None:
            print(f"hot set: {choice.describe()}", file=sys.stderr)
            hot = choice.hot_experts if choice.per_layer else None
            pruned = choice.pruned_experts or None
    elif args.hot_experts is not None:
        hot, stored = read_hot_set(args.hot_experts, args.gpu_memory_gb)
        pruned = _pruned_from_file(stored, getattr(args, "draft_pruned", "auto"), args)
    print(f"loading {args.model} on {device} ...", file=sys.stderr)
    started = time.perf_counter()
    # The draftless plan (None: no budget, or it does not fit): a hint when only it fits.
    plain, plain_short = plain_plan(
        config, args.gpu_memory_gb, dtype=dtype, max_seq_len=max_seq_len,
        staging_slots=args.stream_staging,
    )  # fmt: skip
    try:
        loaded = load(with_draft=speculate, hot=hot, pruned=pruned if speculate else None)
    except MemoryBudgetError as exc:
        if not speculate:
            raise
        if plain is None:
            raise neither_fits(exc, plain_short) from exc
        raise CommandError(
            f"{exc} Without the INT4 draft it fits: --depth 0 decodes plainly with "
            f"{plain.slots_per_layer} FP16 expert slots per layer."
        ) from exc
    print(f"loaded {loaded!r} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    record = _stream_record(loaded)
    if record is not None and not speculate and args.miss_path == "stream":
        # Plain streamed steps choose their fills before the step before is counted (on
        # deferred records, CUDA's): 8-28% less time a token on the H200 (thirtieth session).
        record.pipelined = True
    slots = loaded.memory.plan.slots_per_layer
    if speculate and plain is not None and plain.slots_per_layer > slots:
        print(
            f"note: the INT4 draft leaves {slots} FP16 expert slots per layer in this budget; "
            f"plain decoding (--depth 0) would have {plain.slots_per_layer}",
            file=sys.stderr,
        )
    if loaded.tokenizer is None and hasattr(tokenizer, "offset"):
        print(
            "note: this model has random weights and no tokenizer: its text is noise (bytes)",
            file=sys.stderr,
        )
    depth_policy = make_depth_policy(args.depth, max_depth)

    def controller_for(sampled: SamplingConfig) -> SpecController:
        return SpecController(
            loaded.draft if speculate else None,
            loaded.target,
            cache=DecodeWindow(
                loaded.cache,
                loaded.prefetcher,
                streamed_plain=not speculate and args.miss_path == "stream",
            ),
            depth=depth_policy,
            sampling=sampled,
        )

    controller = controller_for(sampling)
    capture = capture_decode_graphs(loaded, prompt_length=len(ids), speculate=speculate)
    memory = None  # (file, setup, primed): where the policy's costs are kept
    if isinstance(depth_policy, AdaptiveDepth) and not getattr(args, "no_depth_memory", False):
        setup = engine_setup(
            args.model, loaded, device=device, dtype=dtype, budget_gb=args.gpu_memory_gb,
            max_depth=max_depth,
        )  # fmt: skip
        kept, primed = recall_depth_costs(depth_policy, setup)
        memory = (kept, setup, primed)
    warmup_s = warm_adaptive_depth(
        controller_for(SamplingConfig()),
        loaded,
        ids,
        min(_depth_warmup_tokens(args), args.max_new_tokens),
        every_expert_resident=slots >= num_experts,
    )
    eos = getattr(tokenizer, "eos_token_id", None)
    stop = [eos] if isinstance(eos, int) and loaded.tokenizer is not None else []
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    stream = controller.stream(ids, args.max_new_tokens, stop_token_ids=stop)
    out = sys.stdout
    generated: list[int] = []
    shown = ""
    if not args.no_stream:
        out.write(text)
        out.flush()
    for token in stream:
        generated.append(token)
        if args.no_stream:
            continue
        # Decode everything so far and print the new suffix: tokens that merge into one
        # character (bytes of UTF-8) appear once complete.
        decoded = tokenizer.decode(generated)
        if decoded.startswith(shown) and not decoded.endswith("\ufffd"):
            out.write(decoded[len(shown) :])
            out.flush()
            shown = decoded
    final = tokenizer.decode(generated)
    if args.no_stream:
        out.write(text + final)
    elif final.startswith(shown):
        out.write(final[len(shown) :])
    out.write("\n")
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    if memory is not None:
        write_depth_costs(memory[0], memory[1], depth_policy.export_costs())
    summary = generation_summary(loaded, stream.stats, peak)
    summary["stop_reason"] = stream.stop_reason
    summary["auto_choice"] = auto_choice
    summary["hot_set_choice_s"] = choice_s
    summary.update(capture)
    summary["depth_warmup_s"] = warmup_s
    summary["depth_costs"] = (
        None
        if memory is None
        else ("primed from an earlier run" if memory[2] else "first run of this setup")
    )
    if args.json:
        print(json.dumps(summary))
    else:
        print("-" * 40)
        _print_summary(summary, out)
    return 0

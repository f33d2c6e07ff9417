"""``specter generate``: complete a prompt through the engine, streaming text, then print
statistics.

With no arguments it runs the built-in demo ``specter-code-tiny`` (a small trained
DeepSeek-V2-architecture MoE shipped with specter-models) on the GPU when there is one and
on the CPU otherwise, through the full Specter path: INT4 draft, expert cache, verification.
The arguments become an ``EngineConfig``; ``Engine.from_config`` does the rest, with the
prompt as its calibration prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from specter_bench.batched_generation import all_prompts, run_batch
from specter_bench.commands.args import (
    DEFAULT_MODEL,
    DEFAULT_PROMPT,
    CommandError,
    add_batch_args,
    add_cpu_expert_args,
    add_model_args,
    auto_or_non_negative_int,
    non_negative_float,
    non_negative_int,
    parse_budget_or_auto,
    parse_depth,
    positive_int,
    resolve_device,
    top_p,
)
from specter_bench.commands.generate_summary import print_summary

__all__ = ["apply_demo_defaults", "engine_config_from_args", "register", "run"]

MAX_AUTO_DEPTH = 16
"""The largest K of ``--depth auto``."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter generate``."""
    gen = subparsers.add_parser(
        "generate",
        help="generate text (default command; default model specter-code-tiny)",
        description="Complete a prompt, streaming text as it is committed, then print statistics.",
    )
    gen.add_argument("prompt", nargs="?", help="the prompt text (default: a code prompt)")
    gen.add_argument("--prompt-file", help="read the prompt from this file")
    gen.add_argument(
        "--prompt", dest="prompts", action="append", metavar="TEXT",
        help="one more prompt (repeat it): decoded with the others, up to --max-batch at once",
    )  # fmt: skip
    add_batch_args(gen)
    add_model_args(gen, default=DEFAULT_MODEL, weights_seed_flag="--weights-seed")
    gen.add_argument(
        "--gpu-memory-gb",
        type=parse_budget_or_auto,
        default=None,
        help="GPU memory budget in GB, auto (the free GPU memory at start less a margin; "
        "`specter info` shows what it chooses) or unlimited (every expert resident). Default: "
        "auto on a GPU, none on the CPU",
    )
    gen.add_argument(
        "--draft",
        default="rtn",
        metavar="rtn|FOLDER",
        help="the INT4 draft: rtn (the experts quantized on load, round-to-nearest; default) "
        "or a GPTQ checkpoint folder of the same model",
    )
    gen.add_argument(
        "--slots-per-layer", type=positive_int, help="expert slots per layer (instead of a budget)"
    )
    gen.add_argument(
        "--depth",
        type=parse_depth,
        default=None,
        help="depth K or auto (default: auto; the built-in demo model without memory options: "
        "4); 0 decodes plainly and loads no INT4 draft, so a budget's draft memory becomes "
        "FP16 expert slots. auto adapts K as it decodes and, under a budget, decodes plainly "
        "where plain decoding was faster in a timed trial at load (--trial-tokens; without one, "
        "where the prompt's routing, replayed through the draftless slots, moves fewer experts "
        "than through the draft's; see --keep-draft)",
    )
    gen.add_argument(
        "--trial-tokens",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="with --depth auto under a budget: at load, decode N tokens of the prompt with "
        "and without the INT4 draft, timed, and keep the faster (one or two more loads; "
        "default 32 on CUDA; 0: no trial)",
    )
    gen.add_argument(
        "--keep-draft",
        action="store_true",
        help="with --depth auto under a budget, always load the INT4 draft and speculate, "
        "even where plain decoding would move fewer experts",
    )
    gen.add_argument(
        "--depth-warmup",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="with --depth auto and every expert resident, decode N greedy tokens after the "
        "prompt once, unrecorded, so the adaptive depth starts from measured draft and verify "
        "times (default: a quarter of --max-new-tokens, at most 32, none under 16 new tokens; "
        "0: none)",
    )
    gen.add_argument(
        "--no-depth-memory",
        action="store_true",
        help="with --depth auto, neither start from the step costs an earlier run of the same "
        "setup measured nor keep this run's (kept under $SPECTER_CACHE_DIR, default "
        "~/.cache/specter)",
    )
    gen.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=128,
        help="the most tokens to generate after the prompt (default 128)",
    )
    gen.add_argument(
        "--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default)"
    )
    gen.add_argument(
        "--top-p", type=top_p, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)"
    )
    gen.add_argument(
        "--top-k",
        type=non_negative_int,
        default=0,
        help="sample from the k most likely tokens (default 0: all)",
    )
    gen.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sampler: the same tokens again at a fixed --depth (an adaptive "
        "depth picks K from measured times, and K changes which random draws a token uses; "
        "the output distribution is the target's either way)",
    )
    gen.add_argument(
        "--hot-experts",
        metavar="FILE|auto|none",
        default=None,
        help="pin a hot set under the budget: those experts stay in FP16 slots and the draft "
        "computes them in FP16. FILE: a `specter bench` results file with a hot_experts "
        'record at --gpu-memory-gb, or JSON {"hot_experts": [[ids], ...]}; auto: chosen on '
        "the routing of the prompt and its first --hot-set-tokens greedy tokens at "
        "--gpu-memory-gb (one extra target-only load decodes them); none: no hot "
        "set (default: auto when speculating under --gpu-memory-gb, else none)",
    )
    gen.add_argument(
        "--draft-pruned",
        type=auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft skips (their INT4 memory buys FP16 slots; the "
        "target still computes them, so the output is unchanged). With --hot-experts auto "
        "the chosen routing's least routed: default auto, a third of the experts under a "
        "budget that leaves some expert without a slot; 0: none. With a hot-set FILE: the "
        "file's pruned experts (auto), none (0), or N if the file names N",
    )
    gen.add_argument(
        "--hot-set-tokens",
        type=non_negative_int,
        default=32,
        help="with --hot-experts auto: greedy tokens decoded after the prompt whose routing "
        "chooses the hot set too (at most --max-new-tokens; 0: the prompt's routing alone; "
        "default 32: decoded tokens predict the decode's experts better than the prompt)",
    )
    gen.add_argument(
        "--stream-fills",
        type=non_negative_int,
        default=None,
        help="with --miss-path stream: candidate slots per layer a verification fills with "
        "the experts it streams, so they stay resident for no extra transfer (default: as "
        "the bench's specter-plain-fill for plain decoding, --depth 0, whose cache changes "
        "only through fills; 0 when speculating, whose prefetches keep the free slots)",
    )
    gen.add_argument(
        "--stream-staging",
        type=non_negative_int,
        default=0,
        help="with --miss-path stream (float16): experts a verification copies per layer "
        "into a device staging buffer with a wide kernel before its expert kernel reads "
        "them there (fixed state in the memory plan; default 0: none)",
    )
    add_cpu_expert_args(gen, sweep=False)
    gen.add_argument("--no-stream", action="store_true", help="print the text at the end only")
    gen.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (prompt, text, token ids, every statistic) to stdout "
        "instead of the text and the table; progress stays on stderr",
    )
    gen.add_argument(
        "--verbose", action="store_true", help="print every statistic, not only those that apply"
    )
    gen.set_defaults(run=run)


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise CommandError("give the prompt as an argument or with --prompt-file, not both.")
    if args.prompt_file is not None:
        text = read_prompt_file(Path(args.prompt_file))
    else:
        text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    if not text:
        raise CommandError("the prompt is empty; give some text to complete.")
    return text


def read_prompt_file(path: Path) -> str:
    """The text of ``--prompt-file``.

    Raises:
        CommandError: the path is missing, a folder, unreadable or not UTF-8 text.
    """
    if path.is_dir():
        raise CommandError(f"--prompt-file {path}: is a folder; give a text file.")
    if not path.exists():
        raise CommandError(f"--prompt-file {path}: no such file.")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(
            f"--prompt-file {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start}); give a text file, or convert it to UTF-8."
        ) from exc
    except OSError as exc:
        raise CommandError(f"--prompt-file {path}: cannot be read: {exc.strerror}.") from exc


def _check_sampling(args: argparse.Namespace) -> None:
    if args.temperature == 0 and (args.top_p != 1 or args.top_k != 0):
        raise CommandError("--top-p/--top-k need sampling: give --temperature > 0.")


def _sampling(args: argparse.Namespace) -> Any:
    from specter_spec import SamplingConfig

    if args.temperature == 0:
        return SamplingConfig.greedy()
    return SamplingConfig(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )


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
    chosen = args.depth is not None or args.gpu_memory_gb is not None
    chosen = chosen or args.slots_per_layer is not None
    if args.model != DEFAULT_MODEL or chosen:
        if args.depth is None:
            args.depth = "auto"
        return False
    args.depth = 4
    args.slots_per_layer = max(1, num_experts // 2)
    return True


def engine_config_from_args(args: argparse.Namespace, *, device: str, prompt_tokens: int) -> Any:
    """The ``EngineConfig`` of ``specter generate``'s arguments (demo defaults applied).

    The KV cache holds the prompt, ``--max-new-tokens`` and one verification of the largest
    depth, rounded up to 64 positions; the hot-set continuation and the depth warm-up are
    at most ``--max-new-tokens`` long.

    Raises:
        ValueError: a prompt and ``--max-new-tokens`` past the model's positions.
        CommandError: options that contradict each other.
    """
    from specter_models import (
        BatchConfig,
        CpuExpertsConfig,
        EngineConfig,
        KernelConfig,
        LoadConfig,
        MemoryConfig,
        SpeculationConfig,
    )
    from specter_models.engine.warmup import proportionate_warmup_tokens

    max_depth = MAX_AUTO_DEPTH if args.depth == "auto" else args.depth
    need = prompt_tokens + args.max_new_tokens + max_depth + 2
    limit = args.max_positions
    if limit is not None and need > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) plus --max-new-tokens {args.max_new_tokens} "
            f"and one verification of depth {max_depth} need {need} positions; {args.model} "
            f"has {limit}. Shorten the prompt or generate fewer tokens."
        )
    if args.slots_per_layer is not None and args.gpu_memory_gb is not None:
        raise ValueError("give --gpu-memory-gb or --slots-per-layer, not both.")
    if args.depth == 0 and args.keep_draft:
        raise CommandError(
            "--keep-draft keeps the INT4 draft to speculate with, but --depth 0 decodes plainly "
            "without one: leave --keep-draft out, or give --depth auto (or a depth >= 1)."
        )
    if args.depth == 0 and args.hot_experts not in (None, "none"):
        raise CommandError(
            f"--hot-experts {args.hot_experts} pins experts in place of their INT4 draft copies, "
            "but --depth 0 decodes without a draft (every expert slot is the cache's already): "
            "leave --hot-experts out, or give a depth."
        )
    if args.hot_experts == "auto" and args.gpu_memory_gb is None:
        raise CommandError(
            "--hot-experts auto chooses a hot set for a memory budget: give --gpu-memory-gb."
        )
    warmup = args.depth_warmup
    if warmup is None:
        warmup = proportionate_warmup_tokens(args.max_new_tokens)
    return EngineConfig(
        load=LoadConfig(
            model=args.model,
            device=device,
            weights_seed=args.weights_seed,
            draft=getattr(args, "draft", "rtn"),
        ),
        memory=MemoryConfig(
            gpu_memory_gb=args.gpu_memory_gb,
            slots_per_layer=args.slots_per_layer,
            hot_experts=args.hot_experts,
            hot_set_tokens=min(args.hot_set_tokens, args.max_new_tokens),
            draft_pruned=args.draft_pruned,
            miss_path=args.miss_path,
            stream_fills=args.stream_fills,
            stream_staging=args.stream_staging,
            max_seq_len=min(limit or need, -(-need // 64) * 64),
        ),
        kernels=KernelConfig(
            batch_invariant=args.batch_invariant,
            cuda_graphs=args.cuda_graphs,
            piecewise_graphs=args.piecewise_graphs,
            shared_overlap=args.shared_overlap,
        ),
        speculation=SpeculationConfig(
            depth=args.depth,
            max_depth=MAX_AUTO_DEPTH,
            keep_draft=args.keep_draft,
            depth_memory=not args.no_depth_memory,
            warmup_tokens=min(warmup, args.max_new_tokens),
            trial_tokens=getattr(args, "trial_tokens", None),
        ),
        cpu_experts=CpuExpertsConfig(
            mode=getattr(args, "cpu_experts", "off"), threads=getattr(args, "cpu_threads", None)
        ),
        batch=BatchConfig(max_batch=getattr(args, "max_batch", 1)),
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _budget_advice(args: argparse.Namespace, exc: Exception) -> str:
    """A budget-too-small error in terms of ``specter generate``'s own options."""
    need = getattr(exc, "needed_gb", None)
    if need is None:
        return str(exc)
    budget = getattr(exc, "budget_gb", None) or args.gpu_memory_gb
    smallest = math.ceil(need * 100) / 100
    plain = getattr(exc, "plain", None)
    plain_need = getattr(exc, "plain_needed_gb", None)
    message = (
        f"--gpu-memory-gb {budget:g} is too small for {args.model}"
        + (" with its INT4 draft" if plain is not None or plain_need is not None else "")
        + f": it needs at least {smallest:g} GB ({exc.breakdown}). "
        f"Give --gpu-memory-gb {smallest:g} or more"
    )
    if plain is not None:
        message += (
            f", or --depth 0: plain decoding, without the draft, fits in {budget:g} GB with "
            f"{plain.slots_per_layer} FP16 expert slots per layer"
        )
    elif plain_need is not None and math.ceil(plain_need * 100) / 100 < smallest:
        message += f" (or {math.ceil(plain_need * 100) / 100:g} with --depth 0, no draft)"
    return message + "; a shorter prompt or fewer --max-new-tokens shrinks the KV cache."


def _emit(args: argparse.Namespace, text: str, generation: Any) -> None:
    """Stream the completion (or, with ``--json``, run it and print one JSON object)."""
    out = sys.stdout
    if args.json:
        generation.result()
        record = {
            "prompt": text,
            "text": generation.text,
            "token_ids": generation.token_ids,
            "stop_reason": generation.stop_reason,
            "statistics": generation.stats,
        }
        print(json.dumps(record), file=out)
        return
    if args.no_stream:
        out.write(text + generation.result().text)
    else:
        out.write(text)
        out.flush()
        for chunk in generation:
            if chunk.text:
                out.write(chunk.text)
                out.flush()
    out.write("\n")
    print("-" * 40, file=out)
    print_summary(generation.stats, out, verbose=args.verbose)


def run(args: argparse.Namespace) -> int:
    """Set the engine up, stream the completion to stdout, then print statistics; exit
    status 0."""
    _check_sampling(args)
    texts = all_prompts(args, _prompt_text(args))
    text = texts[0]
    from specter_models import Engine, MemoryBudgetError
    from specter_models.engine.generation import NonFiniteLogitsError
    from specter_models.engine.model_source import load_tokenizer, model_config, num_experts_of

    sampling = _sampling(args)
    device = resolve_device(args.device)
    config = model_config(args.model)
    num_experts = num_experts_of(config)
    if apply_demo_defaults(args, num_experts):
        _stderr(
            f"demo settings: depth {args.depth}, {args.slots_per_layer} of {num_experts} expert "
            "slots per layer (choose --depth, --slots-per-layer or --gpu-memory-gb to change)"
        )
    elif args.gpu_memory_gb is None and args.slots_per_layer is None:
        args.gpu_memory_gb = "auto" if device.startswith("cuda") else None
    if args.gpu_memory_gb == "unlimited":
        args.gpu_memory_gb = None
    args.max_positions = getattr(config, "max_position_embeddings", None)
    tokenizer = load_tokenizer(args.model, int(config.vocab_size))
    prompt_tokens = max(len(tokenizer.encode(t)) for t in texts)
    engine_config = engine_config_from_args(args, device=device, prompt_tokens=prompt_tokens)
    try:
        engine = Engine.from_config(engine_config, calibration_prompt=text, log=_stderr)
    except MemoryBudgetError as exc:
        raise CommandError(_budget_advice(args, exc)) from exc
    try:
        if len(texts) > 1 or args.max_batch > 1:
            return run_batch(args, engine, texts, sampling)
        generation = engine.generate(text, max_new_tokens=args.max_new_tokens, sampling=sampling)
        _emit(args, text, generation)
    except NonFiniteLogitsError as exc:
        from specter_models.engine.non_finite import first_non_finite_layer

        where = first_non_finite_layer(engine.model, list(engine.tokenizer.encode(text)))
        found = f" The first non-finite values appear in {where}." if where else ""
        raise CommandError(f"{exc}{found}") from exc
    return 0

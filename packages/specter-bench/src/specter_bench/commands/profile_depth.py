"""``specter profile-depth``: mean TPOT at each candidate depth, and the best one."""

from __future__ import annotations

import argparse
import sys

from specter_bench.commands.args import (
    DEFAULT_MODEL,
    add_model_args,
    add_prompt_source_args,
    parse_budget,
    parse_dtype,
    parse_int_list,
    positive_int,
    prompt_source_config,
    resolve_device,
)

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter profile-depth``."""
    prof = subparsers.add_parser(
        "profile-depth",
        help="sweep speculation depths and pick the lowest TPOT",
        description="Measure mean TPOT at each candidate depth (specter_spec.profile_depth).",
    )
    add_model_args(prof, default=DEFAULT_MODEL)
    prof.add_argument("--gpu-memory-gb", type=parse_budget, default=None)
    prof.add_argument("--depths", type=parse_int_list, default=[0, 2, 4, 8, 16])
    add_prompt_source_args(prof)
    prof.add_argument("--max-new-tokens", type=positive_int, default=64)
    prof.add_argument("--repeats", type=positive_int, default=1)
    prof.add_argument("--dtype", default=None, help="default: float16 on GPU, float32 on CPU")
    prof.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Sweep depths with ``specter_spec.profile_depth`` on Specter; print the best depth."""
    from tqdm import tqdm

    from specter_bench.model_loading import EngineOptions, load_engine
    from specter_bench.prompt_encoding import encode_prompt
    from specter_bench.prompt_sources import load_prompts
    from specter_bench.tables import markdown_table
    from specter_models.engine.decode_window import DecodeWindow
    from specter_models.engine.model_source import load_tokenizer, model_config
    from specter_spec import profile_depth

    device = resolve_device(args.device)
    dtype = parse_dtype(args.dtype, device)
    config = model_config(args.model)
    tokenizer = load_tokenizer(args.model, config.vocab_size)
    prompts = [
        encode_prompt(p.text, tokenizer, args.max_prompt_tokens, vocab_size=config.vocab_size)
        for p in load_prompts(prompt_source_config(args, default_limit=4))
    ]
    need = max(len(p) for p in prompts) + args.max_new_tokens + max(args.depths) + 2
    loaded = load_engine(
        args.model,
        budget_gb=args.gpu_memory_gb,
        with_draft=True,
        policy="predictive",
        device=device,
        dtype=dtype,
        seed=args.weights_seed,
        max_seq_len=-(-need // 64) * 64,
        options=EngineOptions.from_args(args),
    )
    print(f"{loaded!r}: depths {args.depths} over {len(prompts)} prompts")
    depths = sorted(set(args.depths))
    runs = len(depths) * (1 + args.repeats * len(prompts))  # one warm-up per depth
    bar = tqdm(total=runs, desc="profile-depth", unit="run", file=sys.stderr)
    window = DecodeWindow(loaded.cache, loaded.prefetcher)

    def reset() -> None:  # called before every run: the progress bar's tick
        bar.update(1)
        loaded.reset()
        window.started = False

    try:
        profile = profile_depth(
            (loaded.draft, loaded.target),
            prompts,
            depths,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            cache=window,
            reset=reset,
        )
    finally:
        bar.close()
    rows = [
        [k, 1e3 * profile.mean_tpot_s[k], profile.acceptance_rate[k],
         profile.mean_accepted_per_iteration[k], "best" if k == profile.best_depth else ""]
        for k in sorted(profile.mean_tpot_s)
    ]  # fmt: skip
    print(markdown_table(["K", "TPOT ms", "acceptance", "accepted/iter", ""], rows))
    print(f"best depth: {profile.best_depth}")
    return 0

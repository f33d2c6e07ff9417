"""``specter bench`` and ``specter profile-depth``: arguments to a run, a table printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from specter_bench.bench_runner import BenchRunner
from specter_bench.experiments import DEFAULT_CALIBRATION_PROMPTS, EXPERIMENTS, BenchConfig
from specter_bench.model_loading import EngineOptions
from specter_bench.prompt_sources import PromptSourceConfig
from specter_bench.tables import targets_table, tpot_table

__all__ = ["bench_config_from_args", "parse_dtype", "run_bench", "run_profile_depth"]

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_DTYPES["float64"] = torch.float64


def parse_dtype(text: str | None, device: str) -> torch.dtype:
    """``float16`` (default on a GPU), ``bfloat16``, ``float32`` (default on a CPU), ``float64``.

    Raises:
        ValueError: an unknown name.
    """
    if text is None:
        return torch.float16 if device.startswith("cuda") else torch.float32
    if text not in _DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(_DTYPES)}, got {text!r}.")
    return _DTYPES[text]


def _prompt_config(args: argparse.Namespace, default_limit: int | None) -> PromptSourceConfig:
    limit = args.num_prompts if args.num_prompts is not None else default_limit
    return PromptSourceConfig(
        source=args.prompts,
        path=args.prompts_path,
        field=args.prompt_field,
        split=args.split,
        limit=limit,
    )


def bench_config_from_args(args: argparse.Namespace, device: str) -> BenchConfig:
    """A :class:`BenchConfig` from ``specter bench``'s arguments.

    Raises:
        ValueError: a missing model, an unknown experiment or system, or bad values.
    """
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
    if args.depths is not None:
        kwargs["sweep_depths"] = tuple(args.depths)
        kwargs["working_set_depths"] = tuple(d for d in args.depths if d >= 1) or (1,)
    return BenchConfig(
        model=args.model,
        experiment=args.experiment,
        systems=systems,
        budgets=budgets,
        prompts=_prompt_config(args, default_limit=3),
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
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
        command=getattr(args, "invocation", None),
        **kwargs,  # type: ignore[arg-type]
    )


def run_bench(args: argparse.Namespace) -> int:
    """Run the experiment, print the TPOT and target tables; exit status 0."""
    from specter_bench.cli import resolve_device

    config = bench_config_from_args(args, resolve_device(args.device))
    result = BenchRunner(config).run()
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    if tpot:
        print(tpot_table(tpot))
        print(targets_table(tpot))
    kinds = sorted({r["kind"] for r in result.records})
    print(f"wrote {len(result.records)} records ({', '.join(kinds)}) to {result.path}")
    for line in result.skipped:
        print(f"not measured: {line}")
    return 0


def run_profile_depth(args: argparse.Namespace) -> int:
    """Sweep depths with ``specter_spec.profile_depth`` on Specter; print the best depth."""
    from specter_bench.cli import resolve_device
    from specter_bench.engine_systems import DecodeWindow
    from specter_bench.model_loading import load_engine, load_tokenizer, model_config
    from specter_bench.prompt_encoding import encode_prompt
    from specter_bench.prompt_sources import load_prompts
    from specter_bench.tables import markdown_table
    from specter_spec import profile_depth

    device = resolve_device(args.device)
    dtype = parse_dtype(args.dtype, device)
    config = model_config(args.model)
    tokenizer = load_tokenizer(args.model, config.vocab_size)
    prompts = [
        encode_prompt(p.text, tokenizer, args.max_prompt_tokens, vocab_size=config.vocab_size)
        for p in load_prompts(_prompt_config(args, default_limit=4))
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

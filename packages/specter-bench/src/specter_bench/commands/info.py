"""``specter info``: the GPU, library versions, and a model's memory plan at a budget."""

from __future__ import annotations

import argparse

from specter_bench.commands.args import (
    DEFAULT_MODEL,
    auto_or_non_negative_int,
    non_negative_int,
    parse_budget,
    positive_int,
)

__all__ = ["describe_machine", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter info``."""
    info = subparsers.add_parser(
        "info",
        help="GPU, versions, and the memory plan for a model at a budget",
        description="Print the GPU, library versions and, with --model, the memory plan: "
        "fixed state, INT4 draft, KV, buffers, slots per layer, expected peak.",
    )
    info.add_argument("--model", default=DEFAULT_MODEL)
    info.add_argument("--gpu-memory-gb", type=parse_budget, default=None)
    info.add_argument("--max-seq-len", type=positive_int, default=None)
    info.add_argument(
        "--hot-experts",
        type=non_negative_int,
        default=0,
        help="experts per layer pinned as a hot set (they leave the INT4 draft; default 0)",
    )
    info.add_argument(
        "--draft-pruned",
        type=auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft skips (no INT4 copy), or auto: the count bench and "
        "generate take by default (E // 3 under a budget that leaves some expert without a "
        "slot, else 0; default auto)",
    )
    info.add_argument(
        "--stream-staging",
        type=non_negative_int,
        default=0,
        help="FP16 experts of the streamed path's staging buffer (fixed state; default 0)",
    )
    info.set_defaults(run=run)


def describe_machine() -> str:
    """GPU (name, memory, capability) or its absence, and the versions that matter."""
    import torch

    from specter_bench.run_identity import git_commit, gpu_name, package_versions

    lines = []
    name = gpu_name()
    if name is None:
        lines.append("GPU: none visible to torch (torch.cuda.is_available() is False): CPU only")
    else:
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"GPU: {name}, {props.total_memory / 1e9:.1f} GB, {props.multi_processor_count} SMs, "
            f"compute capability {props.major}.{props.minor}"
        )
    versions = package_versions()
    lines.append("versions: " + ", ".join(f"{k} {v or 'missing'}" for k, v in versions.items()))
    lines.append(f"git commit: {git_commit()}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the machine and, for ``args.model``, the memory plan at ``args.gpu_memory_gb``
    (with ``args.hot_experts`` experts per layer pinned, ``args.draft_pruned`` pruned from the
    draft (``"auto"``: ``resolve_pruned_per_layer``, the count bench and generate take by
    default) and a staging buffer of ``args.stream_staging`` experts)."""
    from specter_bench.bench_record import budget_label
    from specter_models import MemoryBudgetError, plan_memory, resolve_pruned_per_layer
    from specter_models.engine.model_source import model_config
    from specter_models.engine.plans import neither_fits, plain_plan

    print(describe_machine())
    config = model_config(args.model)
    kwargs = {} if args.max_seq_len is None else {"max_seq_len": args.max_seq_len}
    hot = getattr(args, "hot_experts", 0)
    staging = getattr(args, "stream_staging", 0)
    budget = args.gpu_memory_gb
    pruned = resolve_pruned_per_layer(
        config, budget, getattr(args, "draft_pruned", 0), hot_experts_per_layer=hot, **kwargs
    )
    try:
        plan = plan_memory(
            config, budget, hot_experts_per_layer=hot, staging_slots=staging,
            pruned_experts_per_layer=pruned, **kwargs,
        )  # fmt: skip
    except MemoryBudgetError as exc:
        plan, too_small = None, exc
    plain, plain_short = plain_plan(config, budget, staging_slots=staging, **kwargs)
    if plan is None and plain is None:
        raise neither_fits(too_small, plain_short)
    print()
    print(f"memory plan: {args.model} ({config.model_type}) at {budget_label(budget)}")
    if plan is None:  # the model fits without its draft only: why, then that plan
        print(f"with the INT4 draft: does not fit: {too_small}")
        print("without the INT4 draft (generate --depth 0, plain decoding):")
        print(plain.describe())
        return 0
    print(plan.describe())
    if budget is not None and not hot:
        print(
            "note: bench and generate pin a hot set chosen on routing (calibration decodes, or "
            "the prompt): a pinned expert's INT4 copy is not held, so each one frees draft "
            "memory for slots; --hot-experts N shows the plan with N pinned per layer"
        )
    if plain is not None and plain.slots_per_layer > plan.slots_per_layer:
        print(
            f"without the INT4 draft (generate --depth 0): {plain.slots_per_layer}/"
            f"{plain.num_experts} FP16 expert slots per layer, expected peak "
            f"{plain.expected_peak_bytes / 1e9:.2f} GB"
        )
    return 0

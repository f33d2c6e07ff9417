"""``specter info``: the GPU, the host's CPU and memory bandwidth, library versions, and a
model's memory plan at a budget."""

from __future__ import annotations

import argparse

from specter_bench.commands.args import (
    DEFAULT_MODEL,
    auto_or_non_negative_int,
    non_negative_int,
    parse_budget_or_auto,
    positive_int,
)

__all__ = ["describe_machine", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter info``."""
    info = subparsers.add_parser(
        "info",
        help="GPU, versions, and the memory plan for a model at a budget",
        description="Print the GPU, library versions, what --gpu-memory-gb auto chooses here, "
        "and the memory plan of --model (default specter-code-tiny): fixed state, INT4 draft, "
        "KV cache, buffers, slots per layer, expected peak.",
    )
    info.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="the preset or checkpoint folder to plan for (default specter-code-tiny)",
    )
    info.add_argument(
        "--gpu-memory-gb",
        type=parse_budget_or_auto,
        default=None,
        help="the budget to plan at, in GB, auto or unlimited (default: no budget, every "
        "expert resident)",
    )
    info.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="KV cache positions (default 2048, or the model's positions if fewer)",
    )
    info.add_argument(
        "--dtype",
        choices=("float16", "bfloat16", "float32"),
        default=None,
        help="the model's dtype (default: what generate loads here: float16 on a GPU, "
        "float32 on the CPU)",
    )
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

    from specter_bench.host_facts import host_facts
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
    optional = ("accelerate", "triton")
    lines.append(
        "versions: "
        + ", ".join(
            f"{k} {v}" if v else f"{k} not installed" + (" (optional)" if k in optional else "")
            for k, v in versions.items()
        )
    )
    facts = host_facts()
    lines.append(
        f"host CPU: {facts['cpu']}, {facts['cores']} cores, memory bandwidth "
        f"{facts['memory_gb_per_s']:.1f} GB/s (a 256 MB copy on {facts['torch_threads']} "
        "torch threads, bytes read and written)"
    )
    lines.append(f"git commit: {git_commit()}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the machine and, for ``args.model``, the memory plan at ``args.gpu_memory_gb``
    (with ``args.hot_experts`` experts per layer pinned, ``args.draft_pruned`` pruned from the
    draft (``"auto"``: ``resolve_pruned_per_layer``, the count bench and generate take by
    default) and a staging buffer of ``args.stream_staging`` experts)."""
    from specter_bench.bench_record import budget_label
    from specter_models import MemoryBudgetError, plan_memory, resolve_pruned_per_layer
    from specter_models.engine.auto_budget import auto_budget
    from specter_models.engine.model_source import model_config, resolve_device, resolve_dtype
    from specter_models.engine.plans import neither_fits, plain_plan
    from specter_models.memory_plan import DEFAULT_MAX_SEQ_LEN

    print(describe_machine())
    config = model_config(args.model)
    device = resolve_device("auto")
    dtype = resolve_dtype(getattr(args, "dtype", None), device)
    positions = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_SEQ_LEN
    max_seq_len = args.max_seq_len or min(positions, DEFAULT_MAX_SEQ_LEN)
    kwargs = {"max_seq_len": max_seq_len, "dtype": dtype}
    hot = getattr(args, "hot_experts", 0)
    staging = getattr(args, "stream_staging", 0)
    auto = auto_budget(config, device, staging_slots=staging, **kwargs)
    print(f"--gpu-memory-gb {auto.reason}")
    budget = auto.budget_gb if args.gpu_memory_gb == "auto" else args.gpu_memory_gb
    budget = None if budget == "unlimited" else budget
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
    print(
        f"memory plan: {args.model} ({config.model_type}) at {budget_label(budget)}, "
        f"{str(dtype).removeprefix('torch.')}"
    )
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

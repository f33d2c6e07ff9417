"""``specter info``: the GPU, library versions, and a model's memory plan at a budget."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from specter_bench.bench_record import budget_label
from specter_bench.model_loading import model_config
from specter_bench.run_identity import git_commit, gpu_name, package_versions

__all__ = ["describe_machine", "neither_fits", "plain_plan", "run_info"]


def describe_machine() -> str:
    """GPU (name, memory, capability) or its absence, and the versions that matter."""
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


def run_info(args: argparse.Namespace) -> int:
    """Print the machine and, for ``args.model``, the memory plan at ``args.gpu_memory_gb``
    (with ``args.hot_experts`` experts per layer pinned, ``args.draft_pruned`` pruned from the
    draft (``"auto"``: ``resolve_pruned_per_layer``, the count bench and generate take by
    default) and a staging buffer of ``args.stream_staging`` experts)."""
    from specter_models import MemoryBudgetError, plan_memory, resolve_pruned_per_layer

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


def neither_fits(too_small: Exception, plain_short: Exception | None) -> Exception:
    """The error for a budget that holds the model neither with its INT4 draft nor without:
    ``too_small`` (the speculative plan's shortfall) followed by ``plain_short``, what plain
    decoding (``--depth 0``) would need, which is less (``plain_plan``'s second value)."""
    from specter_models import MemoryBudgetError

    if plain_short is None:
        return too_small
    return MemoryBudgetError(
        f"{too_small} Without the INT4 draft (--depth 0, plain decoding) it does not fit "
        f"either: {plain_short}"
    )


def budget_plan(
    config: Any, budget_gb: float | None, *, with_draft: bool, **plan_args: Any
) -> tuple[Any, Exception | None]:
    """``specter_models.plan_memory`` at ``budget_gb``, with or without the INT4 draft:
    ``(plan, None)``; ``(None, shortfall)`` when it does not fit (the
    ``MemoryBudgetError``); ``(None, None)`` without a budget. ``plan_args`` go to
    ``plan_memory`` (dtype, max_seq_len, staging_slots)."""
    from specter_models import MemoryBudgetError, plan_memory

    if budget_gb is None:
        return None, None
    try:
        return plan_memory(config, budget_gb, with_draft=with_draft, **plan_args), None
    except MemoryBudgetError as exc:
        return None, exc


def plain_plan(
    config: Any, budget_gb: float | None, **plan_args: Any
) -> tuple[Any, Exception | None]:
    """:func:`budget_plan` of the target alone (no INT4 draft: ``generate --depth 0``)."""
    return budget_plan(config, budget_gb, with_draft=False, **plan_args)

"""``specter_models.load``: the model of an :class:`EngineConfig`, without the engine's set-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specter_models.engine.config import EngineConfig
from specter_models.engine.model_source import resolve_device, resolve_dtype
from specter_models.memory_plan import DEFAULT_MAX_SEQ_LEN

__all__ = ["load"]


def load(
    config: EngineConfig,
    *,
    policy: str | None = None,
    hot_experts: Sequence[Sequence[int]] | None = None,
    draft_pruned_experts: Sequence[Sequence[int]] | None = None,
) -> Any:
    """Load the ``SpecterModel`` of ``config``: its weights, expert cache and, unless
    ``config.speculation.depth`` is 0, its INT4 draft.

    This is the load alone: no hot set is chosen, no graph is captured and no depth policy
    is made (``Engine.from_config`` does those). ``MemoryConfig.miss_path`` ``"auto"`` and
    ``stream_fills`` None resolve as the engine resolves them.

    Args:
        config: what to load and how to spend the memory.
        policy: the expert cache's replacement policy (default ``"predictive"`` with a
            draft, whose prefetches plan it, else ``"lru"``).
        hot_experts: a pinned hot set, ``hot_experts[layer]`` = the experts of each MoE
            layer kept in FP16 slots (``choose_hot_experts`` picks them).
        draft_pruned_experts: experts of each MoE layer the draft skips.

    Returns:
        A ``SpecterModel`` with ``.target``, ``.draft``, ``.cache``, ``.prefetcher``,
        ``.tokenizer``, ``.config`` and ``.memory``.

    Raises:
        ValueError, MemoryBudgetError, FileNotFoundError, TypeError: as
        ``specter_models.loader.load_model``.
    """
    from specter_models.engine.engine import engine_choices
    from specter_models.loader import load_model

    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}.")
    memory, kernels = config.memory, config.kernels
    with_draft = config.speculation.depth != 0
    device = resolve_device(config.load.device)
    miss_path, fills = engine_choices(
        memory.miss_path, memory.stream_fills, budgeted=memory.budgeted, speculate=with_draft
    )
    return load_model(
        config.load.model,
        gpu_memory_gb=memory.gpu_memory_gb,
        slots_per_layer=memory.slots_per_layer,
        device=device,
        dtype=resolve_dtype(config.load.dtype, device),
        draft=config.load.draft if with_draft else None,
        policy=policy or ("predictive" if with_draft else "lru"),
        seed=config.load.weights_seed,
        max_seq_len=memory.max_seq_len or DEFAULT_MAX_SEQ_LEN,
        hot_experts=hot_experts,
        draft_pruned_experts=draft_pruned_experts if with_draft else None,
        batch_invariant=kernels.batch_invariant,
        cuda_graphs=kernels.cuda_graphs,
        piecewise_graphs=kernels.piecewise_graphs,
        shared_overlap=kernels.shared_overlap,
        miss_path=miss_path,
        stream_fills=fills,
        stream_staging=memory.stream_staging,
        max_batch=config.batch.max_batch,
    )

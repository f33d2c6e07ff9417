"""How a GPU memory budget is spent: fixed state first, FP16 expert slots from the rest.

The budget is the GPU memory the whole process may allocate (what
``torch.cuda.max_memory_allocated`` reports). The fixed state is every non-expert weight, the
INT4 draft experts of every layer, the KV cache at ``max_seq_len`` and an activation
workspace; whatever remains buys FP16 expert slots, the same number in every MoE layer.

With ``hot_experts_per_layer = h`` (a pinned hot set, see ``hot_experts``) the draft holds
INT4 copies of only ``E - h`` experts per layer: the ``h`` pinned ones it computes from their
FP16 slots, which stay in the cache for good. The INT4 memory that frees buys more slots.
With ``pruned_experts_per_layer = p`` (a pruned draft, see ``draft_pruned_experts``) ``p`` more
experts per layer hold no INT4 copy: the draft skips them (the target still computes them), so
it holds ``E - h - p`` INT4 experts per layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import PretrainedConfig

from specter_models.architecture import architecture_for, find_moe_layers
from specter_models.int4_draft import int4_expert_bytes
from specter_models.model_builder import build_on_meta

GB = 1e9
# cuBLAS workspaces, allocator rounding and small tensors the estimate does not itemise.
# 512 MiB: the bench's decodes on one H200 peaked up to 0.19 GB over plans made with 256
# (DeepSeek-V2-Lite 24 GB: spec-lru's token-wise verification on piecewise graphs the most),
# so some ran 0.02-0.05 GB over their budget.
WORKSPACE_RESERVE_BYTES = 512 * 2**20
DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_MAX_VERIFY_ROWS = 33  # a verification of depth 32


class MemoryBudgetError(ValueError):
    """The GPU memory budget cannot hold the fixed state plus one expert slot per layer.

    Attributes:
        budget_gb: the budget that was too small (None where unknown).
        needed_gb: the smallest budget that holds the plan (None where unknown).
        breakdown: what fills ``needed_gb``, in words ("non-expert weights 1.2 GB, ...").
        plain_needed_gb: where known, the smallest budget of plain decoding (no INT4 draft).
    """

    def __init__(
        self,
        message: str,
        *,
        budget_gb: float | None = None,
        needed_gb: float | None = None,
        breakdown: str = "",
        plain_needed_gb: float | None = None,
    ) -> None:
        super().__init__(message)
        self.budget_gb = budget_gb
        self.needed_gb = needed_gb
        self.breakdown = breakdown
        self.plain_needed_gb = plain_needed_gb


@dataclass(frozen=True)
class MemoryPlan:
    """The planned use of GPU memory (bytes unless stated).

    Attributes:
        model_type: the architecture.
        dtype: the model's dtype name.
        budget_bytes: the budget, or None for no budget (every expert resident).
        non_expert_bytes: embeddings, attention, norms, routers, shared experts, LM head.
        draft_int4_bytes: every INT4 routed expert of the draft.
        kv_cache_bytes: the preallocated KV cache.
        max_seq_len: positions the KV cache holds.
        buffer_bytes: estimated activation workspace (logits, attention, MLP, reserve).
        num_moe_layers: MoE layers ``L``.
        num_experts: routed experts per layer ``E``.
        expert_bytes: one FP16 routed expert (gate_up and down).
        slots_per_layer: FP16 expert slots per MoE layer (pinned hot experts included).
        hot_experts_per_layer: pinned hot experts per MoE layer, which the draft computes
            in FP16 and holds no INT4 copy of (0: none).
        staging_slots: FP16 experts of the streamed path's staging buffer, shared by every
            layer (specter-models' ``stream_staging``; 0: none): fixed state.
        pruned_experts_per_layer: experts per MoE layer the draft skips (no INT4 copy, not
            pinned; 0: none).
        max_batch: sequences the KV cache holds at once (batched decoding), each
            ``max_seq_len`` positions.
    """

    model_type: str
    dtype: str
    budget_bytes: int | None
    non_expert_bytes: int
    draft_int4_bytes: int
    kv_cache_bytes: int
    max_seq_len: int
    buffer_bytes: int
    num_moe_layers: int
    num_experts: int
    expert_bytes: int
    slots_per_layer: int
    hot_experts_per_layer: int = 0
    staging_slots: int = 0
    pruned_experts_per_layer: int = 0
    max_batch: int = 1

    @property
    def staging_bytes(self) -> int:
        """The staging buffer (``staging_slots`` FP16 experts)."""
        return self.staging_slots * self.expert_bytes

    @property
    def fixed_bytes(self) -> int:
        """Everything but the expert slots."""
        return (
            self.non_expert_bytes
            + self.draft_int4_bytes
            + self.kv_cache_bytes
            + self.buffer_bytes
            + self.staging_bytes
        )

    @property
    def slot_bytes(self) -> int:
        """All FP16 expert slots."""
        return self.slots_per_layer * self.num_moe_layers * self.expert_bytes

    @property
    def all_experts_bytes(self) -> int:
        """Every FP16 routed expert (what the pinned host store holds)."""
        return self.num_experts * self.num_moe_layers * self.expert_bytes

    @property
    def expected_peak_bytes(self) -> int:
        """Fixed state plus slots: the planned peak of allocated GPU memory."""
        return self.fixed_bytes + self.slot_bytes

    def as_dict(self) -> dict[str, object]:
        """Fields plus the derived totals."""
        out = asdict(self)
        out.update(
            staging_bytes=self.staging_bytes,
            fixed_bytes=self.fixed_bytes,
            slot_bytes=self.slot_bytes,
            all_experts_bytes=self.all_experts_bytes,
            expected_peak_bytes=self.expected_peak_bytes,
        )
        return out

    def describe(self) -> str:
        """A small table in GB, for ``specter info``."""
        if self.budget_bytes is not None:
            budget = _gb(self.budget_bytes)
        elif self.slots_per_layer >= self.num_experts:
            budget = "none (every expert resident)"
        else:
            budget = f"none ({self.slots_per_layer} expert slots per layer, fixed)"
        int4 = self.num_experts - self.hot_experts_per_layer - self.pruned_experts_per_layer
        draft = (
            ("INT4 draft experts", "none (no draft: plain decoding)")
            if int4 and not self.draft_int4_bytes
            else (
                f"INT4 draft experts ({int4}/{self.num_experts} per layer)",
                _gb(self.draft_int4_bytes),
            )
        )
        rows = [
            ("budget", budget),
            ("non-expert weights", _gb(self.non_expert_bytes)),
            draft,
            (
                f"KV cache ({_kv_positions(self.max_seq_len, self.max_batch)})",
                _gb(self.kv_cache_bytes),
            ),
            ("activation buffers (estimate)", _gb(self.buffer_bytes)),
            *(
                [(f"staging buffer ({self.staging_slots} FP16 experts)", _gb(self.staging_bytes))]
                if self.staging_slots
                else []
            ),
            (
                f"FP16 expert slots ({self.slots_per_layer}/{self.num_experts} per layer x "
                f"{self.num_moe_layers} layers)",
                _gb(self.slot_bytes),
            ),
            ("pinned hot experts (of the slots, per layer)", str(self.hot_experts_per_layer)),
            *(
                [("experts the draft skips (pruned, per layer)", str(p))]
                if (p := self.pruned_experts_per_layer)
                else []
            ),
            ("expected peak", _gb(self.expected_peak_bytes)),
            (f"host store (every routed expert, {self.dtype})", _gb(self.all_experts_bytes)),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _kv_positions(max_seq_len: int, max_batch: int) -> str:
    if max_batch == 1:
        return f"{max_seq_len} positions"
    return f"{max_batch} sequences x {max_seq_len} positions"


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:.3f} MB"


def plan_memory(
    config: PretrainedConfig,
    gpu_memory_gb: float | None = None,
    *,
    slots_per_layer: int | None = None,
    dtype: torch.dtype = torch.float16,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    max_verify_rows: int = DEFAULT_MAX_VERIFY_ROWS,
    draft_group_size: int | None = None,
    with_draft: bool = True,
    hot_experts_per_layer: int = 0,
    staging_slots: int = 0,
    pruned_experts_per_layer: int = 0,
    max_batch: int = 1,
) -> MemoryPlan:
    """Plan GPU memory for a model under a budget (or a fixed slot count).

    Args:
        config: the model's transformers config.
        gpu_memory_gb: the budget in GB (1e9 bytes); None with ``slots_per_layer`` None means
            no budget: every expert gets a slot.
        slots_per_layer: a fixed slot count instead of a budget.
        dtype: the model's dtype.
        max_seq_len: positions of the KV cache.
        max_verify_rows: most rows one forward processes in decoding (sizes the workspace).
        draft_group_size: force the INT4 group size.
        with_draft: whether INT4 draft experts are resident (False: target-only engine).
        hot_experts_per_layer: experts per layer pinned in FP16 slots, with no INT4 copy
            (the draft computes them from the slots); they count among the slots, and one
            slot per layer beyond them must stay evictable.
        staging_slots: FP16 experts of the streamed path's staging buffer (fixed state).
        pruned_experts_per_layer: experts per layer the draft skips: neither pinned nor
            given an INT4 copy (``load_model(draft_pruned_experts=)``); with the hot ones, at most
            ``E - 1`` (one expert stays INT4).
        max_batch: sequences decoded together (``BatchConfig.max_batch``): the KV cache
            holds ``max_batch`` slots of ``max_seq_len`` positions, and a forward up to
            ``max_batch * max_verify_rows`` rows (logits and MLP workspace; attention runs
            one sequence at a time).

    Returns:
        The plan.

    Raises:
        ValueError: both a budget and a slot count, a slot count outside ``[1, E]``, a hot
            count outside ``[0, E)``, a pruned count below 0 or leaving no INT4 expert, a
            negative staging count, or an unsupported model type.
        MemoryBudgetError: the budget cannot hold the fixed state plus one slot per layer
            beyond the pinned hot experts; the message says how many GB are needed and what
            fills them.
    """
    if gpu_memory_gb is not None and slots_per_layer is not None:
        raise ValueError("give gpu_memory_gb or slots_per_layer, not both")
    arch = architecture_for(config)
    model = build_on_meta(arch, config, dtype)
    layers = find_moe_layers(model)
    itemsize = torch.empty((), dtype=dtype).element_size()
    routed = {id(p) for layer in layers for p in layer.block.experts.parameters()}
    non_expert = sum(p.numel() for p in model.parameters() if id(p) not in routed) * itemsize
    first = layers[0]
    E, H, I = first.num_experts, first.hidden_size, first.intermediate_size
    L = len(layers)
    hot = hot_experts_per_layer
    if isinstance(hot, bool) or not isinstance(hot, int) or not 0 <= hot < E:
        raise ValueError(
            f"hot_experts_per_layer must be an int in [0, {E}) (pinned experts of {E} per "
            f"layer; at least one stays INT4 for the draft), got {hot!r}"
        )
    pruned = pruned_experts_per_layer
    if isinstance(pruned, bool) or not isinstance(pruned, int) or not 0 <= pruned < E - hot:
        raise ValueError(
            f"pruned_experts_per_layer must be an int in [0, {E - hot}) (experts the draft "
            f"skips, of the {E - hot} per layer that are not pinned hot ones; at least one "
            f"stays INT4), got {pruned!r}"
        )
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(
            f"max_batch must be an int >= 1 (sequences decoded together), got {max_batch!r}"
        )
    if isinstance(staging_slots, bool) or not isinstance(staging_slots, int) or staging_slots < 0:
        raise ValueError(
            f"staging_slots must be an int >= 0 (FP16 experts of the staging buffer), got "
            f"{staging_slots!r}"
        )
    expert_bytes = 3 * H * I * itemsize
    staging_bytes = staging_slots * expert_bytes
    int4_bytes = int4_expert_bytes(H, I, draft_group_size)
    draft_bytes = L * (E - hot - pruned) * int4_bytes if with_draft else 0
    (hk, dk), (hv, dv) = arch.kv_row_shapes(config)
    kv_bytes = max_batch * len(model.model.layers) * max_seq_len * (hk * dk + hv * dv) * itemsize
    buffers = _workspace_bytes(
        config, arch.mla, itemsize, max_seq_len, max_verify_rows, H, I, batch=max_batch
    )
    plan_args: dict[str, object] = {
        "model_type": arch.model_type,
        "dtype": str(dtype).removeprefix("torch."),
        "non_expert_bytes": non_expert,
        "draft_int4_bytes": draft_bytes,
        "kv_cache_bytes": kv_bytes,
        "max_seq_len": max_seq_len,
        "buffer_bytes": buffers,
        "num_moe_layers": L,
        "num_experts": E,
        "expert_bytes": expert_bytes,
        "hot_experts_per_layer": hot,
        "staging_slots": staging_slots,
        "pruned_experts_per_layer": pruned,
        "max_batch": max_batch,
    }
    least = min(E, hot + 1)  # the pinned experts plus one evictable slot
    if slots_per_layer is not None:
        if not isinstance(slots_per_layer, int) or not least <= slots_per_layer <= E:
            raise ValueError(
                f"slots_per_layer must be an int in [{least}, {E}]"
                + (f" ({hot} pinned hot experts plus one evictable slot)" if hot else "")
                + f", got {slots_per_layer!r}"
            )
        return MemoryPlan(budget_bytes=None, slots_per_layer=slots_per_layer, **plan_args)
    if gpu_memory_gb is None:
        return MemoryPlan(budget_bytes=None, slots_per_layer=E, **plan_args)
    budget = int(gpu_memory_gb * GB)
    fixed = non_expert + draft_bytes + kv_bytes + buffers + staging_bytes
    slots = min(E, (budget - fixed) // (L * expert_bytes)) if budget > fixed else 0
    if slots < least:
        needed = fixed + L * least * expert_bytes
        pinned = f" ({hot} pinned hot experts plus one evictable)" if hot else ""
        breakdown = (
            f"non-expert weights {_gb(non_expert)}, INT4 draft experts {_gb(draft_bytes)}, "
            f"KV cache ({_kv_positions(max_seq_len, max_batch)}) {_gb(kv_bytes)}, "
            f"buffers {_gb(buffers)}"
            + (f", a staging buffer {_gb(staging_bytes)}" if staging_bytes else "")
            + f", and {least} FP16 expert slot(s) per layer{pinned} "
            f"{_gb(L * least * expert_bytes)}"
        )
        raise MemoryBudgetError(
            f"gpu_memory_gb={gpu_memory_gb} is too small for this {arch.model_type} model: it "
            f"needs at least {needed / GB:.3f} GB: {breakdown}. Give a larger budget, fewer "
            "pinned hot experts, more pruned draft experts, fewer staging slots or a smaller "
            "max_seq_len.",
            budget_gb=gpu_memory_gb,
            needed_gb=needed / GB,
            breakdown=breakdown,
        )
    return MemoryPlan(budget_bytes=budget, slots_per_layer=int(slots), **plan_args)


def _workspace_bytes(
    config: PretrainedConfig,
    mla: bool,
    itemsize: int,
    max_seq_len: int,
    rows: int,
    hidden: int,
    intermediate: int,
    batch: int = 1,
) -> int:
    """Peak transient activations of one forward of ``rows`` rows of each of ``batch``
    sequences, plus a fixed reserve.

    Logits (model dtype, plus a float32 copy for sampling) coexist with the last layer's
    transients; within a layer, attention (one sequence at a time) or the MLP (every
    sequence's rows) dominates.
    """
    heads = config.num_attention_heads
    logits = batch * rows * config.vocab_size * (itemsize + 4)
    if mla:
        # DeepSeek expands the cached latents of every position into per-head keys and values.
        per_position = heads * (
            config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
        )
    else:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        per_position = 2 * heads * head_dim  # keys and values repeated to every query head
    attention = max_seq_len * per_position * itemsize * 2 + heads * rows * max_seq_len * 4
    dense = max(
        getattr(config, "intermediate_size", 0) or 0,
        getattr(config, "shared_expert_intermediate_size", 0) or 0,
        intermediate * config.num_experts_per_tok * 2,
    )
    mlp = batch * rows * (dense * 4 * 3 + hidden * 4 * 4)
    return WORKSPACE_RESERVE_BYTES + logits + max(attention, mlp)

"""The routed-experts module Specter swaps into transformers' MoE blocks.

transformers 5.17's three MoE blocks call ``self.experts(hidden [T, H], top_k_index [T, k],
top_k_weights [T, k])`` after their own router, so replacing that one module keeps every
routing rule (DeepSeek's greedy/group-limited top-k with routed scaling, Qwen's
``norm_topk_prob``, Phi's sparsemixer) untouched. ``SpecterExperts`` has no FP16 weights of
its own; it runs one of two paths, chosen by the shared ``ExpertsRuntime``:

* draft: INT4 routed experts resident on the device, ``fused_moe_w4a16``; the router's
  choices are counted with ``RoutingCounter.observe`` (no host sync). With a pinned hot set
  (``hot_experts``) the draft holds INT4 copies of the other experts only and computes the
  hot ones exactly as the target does, from their FP16 slots (pinned in the cache, so the
  slots never change under a captured draft graph);
* target: FP16 experts from specter-cache's slots, in waves (``ExpertCache.acquire``):
  resident experts first, missing ones as their copies land, each wave through
  ``grouped_moe_fp16`` into one fp32 accumulator, cast back at the end. Token-wise
  verification does the same per row, in row order. When every expert of the layer holds a
  slot of its own (no budget), one wave covers them all with no host sync at all.

With ``ExpertsRuntime.batch_invariant`` the accumulator is ``[T, k, H]``: each routed pair
is written, not added, and the ``k`` pairs of a row are summed in a fixed order at the end,
so the result cannot depend on the waves or on how many rows are verified together.

Non-fp16 models (float32/float64 CPU tests) use the plain-torch arithmetic of
``expert_math`` on the same slots and INT4 weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from specter_kernels import (
    BatchInvariantMode,
    Int4Weight,
    StreamedExperts,
    assign_fill_slots,
    dequantize_int4,
    fused_moe_w4a16,
    grouped_moe_fp16,
    stage_streamed,
    sum_routed_pairs,
)
from specter_models.expert_math import accumulate_experts, write_expert_pairs
from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.streamed_misses import StreamRecord

PAIR_BLOCK_ROWS = 16
"""Waves of a budgeted layer with at most this many rows run a block per routed pair
(``grouped_moe_fp16(pair_blocks=True)``): no alignment launch, at the cost of reading an
expert's weights once per pair instead of once per wave. Above it (a prefill) they align."""


class SpecterExperts(nn.Module):
    """Routed experts of one MoE layer: INT4 for the draft, cached FP16 for the target.

    Args:
        runtime: the model's shared runtime (mode, cache, counter).
        layer: this layer's index among the MoE layers (the cache's layer index).
        num_experts: ``E``.
        hidden_dim: ``H``.
        intermediate_dim: ``I`` of one expert.

    The attribute names ``num_experts``, ``hidden_dim`` and ``intermediate_dim`` are those of
    transformers' experts modules.
    """

    def __init__(
        self,
        runtime: ExpertsRuntime,
        layer: int,
        num_experts: int,
        hidden_dim: int,
        intermediate_dim: int,
    ):
        super().__init__()
        self.runtime = runtime
        self.layer = layer
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.draft_gate_up: Int4Weight | None = None
        self.draft_down: Int4Weight | None = None
        self.hot_experts: tuple[int, ...] = ()
        self.pruned_experts: tuple[int, ...] = ()  # the draft skips them
        self._hot_mask: torch.Tensor | None = None  # bool [E]: pinned hot experts
        # int32 [E]: each expert's INT4 entry, -1 if hot or pruned (None: entry = id)
        self._int4_index: torch.Tensor | None = None
        self._hot_checked = False
        self._all_mask: torch.Tensor | None = None
        self._streamed: StreamedExperts | None = None

    def extra_repr(self) -> str:
        return (
            f"layer={self.layer}, num_experts={self.num_experts}, hidden={self.hidden_dim}, "
            f"intermediate={self.intermediate_dim}, draft_int4={self.draft_gate_up is not None}, "
            f"hot_experts={len(self.hot_experts)}"
            + (f", pruned_experts={len(self.pruned_experts)}" if self.pruned_experts else "")
        )

    # ------------------------------------------------------------------------------ setup
    def set_draft_weights(
        self,
        gate_up: Int4Weight,
        down: Int4Weight,
        hot_experts: Sequence[int] = (),
        pruned_experts: Sequence[int] = (),
    ) -> None:
        """Install the draft's INT4 experts.

        Args:
            gate_up: ``[E', 2I, H]`` (gate rows first), ``E' = E - len(hot_experts) -
                len(pruned_experts)``: the experts that are neither hot nor pruned, in
                ascending id order.
            down: ``[E', H, I]``.
            hot_experts: experts the draft computes from their FP16 cache slots instead
                (they must be pinned in the cache, ``ExpertCache.pin``, before the draft
                runs).
            pruned_experts: experts the draft skips: a pair routed to one adds nothing to
                the draft's output (the target computes it as always). Their INT4 memory
                buys FP16 slots (``plan_memory``'s ``pruned_experts_per_layer``).

        Raises:
            ValueError: shapes that do not match this layer, or bad hot or pruned expert
                ids (repeated, out of range, in both sets, or leaving no INT4 expert).
        """
        E, H, I = self.num_experts, self.hidden_dim, self.intermediate_dim
        hot = tuple(sorted({int(e) for e in hot_experts}))
        if len(hot) != len(hot_experts) or any(not 0 <= e < E for e in hot) or len(hot) >= E:
            raise ValueError(
                f"MoE layer {self.layer}: hot_experts must be distinct ids in [0, {E}), fewer "
                f"than {E}, got {list(hot_experts)}"
            )
        pruned = tuple(sorted({int(e) for e in pruned_experts}))
        if (
            len(pruned) != len(pruned_experts)
            or any(not 0 <= e < E for e in pruned)
            or set(pruned) & set(hot)
            or len(hot) + len(pruned) >= E
        ):
            raise ValueError(
                f"MoE layer {self.layer}: pruned_experts must be distinct ids in [0, {E}), "
                f"none of them hot, leaving at least one INT4 expert ({len(hot)} hot), got "
                f"{list(pruned_experts)}"
            )
        cold = E - len(hot) - len(pruned)
        got = (
            (gate_up.num_experts, gate_up.out_features, gate_up.in_features),
            (down.num_experts, down.out_features, down.in_features),
        )
        if got != ((cold, 2 * I, H), (cold, H, I)):
            less = [f"{len(hot)} hot"] * bool(hot) + [f"{len(pruned)} pruned"] * bool(pruned)
            raise ValueError(
                f"MoE layer {self.layer}: INT4 draft experts are gate_up {list(got[0])} and down "
                f"{list(got[1])} [E, N, K]; the model needs gate_up [{cold}, {2 * I}, {H}] and "
                f"down [{cold}, {H}, {I}]"
                + (f" ({E} experts less {' and '.join(less)} ones)" if less else "")
            )
        self.draft_gate_up, self.draft_down = gate_up, down
        self.hot_experts = hot
        self.pruned_experts = pruned
        self._hot_checked = False
        device = gate_up.qweight.device
        if hot:
            mask = torch.zeros(E, dtype=torch.bool)
            mask[list(hot)] = True
            self._hot_mask = mask.to(device)
        else:
            self._hot_mask = None
        if hot or pruned:
            index = torch.full((E,), -1, dtype=torch.int32)
            keep = torch.ones(E, dtype=torch.bool)
            keep[list(hot) + list(pruned)] = False
            index[keep] = torch.arange(cold, dtype=torch.int32)
            self._int4_index = index.to(device)
        else:
            self._int4_index = None

    def draft_tensors(self) -> dict[str, torch.Tensor]:
        """The INT4 draft's tensors of this layer, by name (for byte accounting)."""
        out: dict[str, torch.Tensor] = {}
        for prefix, w in (("gate_up", self.draft_gate_up), ("down", self.draft_down)):
            if w is None:
                continue
            out[f"{prefix}.qweight"] = w.qweight
            out[f"{prefix}.scales"] = w.scales
            if w.zeros is not None:
                out[f"{prefix}.zeros"] = w.zeros
        return out

    # ---------------------------------------------------------------------------- forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        keep_pairs: bool = False,
    ) -> torch.Tensor:
        """Routed-expert output ``[T, H]`` for ``hidden_states [T, H]`` routed by the block's
        router to ``top_k_index [T, k]`` with ``top_k_weights [T, k]``.

        ``keep_pairs=True`` (a caller that sums the pairs into its own join, such as
        ``shared_overlap``'s ``residual_add_routed_pairs``): a target forward whose
        accumulator is per pair returns it unsummed, fp32 ``[T, k, H]``; every other
        forward (the draft's, a graphed split's, one not batch-invariant) returns ``[T, H]``
        as always, so a caller checks the rank.

        Raises:
            RuntimeError: called outside a draft or target forward (no mode set), or in draft
                mode before INT4 weights were installed.
        """
        top_k_index = self.routed_ids(top_k_index)
        mode = self.runtime.mode
        working_set = self.runtime.working_set
        if working_set is not None and mode is not None:  # batched decoding's statistics
            working_set.observe(self.layer, mode, top_k_index)
        if mode is ExpertsMode.DRAFT:
            return self._draft(hidden_states, top_k_index, top_k_weights)
        if mode is ExpertsMode.TARGET:
            split = self.runtime.expert_split
            if split is not None:  # a step graph takes the call (see step_graphs)
                return split(self, hidden_states, top_k_index, top_k_weights)
            return self.target_forward(hidden_states, top_k_index, top_k_weights, keep_pairs)
        raise RuntimeError(
            "SpecterExperts ran outside a draft or target forward: call the model through "
            "TargetModel / DraftModel (or inside ExpertsRuntime.running(mode))"
        )

    def routed_ids(self, top_k_index: torch.Tensor) -> torch.Tensor:
        """The ``[T, k]`` experts this layer computes for the router's ``top_k_index``:
        those ids, or under a routing replay (``runtime.routing_replay``) the recorded ones
        at the rows' positions, gathered on the device (``routing_replay``)."""
        replay = self.runtime.routing_replay
        if replay is None:
            return top_k_index
        return replay.expert_ids(self.layer, self.runtime.mode, top_k_index)

    def target_forward(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, keep_pairs: bool = False
    ) -> torch.Tensor:
        """The target's routed-expert output ``[T, H]`` through the expert cache
        (expert-wise or token-wise, as ``runtime.verification`` says); with ``keep_pairs``
        a per-pair accumulator ``[T, k, H]`` comes back unsummed (see :meth:`forward`).

        With a CPU expert executor (``runtime.cpu_experts``) and CPU-homed experts in this
        layer, a forward of at most its ``max_rows`` rows hands their pairs to the host
        (``cpu_experts``): the device computes the other pairs meanwhile, and the host's
        results join the accumulator before its pairs are summed."""
        cpu = self.runtime.cpu_experts
        job = None
        if cpu is not None and cpu.takes(self.layer, x.shape[0]):
            job, ids = cpu.begin(self.layer, x, ids, weights)  # homed pairs: -1 on the device
        if self.runtime.verification == "token":
            out = self._target_tokenwise(x, ids, weights)
        else:
            out = self._target(x, ids, weights, zeroed=job is not None)
        if job is not None:
            cpu.finish(job, out)
        return self._finish(out, x.dtype, keep_pairs)

    def _draft(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if self.draft_gate_up is None or self.draft_down is None:
            raise RuntimeError(
                f"MoE layer {self.layer} has no INT4 draft experts; load the model with a draft"
            )
        counter = self.runtime.counter
        if counter is not None:
            counter.observe(self.layer, ids)  # device-side index_add_, no host sync
        if self._int4_index is not None:
            return self._draft_with_hot(x, ids, weights)
        if x.dtype == torch.float16:
            return fused_moe_w4a16(x, ids, weights, self.draft_gate_up, self.draft_down)
        # Reference path for float32/float64 models: dequantize the routed experts only.
        used = torch.unique(ids)
        gate_up = dequantize_int4(self.draft_gate_up.experts(used), x.dtype)
        down = dequantize_int4(self.draft_down.experts(used), x.dtype)
        experts = ((e, gate_up[i], down[i]) for i, e in enumerate(used.tolist()))
        return accumulate_experts(x, ids, weights, experts, torch.zeros_like(x))

    def _draft_with_hot(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The draft with a pinned hot set or pruned experts: INT4 for the others (their
        pairs only), the hot ones from their FP16 slots, summed in fp32 and rounded once;
        pairs routed to a pruned expert add nothing."""
        cache = self.runtime.cache
        if self.hot_experts and not self._hot_checked:
            # Host-side, once: the FP16 path reads the hot experts' slots without a wave.
            missing = set(self.hot_experts) - set(cache.pinned(self.layer))
            if missing:
                raise RuntimeError(
                    f"MoE layer {self.layer}: hot experts {sorted(missing)} are not pinned in "
                    "the expert cache; pin them (ExpertCache.pin) before drafting"
                )
            self._hot_checked = True
        if x.dtype == torch.float16:
            # -1 for hot and pruned pairs: skipped by the kernel
            cold_ids = self._int4_index[ids.long()]
            out = fused_moe_w4a16(x, cold_ids, weights, self.draft_gate_up, self.draft_down)
            if not self.hot_experts:
                return out
            out = out.float()
            slots = cache.slot_tensors(self.layer)
            grouped_moe_fp16(
                x, ids, weights, slots["gate_up"], slots["down"],
                cache.expert_to_slot(self.layer), self._hot_mask, out,
            )  # fmt: skip
            return out.half()
        # float32/float64 reference: dequantized INT4 for cold experts, slots for hot ones.
        used = torch.unique(ids).tolist()
        skip = set(self.hot_experts) | set(self.pruned_experts)
        cold = [e for e in used if e not in skip]
        experts = []
        if cold:
            index = torch.tensor([int(self._int4_index[e]) for e in cold], dtype=torch.long)
            gate_up = dequantize_int4(self.draft_gate_up.experts(index), x.dtype)
            down = dequantize_int4(self.draft_down.experts(index), x.dtype)
            experts = [(e, gate_up[i], down[i]) for i, e in enumerate(cold)]
        if self.hot_experts:
            slots = cache.slot_tensors(self.layer)
            for e in used:
                if e in self.hot_experts:
                    slot = cache.slot_of(self.layer, e)
                    experts.append((e, slots["gate_up"][slot], slots["down"][slot]))
        return accumulate_experts(x, ids, weights, experts, torch.zeros_like(x))

    def _needed(self, ids: torch.Tensor) -> list[list[int]]:
        # The one host sync of a verified layer: the cache's bookkeeping (which experts are
        # resident, what to load into which slot) runs on the host and needs the ids.
        rows = ids.tolist()
        if self.runtime.rows_kept is not None:
            rows = self._truncate_rows(rows)  # the rows still verified need experts
        trace = self.runtime.routing_trace
        if trace is not None:
            trace[self.layer].append(sorted({e for row in rows for e in row if e >= 0}))
        return rows

    def _target(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, zeroed: bool = False
    ) -> torch.Tensor:
        """The accumulator (unsummed) of an expert-wise target forward; ``zeroed``: every
        pair starts at zero even where the device writes every routed pair (the host writes
        some of them later)."""
        record = self.runtime.stream_record
        streaming = record is not None and record.active
        if streaming:
            ids = record.real_pairs(ids)  # padding rows of a graphed step: no experts
            record.ids[self.layer, : x.shape[0]].copy_(ids)  # read after the forward
        if self._fully_resident():
            # Every expert of this layer sits in its own slot and nothing can evict it: one
            # wave over all experts, no host sync and no cache bookkeeping (hits of this
            # layer are not counted). That wave writes every routed pair, so a per-pair
            # accumulator needs no zeros first.
            # (Streaming, padding rows route nowhere: their pairs need the zeros.)
            zero = zeroed or streaming or not self.runtime.batch_invariant
            out = self._accumulator(x, ids, zeroed=zero)
            if self.runtime.routing_trace is not None:
                self._needed(ids)  # the trace needs the ids on the host (a sync)
            self._compute_wave(x, ids, weights, None, None, out)
            return out
        if streaming:
            return self._target_streamed(x, ids, weights, record)
        out = self._accumulator(x, ids)
        rows = self._needed(ids)
        needed = list(dict.fromkeys(e for row in rows for e in row if e >= 0))
        for wave in self.runtime.cache.acquire(self.layer, needed):
            self._compute_wave(x, ids, weights, wave.experts, wave.slots, out)
        return out

    def _target_streamed(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        record: StreamRecord,
    ) -> torch.Tensor:
        """The streamed miss path (``streamed_misses``): every routed pair in one wave, each
        expert read from its slot or, without one, in place from the host store; the kernel
        flags the streamed ones in the record's flags and fills its spare slots with the
        first ones; with staging on (fp16), the first missing ones are copied into the
        staging buffer first and read there. No host sync: it can be graphed."""
        layer = self.layer
        flags = record.flags[layer]
        fills = record.fills[layer] if record.width else None  # width 0: no fill launches
        out = self._accumulator(x, ids)  # zeros: padding rows' pairs are not written
        if self.runtime.routing_trace is not None:
            self._needed(ids)  # the trace needs the ids on the host (a sync)
        cache = self.runtime.cache
        slots = cache.slot_tensors(layer)
        mapping = cache.expert_to_slot(layer)
        if self.runtime.stream_waits:  # this layer's prefetches land before the map is read
            cache.streamed.wait_for_landing(layer)
        if fills is not None:
            # Missing routed experts the host has no slot for (loads in flight keep theirs),
            # ranked onto this layer's candidate slots (their experts leave the map here).
            assign_fill_slots(
                ids, record.claimed[layer], record.spare_slots[layer],
                record.spare_experts[layer], mapping, fills,
            )  # fmt: skip
        if x.dtype == torch.float16:
            every = self._all_experts_mask(x.device)
            streamed = self._streamed_experts(x.device)
            staging = self.runtime.staging_buffer()
            if staging is not None:  # the first missing experts to device memory, widely
                streamed = stage_streamed(ids, mapping, every, streamed, staging)
            grouped_moe_fp16(
                x, ids, weights, slots["gate_up"], slots["down"], mapping, every, out, None,
                streamed, flags, fills,
            )  # fmt: skip
            return out
        # float32/float64 reference (CPU tests, host syncs allowed): the same choice per
        # expert, in plain torch, the host store's tensors read where there is no slot.
        slot_of = mapping.tolist()
        store = cache.store
        experts = []
        for e in torch.unique(ids[ids >= 0]).tolist():
            if slot_of[e] >= 0:
                experts.append((e, slots["gate_up"][slot_of[e]], slots["down"][slot_of[e]]))
                continue
            flags[:, e] = 1
            host = store.get(layer, e)
            experts.append((e, host["gate_up"].to(x.device), host["down"].to(x.device)))
            fill = -1 if fills is None else int(fills[e])
            if fill >= 0:  # what the kernel's fill does: the streamed expert into its spare
                slots["gate_up"][fill].copy_(host["gate_up"])
                slots["down"][fill].copy_(host["down"])
        if out.dim() == 3:
            with BatchInvariantMode():
                write_expert_pairs(x, ids, weights, experts, out)
        else:
            accumulate_experts(x, ids, weights, experts, out)
        return out

    def _streamed_experts(self, device: torch.device) -> StreamedExperts:
        """This layer's fp16 experts in the host store, addressed for a kernel on ``device``
        (built once; every expert is read into the store first where it is lazy)."""
        if self._streamed is None or self._streamed.w13_addresses.device != device:
            cache = self.runtime.cache
            self._streamed = StreamedExperts.from_tensors(
                cache.streamed.host_tensors(self.layer, "gate_up"),
                cache.streamed.host_tensors(self.layer, "down"),
                device,
            )
        return self._streamed

    def _truncate_rows(self, rows: list[list[int]]) -> list[list[int]]:
        """Miss-aware row truncation (``row_truncation``): the leading rows worth verifying
        at this layer, given which of their experts are missing. Rows past the cut get no
        expert of their own loaded (they are no longer verified: garbage from here on, which
        causal attention keeps out of the rows before them)."""
        runtime = self.runtime
        keep = min(runtime.rows_kept, len(rows))
        rows = rows[:keep]
        policy, cache = runtime.row_truncation, runtime.cache
        if keep > 1 and policy is not None:
            missing = {
                e for row in rows for e in row if e >= 0 and cache.slot_of(self.layer, e) < 0
            }
            if missing:
                keep = policy.cutoff(
                    rows,
                    missing,
                    cache.store.expert_bytes(self.layer),
                    layers_left=cache.num_layers - self.layer,
                )
                rows = rows[:keep]
        runtime.rows_kept = keep
        return rows

    def _target_tokenwise(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The accumulator (unsummed, zeroed) of a token-wise target forward."""
        if self._fully_resident():
            # Nothing to load, so no load order to follow: token-wise verification is the
            # all-resident single wave (the same bits under batch invariance).
            return self._target(x, ids, weights, zeroed=True)
        rows = self._needed(ids)
        out = self._accumulator(x, ids)
        for t, row in enumerate(rows):
            span = slice(t, t + 1)
            needed = [e for e in dict.fromkeys(row) if e >= 0]
            for wave in self.runtime.cache.acquire(self.layer, needed):
                self._compute_wave(
                    x[span], ids[span], weights[span], wave.experts, wave.slots, out[span]
                )
        return out

    def _accumulator(self, x: torch.Tensor, ids: torch.Tensor, zeroed: bool = True) -> torch.Tensor:
        """Sums: ``[T, H]``, or ``[T, k, H]`` (one row per routed pair) when batch
        invariant, so no sum depends on wave composition or on the number of rows. Zeroed
        unless ``zeroed=False`` (a caller whose waves write every pair)."""
        shape = (x.shape[0], ids.shape[1], x.shape[1]) if self.runtime.batch_invariant else x.shape
        make = torch.zeros if zeroed else torch.empty
        return make(shape, dtype=_accumulator_dtype(x.dtype), device=x.device)

    @staticmethod
    def _finish(out: torch.Tensor, dtype: torch.dtype, keep_pairs: bool = False) -> torch.Tensor:
        if out.dim() == 3:
            if keep_pairs and out.dtype == torch.float32:
                return out  # fp32 [T, k, H]: the caller's join sums the pairs
            # Pairs 0..k-1 of each row, in that order, and the cast: one launch on CUDA.
            return sum_routed_pairs(out, dtype)
        return out.to(dtype)

    def _fully_resident(self) -> bool:
        """Whether every expert of this layer is loaded into a slot of its own (the
        no-budget configuration, prefetched when loading): ``ExpertCache.all_resident``,
        which remembers a True answer."""
        return self.runtime.cache.all_resident(self.layer)

    def _compute_wave(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        experts: tuple[int, ...] | None,
        slots: tuple[int, ...] | None,
        out: torch.Tensor,
    ) -> None:
        """Add (or, per pair, write) the wave's experts into ``out``; ``experts=None``: all
        experts of the layer, each in the slot ``expert_to_slot`` names."""
        cache = self.runtime.cache
        slot_tensors = cache.slot_tensors(self.layer)
        gate_up, down = slot_tensors["gate_up"], slot_tensors["down"]
        if x.dtype == torch.float16:
            mask = (
                self._all_experts_mask(x.device)
                if experts is None
                else _expert_mask(experts, self.num_experts, x.device)
            )
            # A wave of a budgeted layer with few rows (a verification): a block per pair
            # and no alignment launch. Host work, not weight reads, bounds those waves.
            # Otherwise (None) the kernel decides: pair blocks for one row only.
            few_rows = experts is not None and x.shape[0] <= PAIR_BLOCK_ROWS
            grouped_moe_fp16(
                x, ids, weights, gate_up, down, cache.expert_to_slot(self.layer), mask, out,
                True if few_rows else None,
            )  # fmt: skip
            return
        if experts is None:
            experts = tuple(range(self.num_experts))
            slots = tuple(cache.slot_of(self.layer, e) for e in experts)
        weighted = ((e, gate_up[s], down[s]) for e, s in zip(experts, slots, strict=True))
        if out.dim() == 3:
            # Plain-torch experts: their linears see as many rows as routed to the expert.
            with BatchInvariantMode():
                write_expert_pairs(x, ids, weights, weighted, out)
        else:
            accumulate_experts(x, ids, weights, weighted, out)

    def _all_experts_mask(self, device: torch.device) -> torch.Tensor:
        if self._all_mask is None or self._all_mask.device != device:
            self._all_mask = torch.ones(self.num_experts, dtype=torch.bool, device=device)
        return self._all_mask


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 sums for half-precision models, the model's own dtype otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _expert_mask(experts: tuple[int, ...], num_experts: int, device: torch.device) -> torch.Tensor:
    """Bool ``[E]`` on ``device``, True for the wave's experts.

    Built on the host and sent up as one pageable ``non_blocking`` copy (no device kernel
    of its own): CUDA stages pageable memory at once and returns without waiting for the
    device, so this adds no host sync.
    """
    mask = torch.zeros(num_experts, dtype=torch.bool)
    mask[list(experts)] = True
    return mask if device.type == "cpu" else mask.to(device, non_blocking=True)

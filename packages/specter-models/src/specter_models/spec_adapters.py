"""Target and draft views of one model, following specter-spec's ``SpecModel`` protocol.

Both adapters drive the same transformers model object and the same ``StaticKVCache``:

* the **target** owns the committed prefix: its ``kv_length`` is the committed length and
  never sees the draft's rows. Its forward first drops any draft scratch beyond
  ``start_pos``, then appends the verified rows; ``truncate`` cuts to the accepted boundary.
* the **draft** reads the target's committed KV (shared memory, no copy) and appends scratch
  rows after it: its ``kv_length`` is committed + scratch. Its ``truncate`` drops scratch
  and can never cut into the committed prefix.

For DeepSeek-V2 the shared rows are MLA's compressed latents. Rollback of either kind only
moves lengths (``StaticKVCache.crop_to``).

With ``ExpertsRuntime.batch_invariant`` the target forward switches on the batch-invariant
wrappers of ``invariant_scopes`` (``runtime.invariant_active``): a row's logits are then the
same bits whether it is verified alone (plain decoding) or with K others (speculation), so
exact greedy equality holds in fp16. The draft needs no such care: it only proposes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel

from specter_kernels import argmax_last_dim
from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.kv_cache import StaticKVCache, cache_keyword
from specter_models.row_truncation import RowTruncation
from specter_models.step_graphs import StepGraphs


class SharedKV:
    """The KV cache both adapters use, and the committed length the target owns.

    Args:
        cache: the preallocated KV cache.

    Attributes:
        cache: the KV cache (its ``length`` counts committed and scratch rows).
        committed: rows written by the target and not truncated.
    """

    def __init__(self, cache: StaticKVCache):
        self.cache = cache
        self.committed = 0
        self._positions: torch.Tensor | None = None

    def positions(self, start: int, count: int, device: torch.device) -> torch.Tensor:
        """``[1, count]`` position ids ``start..start+count-1`` (a view; no allocation)."""
        if self._positions is None or self._positions.device != device:
            self._positions = torch.arange(self.cache.max_seq_len, device=device).unsqueeze(0)
        return self._positions[:, start : start + count]

    def reset(self) -> None:
        """Empty the cache."""
        self.committed = 0
        self.cache.crop_to(0)


class _Adapter:
    role = "model"
    mode: ExpertsMode

    def __init__(self, model: PreTrainedModel, runtime: ExpertsRuntime, kv: SharedKV):
        self.model = model
        self.runtime = runtime
        self.kv = kv
        self.graphs: StepGraphs | None = None  # window-mode / CUDA-graph steps, when set
        self._device = next(model.parameters()).device
        self._last_logits_only = False  # set by prefill: transformers' logits_to_keep=1

    @property
    def device(self) -> torch.device:
        """Where input ids must live."""
        return self._device

    @contextlib.contextmanager
    def graphs_paused(self) -> Iterator[None]:
        """Plain forwards for the block (no window mode, no replay): for code that hooks or
        swaps what a forward runs, which a replayed graph would skip."""
        graphs, self.graphs = self.graphs, None
        try:
            yield
        finally:
            self.graphs = graphs

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The last dim's argmax of this model's logits (specter-spec's optional
        ``SpecModel.argmax``): specter-kernels' ``argmax_last_dim``, one launch on CUDA
        (``torch.argmax``'s one block of threads took about 24 us for DeepSeek-V2-Lite's
        102400 logits on an H200), ``torch.argmax``'s result: the first index of ties."""
        return argmax_last_dim(logits)

    def prefill(self, input_ids: torch.Tensor, start_pos: int) -> None:
        """``forward`` for prompt tokens whose logits nobody reads (specter-spec's optional
        ``SpecModel.prefill``): the same KV, but a forward outside the captured graphs
        computes the LM head for the last row only (transformers' ``logits_to_keep``),
        not a ``[T, V]`` tensor as large as the prompt (82 MB for 400 tokens of
        DeepSeek-V2-Lite's vocabulary, past the memory plan's workspace). The rows' KV does
        not depend on the logits, so nothing committed changes.

        Raises:
            ValueError: as ``forward``.
        """
        self._last_logits_only = True
        try:
            self.forward(input_ids, start_pos)
        finally:
            self._last_logits_only = False

    def _check_input(self, input_ids: torch.Tensor, start_pos: int) -> None:
        if (
            not isinstance(input_ids, torch.Tensor)
            or input_ids.dim() != 2
            or input_ids.shape[0] != 1
            or input_ids.shape[1] < 1
        ):
            raise ValueError(
                f"{self.role} input_ids must be a [1, T] tensor with T >= 1, got "
                f"{getattr(input_ids, 'shape', type(input_ids))}"
            )
        if input_ids.dtype.is_floating_point:
            raise TypeError(f"{self.role} input_ids must hold integer ids, got {input_ids.dtype}")
        if isinstance(start_pos, bool) or not isinstance(start_pos, int) or start_pos < 0:
            raise ValueError(f"start_pos must be a non-negative int, got {start_pos!r}")
        end = start_pos + input_ids.shape[1]
        if end > self.kv.cache.max_seq_len:
            raise ValueError(
                f"positions up to {end - 1} do not fit max_seq_len={self.kv.cache.max_seq_len}; "
                "load the model with a larger max_seq_len"
            )

    def _run(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Forward ``input_ids`` at ``start_pos`` after the cache was cropped to it: a
        graphed (window-mode) step where ``graphs`` applies, else transformers' forward."""
        try:
            if self.graphs is not None:
                logits = self.graphs.forward(input_ids, start_pos)
                if logits is not None:
                    return logits
            positions = self.kv.positions(start_pos, input_ids.shape[1], input_ids.device)
            keep = {"logits_to_keep": 1} if self._last_logits_only else {}
            with torch.no_grad(), self.runtime.running(self.mode):
                output = self.model(
                    input_ids=input_ids,
                    position_ids=positions,
                    **{cache_keyword(self.model): self.kv.cache},
                    use_cache=True,
                    **keep,
                )
        except BaseException:
            # A forward that failed half-way leaves some layers longer than others.
            self.kv.cache.crop_to(start_pos)
            raise
        return output.logits


class TargetModel(_Adapter):
    """The FP16 target: routed experts through the expert cache, committed KV.

    ``forward(input_ids [1, T], start_pos) -> logits [1, T, V]`` with ``start_pos`` equal to
    ``kv_length`` (the committed length): draft scratch beyond it is dropped first.

    Miss-aware row truncation (``runtime.row_truncation``, see ``row_truncation``): while
    ``allow_row_truncation`` is True (a greedy controller sets it around a verification
    forward only, never around a prefill) an expert-wise forward may stop verifying its tail
    rows; ``verified_rows`` then says how many leading rows' logits are exact (None: all).
    The policy's acceptance and per-token time are learned from the verifications here.
    """

    role = "target"
    mode = ExpertsMode.TARGET
    allow_row_truncation = False
    verified_rows: int | None = None
    _last_verify: tuple[int, int, float] | None = None  # (start, rows verified, clock)

    @property
    def kv_length(self) -> int:
        """The committed length (a host int; the draft's scratch is not counted)."""
        return self.kv.committed

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Verify ``input_ids`` at positions ``start_pos..``; returns ``[1, T, V]`` logits.

        Raises:
            ValueError: a bad shape, or ``start_pos`` other than the committed length (call
                ``truncate`` first to roll back).
        """
        self._check_input(input_ids, start_pos)
        if start_pos != self.kv.committed:
            raise ValueError(
                f"target start_pos={start_pos} but the committed KV holds {self.kv.committed} "
                "positions; new tokens must continue it (call truncate(start_pos) to roll back)"
            )
        self.kv.cache.crop_to(start_pos)  # drop the draft's scratch rows
        rows = input_ids.shape[1]
        runtime, policy = self.runtime, self.runtime.row_truncation
        # The streamed miss path (streamed_misses): no host decision per layer, so no row cut.
        record = runtime.stream_record if runtime.streams(rows) else None
        truncating = (
            policy is not None
            and self.allow_row_truncation
            and rows > 1
            and runtime.verification == "expert"
            and record is None
        )
        if truncating:
            self._observe_previous(policy, start_pos)
            if runtime.bandwidth is not None:
                policy.measured_bandwidth = runtime.bandwidth()
            runtime.rows_kept = rows
        started = time.perf_counter()
        streamed = (
            record.forward(runtime.cache, rows) if record is not None else contextlib.nullcontext()
        )
        try:
            with streamed:
                logits = self._run(input_ids, start_pos)
        finally:
            kept, runtime.rows_kept = runtime.rows_kept, None
        self.verified_rows = kept if truncating and kept is not None and kept < rows else None
        if truncating:
            self._last_verify = (start_pos, kept or rows, started)
        self.kv.committed = start_pos + rows
        return logits

    def _observe_previous(self, policy: RowTruncation, start_pos: int) -> None:
        """Feed the policy the previous verification: proposals verified and accepted (from
        how far the committed length moved), and the wall time per committed token."""
        last, self._last_verify = self._last_verify, None
        if last is None:
            return
        previous_start, verified_rows, clock = last
        committed = start_pos - previous_start
        if 1 <= committed <= verified_rows:  # else another generation started in between
            policy.observe(
                verified=verified_rows - 1,
                accepted=committed - 1,
                seconds=time.perf_counter() - clock,
                committed=committed,
            )

    def truncate(self, length: int) -> None:
        """Cut the committed KV to ``length`` positions (no-op at or beyond ``kv_length``).

        Raises:
            ValueError: ``length`` is negative.
        """
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"truncate length must be a non-negative int, got {length!r}")
        if length < self.kv.committed:
            self.kv.committed = length
            self.kv.cache.crop_to(length)


class DraftModel(_Adapter):
    """The INT4 draft: shares the target's committed KV and appends scratch rows after it.

    ``forward(input_ids [1, T], start_pos)`` needs ``committed <= start_pos <= kv_length``;
    scratch beyond ``start_pos`` is dropped first.
    """

    role = "draft"
    mode = ExpertsMode.DRAFT

    @property
    def kv_length(self) -> int:
        """Committed plus scratch positions (a host int)."""
        return self.kv.cache.length

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Draft ``input_ids`` at positions ``start_pos..``; returns ``[1, T, V]`` logits.

        Raises:
            ValueError: a bad shape, ``start_pos`` inside the committed prefix (the draft
                never rewrites the target's KV) or beyond ``kv_length``.
        """
        self._check_input(input_ids, start_pos)
        if not self.kv.committed <= start_pos <= self.kv.cache.length:
            raise ValueError(
                f"draft start_pos={start_pos} must lie between the committed length "
                f"{self.kv.committed} and kv_length {self.kv.cache.length}: the draft appends "
                "scratch after the target's committed KV and never rewrites it"
            )
        self.kv.cache.crop_to(start_pos)
        return self._run(input_ids, start_pos)

    def truncate(self, length: int) -> None:
        """Drop scratch positions ``>= length``.

        Raises:
            ValueError: ``length`` is negative or below the committed length (truncate the
                target first: the committed prefix is the target's).
        """
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"truncate length must be a non-negative int, got {length!r}")
        if length < self.kv.committed:
            raise ValueError(
                f"draft truncate({length}) would cut the committed KV ({self.kv.committed} "
                "positions), which belongs to the target: truncate the target first"
            )
        self.kv.cache.crop_to(length)

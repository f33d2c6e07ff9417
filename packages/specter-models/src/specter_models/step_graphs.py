"""CUDA graphs of decode steps: a captured forward per (rows, KV window), replayed.

At batch size one a decode forward is thousands of small kernels, and launching them from
Python costs far more than running them (an H200 runs a DeepSeek-V2-Lite step's kernels
in about 4 ms; transformers' modeling code takes ten times that to launch them). A CUDA
graph records the launches once and replays them with one call.

A graph fixes every shape and address, so a graphed step runs the model in the KV cache's
window mode (``StaticKVCache.window``): the new rows are written at device-side positions,
attention reads the first ``window`` rows (a multiple of ``window_step``, at least the
filled length) and a ``[1, 1, T, window]`` mask hides the rows past each query. Row counts
are padded up to a few buckets (``ROW_BUCKETS``) by repeating the last token: the padding
rows' KV lands past the filled length (scratch, masked, overwritten later) and their logits
are dropped; rows never see rows after them, so the real rows' results do not change (and
with batch invariance not a bit). One graph per ``(bucket, window, batch_invariant)`` is
captured at the first use of that key, right after the same window-mode forward ran
eagerly (which gives that use its result and compiles every kernel); later uses replay it.
``capture_ahead`` captures the keys before a measurement.

Which steps are graphed:

* the **draft**: every forward of ``T <= max_rows`` rows (in practice ``T = 1``); its INT4
  experts are resident and its routing counter is a device-side ``index_add_``;
* the **target**: whole while every expert of every layer holds a slot of its own (no
  budget; token-wise verification is then the same single wave as expert-wise) and no
  routing trace is recorded, i.e. when its forward has no host decision in it. Otherwise
  (a budget: each layer's cache bookkeeping is a host decision) it runs eagerly, or, with
  ``piecewise=True``, **piecewise**: the forward is
  captured as one graph per stretch between two routed-expert calls (attention, norms,
  router, shared experts), and a replay runs those graphs in turn with each MoE layer's
  routed experts computed eagerly in between (``SpecterExperts.target_forward`` on the
  real rows, through the expert cache), as vLLM's piecewise graphs do around attention.

Window mode changes only which masked rows an attention reduction also visits; those
contribute exact zeros, so with batch invariance a graphed verification gives the same bits
as a graphed plain step. Whenever the target's graphs apply, every forward of up to
``max_rows`` rows goes through window mode (eager or replayed), so plain and speculative
decoding compute every row the same way.

A capture that fails (an operation CUDA graphs cannot record, such as a host sync in some
model's code) switches graphs off for that role with the reason kept in ``stats()`` and a
warning; the step's eager result is still returned.

Python's cyclic garbage collector is paused while a graph is captured
(:func:`paused_collection`): torch 2.11 no longer collects before a capture, so a collection
that the forward's own allocations trigger could free a caller's old cycle (graphs, events,
pinned memory) and run its CUDA teardown on the capturing thread, which invalidates the
capture. Garbage left then is collected after the capture, as usual.

``specter_models.load`` turns piecewise graphs on with CUDA graphs (``piecewise_graphs``);
a ``StepGraphs`` built directly leaves them off unless asked for.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedModel

from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.kv_cache import StaticKVCache, cache_keyword

StepKey = tuple[int, int, bool, bool, int, bool]
"""A captured step's key: ``(rows bucket, window, batch_invariant, whole, stream_staging,
stream_waits)``."""

DEFAULT_WINDOW_STEP = 256
"""KV rows a window grows by: attention visits at most this many masked rows per step."""
ROW_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)
"""Row counts graphs are captured for (and ``max_rows``); others are padded up to one."""
MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
"""transformers attention implementations window mode supports, and their mask form."""


@dataclass
class _Step:
    """The static tensors and the capture of one ``(rows bucket, window, batch_invariant,
    whole, stream_staging, stream_waits)`` key."""

    input_ids: torch.Tensor  # [1, T] int64
    positions: torch.Tensor  # [1, T] int64
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the graph's output [1, T, V]
    pieces: _Pieces | None = None  # a piecewise capture instead of ``graph``

    @property
    def captured(self) -> bool:
        return self.graph is not None or self.pieces is not None


@dataclass
class _ExpertCall:
    """One routed-expert call of a piecewise capture: its static inputs and output."""

    module: nn.Module  # the layer's SpecterExperts
    hidden: torch.Tensor  # [T, H], written by the graph before the call
    ids: torch.Tensor  # [T, k]
    weights: torch.Tensor  # [T, k]
    out: torch.Tensor  # [T, H], read by the graph after the call


@dataclass
class _Pieces:
    """Graphs ``g_0 .. g_L`` with the routed-expert calls between them."""

    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    calls: list[_ExpertCall] = field(default_factory=list)


@contextlib.contextmanager
def paused_collection() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block, as it was after it.

    Wraps each capture: no collection can then run a finalizer's CUDA call (a graph's or an
    event's teardown, a pinned block's release) on the thread whose stream is capturing.
    Reference-count frees still happen; only cycles wait for the next collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _PieceRecorder:
    """``ExpertsRuntime.expert_split`` while a target forward is captured piecewise: ends
    the current graph at each routed-expert call, keeps the call's tensors, starts the
    next graph, and hands back a static output the next graph reads."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.pieces = _Pieces()

    def begin(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self.pieces.graphs.append(graph)
        graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")

    def end(self) -> None:
        self.pieces.graphs[-1].capture_end()

    def __call__(self, module, hidden, ids, weights) -> torch.Tensor:
        self.end()
        # Allocated between captures, outside the graphs' pool: the eager expert call of a
        # replay writes it, the next graph reads it.
        out = torch.empty_like(hidden)
        self.pieces.calls.append(_ExpertCall(module, hidden, ids, weights, out))
        self.begin()
        return out


def _experts_of_rows(module, hidden, ids, weights, rows: int, out: torch.Tensor) -> torch.Tensor:
    """The routed experts of the first ``rows`` rows into ``out [T, H]``, zeros for the
    padding rows after them (which would load experts for nothing)."""
    out[:rows].copy_(module.target_forward(hidden[:rows], ids[:rows], weights[:rows]))
    out[rows:].zero_()
    return out


def _eager_expert_split(rows: int) -> Callable[..., torch.Tensor]:
    """``ExpertsRuntime.expert_split`` for an eager window forward with padding rows: the
    routed experts see the real rows only."""

    def split(module, hidden, ids, weights) -> torch.Tensor:
        return _experts_of_rows(module, hidden, ids, weights, rows, torch.empty_like(hidden))

    return split


@dataclass
class StepGraphStats:
    """What the graphs of one role did.

    Attributes:
        captures: graphs captured.
        replays: forwards served by a replay.
        window_eager: forwards run eagerly in window mode (first uses of a key, or every
            use where capture is off).
        disabled_reason: why graphs were switched off, or None.
        keys: the captured ``(rows bucket, window, batch_invariant, whole, stream_staging,
            stream_waits)`` keys (whole: one graph; else piecewise).
    """

    replays: int = 0
    window_eager: int = 0
    disabled_reason: str | None = None
    keys: list[StepKey] = field(default_factory=list)

    @property
    def captures(self) -> int:
        """Graphs captured (one per key)."""
        return len(self.keys)

    def reset_counts(self) -> None:
        """Zero ``replays`` and ``window_eager`` (captured graphs stay)."""
        self.replays = self.window_eager = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "captures": self.captures,
            "replays": self.replays,
            "window_eager": self.window_eager,
            "disabled_reason": self.disabled_reason,
            "graphs": len(self.keys),
            "piecewise_graphs": sum(not key[3] for key in self.keys),
        }


def window_mask(
    positions: torch.Tensor, key_positions: torch.Tensor, kind: str, dtype: torch.dtype
) -> torch.Tensor:
    """The causal mask of window mode: key ``j`` visible to query row ``i`` iff
    ``j <= positions[i]``.

    Args:
        positions: ``[T]`` query positions (device).
        key_positions: ``[W]`` ``0..W-1`` (device).
        kind: ``"bool"`` (True = attend; SDPA) or ``"additive"`` (0 or the dtype's lowest
            value; eager attention).
        dtype: the additive mask's dtype (the model's).

    Returns:
        ``[1, 1, T, W]``.
    """
    visible = key_positions[None, :] <= positions[:, None]
    if kind == "bool":
        return visible[None, None]
    lowest = torch.finfo(dtype).min
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, lowest
    )[None, None]


class StepGraphs:
    """Window-mode forwards of one role (draft or target), captured as CUDA graphs.

    Args:
        model: transformers' model (experts swapped for ``SpecterExperts``).
        runtime: the shared experts runtime.
        cache: the shared KV cache.
        mode: the role's experts mode.
        max_rows: most rows ``T`` a graphed forward takes.
        window_step: windows are multiples of this many rows.
        capture: capture CUDA graphs (needs a CUDA model); False runs window mode eagerly
            every time (what the CPU tests check against the plain forward).
        applicable: whether the role's whole forward is free of host decisions now (the
            target's all-resident check), or None (always: the draft).
        piecewise: where the whole forward is not graphable, graph the stretches between
            its routed-expert calls (the target under a budget; see the module docstring).

    Raises:
        ValueError: non-positive sizes, capture on a non-CUDA model, or an attention
            implementation window mode does not support.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        runtime: ExpertsRuntime,
        cache: StaticKVCache,
        mode: ExpertsMode,
        *,
        max_rows: int,
        window_step: int = DEFAULT_WINDOW_STEP,
        capture: bool = True,
        applicable: Callable[[], bool] | None = None,
        piecewise: bool = False,
    ):
        if max_rows < 1 or window_step < 1:
            raise ValueError(
                f"max_rows and window_step must be positive, got {max_rows} and {window_step}"
            )
        device = next(model.parameters()).device
        if capture and device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need a CUDA model, this one is on {device}; load on a GPU or "
                "pass cuda_graphs=False"
            )
        attn = model.config._attn_implementation
        if attn not in MASK_KINDS:
            raise ValueError(
                f"window mode supports attention implementations {sorted(MASK_KINDS)}, the "
                f"model uses {attn!r}; load it with one of those or pass cuda_graphs=False"
            )
        self.model = model
        self.runtime = runtime
        self.cache = cache
        self.mode = mode
        self.max_rows = max_rows
        self.window_step = window_step
        self.capture = capture
        self._applicable = applicable
        self.piecewise = piecewise
        self._mask_kind = MASK_KINDS[attn]
        self._dtype = next(model.parameters()).dtype
        self._device = device
        self._key_positions = torch.arange(cache.max_seq_len, device=device)
        self._steps: dict[StepKey, _Step] = {}
        self._pool = None
        self._capture_stream: torch.cuda.Stream | None = None
        self.stats = StepGraphStats()

    @property
    def active(self) -> bool:
        """Whether graphs are still on (a failed capture switches them off)."""
        return self.stats.disabled_reason is None

    def for_cache(self, cache: StaticKVCache) -> StepGraphs:
        """The same choices (rows, windows, buckets, when window mode applies) over another
        KV cache, run eagerly, never captured: what a forward of this role gives there, bit
        for bit, without graphs bound to this cache's addresses (a batched sequence's slot,
        ``batch_adapters``)."""
        eager = StepGraphs(
            self.model, self.runtime, cache, self.mode, max_rows=self.max_rows,
            window_step=self.window_step, capture=False, applicable=self._applicable,
            piecewise=self.piecewise,
        )  # fmt: skip
        eager.stats.disabled_reason = self.stats.disabled_reason
        return eager

    def window_for(self, end: int) -> int:
        """The window of a forward that fills positions up to ``end``."""
        step = self.window_step
        return min(self.cache.max_seq_len, -(-end // step) * step)

    def padded_rows(self, rows: int, start_pos: int) -> int:
        """The bucket ``rows`` rows at ``start_pos`` are padded to (``rows`` itself where
        padding would run past ``max_seq_len``)."""
        bucket = next((b for b in ROW_BUCKETS if b >= rows), self.max_rows)
        bucket = min(bucket, self.max_rows)
        return bucket if start_pos + bucket <= self.cache.max_seq_len else rows

    def whole(self) -> bool:
        """Whether the whole forward is graphable now (no host decision in it)."""
        return self._applicable is None or self._applicable()

    def applies(self, rows: int) -> bool:
        """Whether a forward of ``rows`` rows goes through window mode now."""
        if not self.active or not 1 <= rows <= self.max_rows:
            return False
        return self.piecewise or self.whole()

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor | None:
        """Run ``input_ids [1, T]`` at ``start_pos`` in window mode, replayed when captured.

        The caller has cropped the cache to ``start_pos``; afterwards it holds
        ``start_pos + T`` rows.

        Returns:
            Logits ``[1, T, V]`` (a tensor of the caller's own, not the graph's buffer), or
            None when window mode does not apply (run the plain forward instead).
        """
        rows = input_ids.shape[1]
        if not self.applies(rows):
            return None
        padded = self.padded_rows(rows, start_pos)
        end = start_pos + padded
        window = self.window_for(end)
        whole = self.whole()
        # Staging and waits add launches and wait nodes to the target's streamed forward: a
        # graph per staging width and wait switch (the draft, and a target with nothing to
        # stream, never stage or wait).
        streams = self.mode is ExpertsMode.TARGET and self.runtime.streams(padded)
        staging = self.runtime.stream_staging if streams else 0
        waits = self.runtime.stream_waits and streams  # a wait node per layer
        key = (padded, window, self.runtime.batch_invariant, whole, staging, waits)
        step = self._steps.get(key)
        if step is None:
            step = _Step(
                input_ids=torch.empty(1, padded, dtype=torch.long, device=self._device),
                positions=torch.empty(1, padded, dtype=torch.long, device=self._device),
            )
            self._steps[key] = step
        step.input_ids[:, :rows].copy_(input_ids)
        if padded > rows:
            step.input_ids[:, rows:].copy_(input_ids[:, -1:].expand(1, padded - rows))
        step.positions.copy_(self._key_positions[start_pos:end].unsqueeze(0))
        if step.captured:
            self._replay(step, rows)
            self.stats.replays += 1
            logits = step.logits
        else:
            split = None if whole or padded == rows else _eager_expert_split(rows)
            logits = self._window_forward(step, window, end, split)
            self.stats.window_eager += 1
            if self.capture:
                self._capture(key, step, window, end)
        self.cache.set_length(start_pos + rows)  # the padding rows are scratch
        return logits[:, :rows].clone()  # the next replay overwrites the graph's buffer

    def capture_ahead(
        self,
        max_end: int | None = None,
        *,
        min_end: int = 1,
        max_rows: int | None = None,
        on_logits: Callable[[torch.Tensor], object] | None = None,
    ) -> int:
        """Capture every row bucket's graph up to ``max_rows`` rows for every window from the
        one holding ``min_end`` positions to the one holding ``max_end`` (default
        ``max_seq_len``), so no forward in that range captures.

        Each capture first runs its forward eagerly at the window's last positions: that
        writes scratch KV rows (and, for the draft, routing counts), so reset the model
        afterwards (``SpecterModel.capture_step_graphs`` does).

        Args:
            max_end: the most positions a later forward fills (default ``max_seq_len``).
            min_end: the fewest (default 1): windows below it are not captured, e.g. those
                a prompt's prefill has passed already.
            max_rows: the widest forward to capture (default: this role's ``max_rows``);
                1 captures plain decoding's steps only.
            on_logits: called with each capturing forward's logits (``[1, rows, V]``), as
                the decode will call what runs on them outside the graphs (the model's
                argmax): its kernels then compile here, not in the first decode (a fresh
                machine's first ``specter generate`` took 10.9 ms a token on
                DeepSeek-V2-Lite at 24 GB against 7.4 with the argmax compiled).

        Returns:
            Graphs captured by this call.

        Raises:
            RuntimeError: capture is off, or graphs do not apply to this role now.
            ValueError: ``min_end`` or ``max_rows`` is not a positive int, or ``min_end``
                is past ``max_end``.
        """
        if not self.capture:
            raise RuntimeError("capture_ahead needs capture=True (CUDA graphs)")
        if not self.applies(1):
            raise RuntimeError(
                f"the {self.mode.value}'s steps cannot be graphed now: "
                f"{self.stats.disabled_reason or 'a host decision in its forward'}"
            )
        max_end = self.cache.max_seq_len if max_end is None else max_end
        for name, value in (("min_end", min_end), ("max_rows", max_rows)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if min_end > max_end:
            raise ValueError(
                f"min_end={min_end} is past max_end={max_end}: no window to capture; give a "
                "min_end at most max_end"
            )
        limit = self.max_rows if max_rows is None else min(max_rows, self.max_rows)
        before = self.stats.captures
        buckets = sorted({min(b, limit) for b in (*ROW_BUCKETS, limit)})
        first, last = self.window_for(min_end), self.window_for(max_end)
        windows = [*range(self.window_step, last, self.window_step), last]
        for window in [w for w in windows if w >= first]:
            for rows in buckets:
                if rows > window or not self.active:
                    continue
                start = window - rows
                self.cache.crop_to(start)
                ids = torch.zeros(1, rows, dtype=torch.long, device=self._device)
                logits = self.forward(ids, start)
                if on_logits is not None:
                    on_logits(logits)
        self.cache.crop_to(0)
        return self.stats.captures - before

    def _window_forward(
        self, step: _Step, window: int, end: int, split: Callable[..., torch.Tensor] | None
    ) -> torch.Tensor:
        """The forward a graph records (device-side positions and mask, fixed shapes);
        ``split`` takes the routed-expert calls (``ExpertsRuntime.expert_split``)."""
        positions = step.positions[0]
        mask = window_mask(positions, self._key_positions[:window], self._mask_kind, self._dtype)
        with (
            torch.no_grad(),
            self.runtime.running(self.mode),
            self.runtime.splitting_experts(split),
            self.cache.window(window, positions, end),
        ):
            output = self.model(
                input_ids=step.input_ids,
                position_ids=step.positions,
                attention_mask=mask,
                **{cache_keyword(self.model): self.cache},
                use_cache=True,
            )
        return output.logits

    def _capture(self, key: StepKey, step: _Step, window: int, end: int) -> None:
        """Record ``step``'s window forward, whole or piecewise (nothing runs: the KV rows
        and routing counts of this use came from the eager forward just before)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one pool: graphs never overlap
        try:
            with paused_collection():
                logits = self._record(key, step, window, end)
        except Exception as error:  # a model op CUDA graphs cannot record
            reason = f"capture of {self.mode.value} rows={key[0]} window={key[1]} failed: {error}"
            self.stats.disabled_reason = reason
            warnings.warn(f"CUDA graphs switched off: {reason}", RuntimeWarning, stacklevel=3)
            return
        step.logits = logits
        self.stats.keys.append(key)

    def _record(self, key: StepKey, step: _Step, window: int, end: int) -> torch.Tensor:
        """``_capture``'s recording, whole (``key[3]``) or piecewise; returns the static
        logits and sets ``step.graph`` or ``step.pieces``."""
        if key[3]:
            graph = torch.cuda.CUDAGraph()
            # thread_local: CUDA calls of other threads (a user's) stay legal meanwhile.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                logits = self._window_forward(step, window, end, None)
            step.graph = graph
        else:
            step.pieces, logits = self._capture_pieces(step, window, end)
        return logits

    def capture_stream(self) -> torch.cuda.Stream:
        """The one side stream every piecewise capture of these graphs records on (captures
        need a stream other than the default). One, not a new one a capture: cuBLAS keeps a
        workspace per stream it runs on (32 MiB on the H200) for the process's life, and
        ``torch.cuda.Stream()`` hands out the pool's 32 streams in turn, so a stream a
        capture cost DeepSeek-V2-Lite's draftless 24 GB load 1.1 GB of workspaces (33 of
        them), past its memory plan."""
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(device=self._device)
        return self._capture_stream

    def _capture_pieces(self, step: _Step, window: int, end: int) -> tuple[_Pieces, torch.Tensor]:
        """Capture the forward as graphs split at its routed-expert calls."""
        recorder = _PieceRecorder(self._pool)
        torch.cuda.synchronize()
        stream = self.capture_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            recorder.begin()
            try:
                logits = self._window_forward(step, window, end, recorder)
            finally:
                recorder.end()
        torch.cuda.current_stream().wait_stream(stream)
        return recorder.pieces, logits

    def _replay(self, step: _Step, rows: int) -> None:
        """Replay ``step``: its graph, or its pieces with the routed experts of the first
        ``rows`` rows computed eagerly between them (padding rows' outputs stay zero)."""
        if step.graph is not None:
            step.graph.replay()
            return
        pieces = step.pieces
        with torch.no_grad(), self.runtime.running(self.mode):
            for graph, call in zip(pieces.graphs, [*pieces.calls, None], strict=True):
                graph.replay()
                if call is None:
                    break
                _experts_of_rows(call.module, call.hidden, call.ids, call.weights, rows, call.out)

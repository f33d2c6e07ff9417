"""Routing replay: a model computes the experts a recorded (trained) model routed to.

Random weights route like no trained model (near-tie routers), and every cache and prefetch
figure depends on the routing. A replay makes the full-size random-weight model move,
stream and compute exactly the experts of a :class:`~specter_models.routing_trace.RoutingTrace`
recorded on a trained model of the same topology (layers, experts, top-k):

* **Expert ids.** Each ``SpecterExperts`` call of a row at absolute position ``t`` takes
  its top-k ids from the trace (``SpecterExperts.routed_ids``): the target's routing for
  target forwards, the draft's for draft forwards. The substitution happens at the entry
  of the experts module, so everything downstream sees the trace's ids: the draft's routing
  counter (and the prefetcher reading it), the cache's bookkeeping, the streamed-miss
  record, routing recorders. The router's weights stay (the trace holds ids only), so the
  output is garbage of the right cost.
* **On the device.** The ids are gathered from ``[L, S, k]`` device tables (``S`` the KV
  cache's positions) by the forward's device position tensor, which a forward pre-hook on
  the model takes from its ``position_ids``: inside a captured CUDA graph (whole,
  piecewise, streamed) the gather is recorded with the step's static position buffer, so a
  replayed graph gathers the current step's ids with no host work.
* **Acceptance.** :meth:`RoutingReplay.start` selects the sequence whose prompt is the
  generation's prompt, fills the tables and returns specter-spec's ``RecordedAcceptance``:
  the controller (``SpecController(acceptance=)``) commits the trace's tokens and accepts
  what the trace's agreement flags decide, whatever the model's own tokens.

Exact: the target's experts at every committed position, the draft's at every position it
drafts while its proposals agree, the accepted count of every iteration. Approximated:
after a rejected proposal a real draft would route its own wrong tokens, which the trace
does not hold; the replay gives those draft steps the trace's teacher-forced routing of
the same position.

Attach a replay before capturing CUDA graphs (graphs captured meanwhile keep gathering from
the tables, so a replay stays attached for the model's life).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specter_models.experts_runtime import ExpertsMode
from specter_models.routing_trace import RoutingTrace, TracedSequence
from specter_spec import RecordedAcceptance

__all__ = ["RoutingReplay", "RoutingReplayConfig", "replay_routing"]


@dataclass(frozen=True)
class RoutingReplayConfig:
    """A routing replay's choice.

    Attributes:
        trace: the trace file (``specter record-routing --out``).
        sequence: the sequence the tables hold once attached, until a generation selects
            its own (``RoutingReplay.start``, by its prompt); ``specter bench`` replays
            sequence ``i`` for prompt ``i``.
    """

    trace: Path
    sequence: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.trace, str | Path) or not str(self.trace):
            raise ValueError(f"RoutingReplayConfig.trace={self.trace!r}: expected a file path.")
        object.__setattr__(self, "trace", Path(self.trace))
        if isinstance(self.sequence, bool) or not isinstance(self.sequence, int):
            raise ValueError(
                f"RoutingReplayConfig.sequence={self.sequence!r}: expected an int >= 0."
            )
        if self.sequence < 0:
            raise ValueError(
                f"RoutingReplayConfig.sequence={self.sequence!r}: expected an int >= 0."
            )


class RoutingReplay:
    """The device tables and the position hook of one model's replay (module docstring).

    Build it with :func:`replay_routing`.

    Attributes:
        trace: the trace replayed.
        positions: ``[T]`` device positions of the running forward's rows (set by the hook).
        sequence: the index of the selected sequence, or None before the first.
    """

    def __init__(
        self,
        trace: RoutingTrace,
        *,
        max_seq_len: int,
        vocab_size: int,
        device: torch.device,
        with_draft: bool,
    ) -> None:
        if with_draft and not trace.has_draft:
            raise ValueError(
                f"routing trace {trace.name} holds the target's routing only (recorded with "
                "--no-draft); a model with a draft needs the draft's routing too: record "
                "again without --no-draft, or replay on a model without a draft."
            )
        self.trace = trace
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.device = torch.device(device)
        shape = (trace.moe_layers, max_seq_len, trace.top_k)
        self._target = torch.zeros(shape, dtype=torch.long, device=self.device)
        self._draft = (
            torch.zeros(shape, dtype=torch.long, device=self.device) if with_draft else None
        )
        self.positions: torch.Tensor | None = None
        self.sequence: int | None = None
        self._by_prompt: dict[tuple[int, ...], int] = {}
        for i, s in enumerate(trace.sequences):
            self._by_prompt.setdefault(tuple(s.tokens[: s.prompt_len].tolist()), i)

    # --------------------------------------------------------------------- selection
    def prompt(self, index: int) -> list[int]:
        """Sequence ``index``'s prompt ids (what a generation replaying it is given).

        Raises:
            ValueError: no such sequence.
        """
        s = self.trace.check_length(index, 0)
        return s.tokens[: s.prompt_len].tolist()

    def start(self, prompt_ids: Any, max_new_tokens: int) -> RecordedAcceptance:
        """Select the sequence whose prompt is ``prompt_ids``; see :meth:`select`.

        Raises:
            ValueError: no sequence has this prompt, or as :meth:`select`.
        """
        key = tuple(
            int(t) for t in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)
        )
        index = self._by_prompt.get(tuple(key))
        if index is None:
            raise ValueError(
                f"a prompt of {len(key)} tokens is none of routing trace {self.trace.name}'s "
                f"{len(self.trace.sequences)} sequence prompts; under routing replay a "
                "generation's prompt must be a recorded one (RoutingReplay.prompt(i))."
            )
        return self.select(index, max_new_tokens)

    def select(self, index: int, max_new_tokens: int) -> RecordedAcceptance:
        """Fill the tables with sequence ``index`` and return its recorded acceptance (for
        ``SpecController(acceptance=)``). Host-to-device copies: call it before a
        generation, not inside one.

        Raises:
            ValueError: no such sequence, a continuation shorter than ``max_new_tokens``,
                or token ids outside the model's vocabulary.
        """
        s = self.trace.check_length(index, max_new_tokens)
        if int(s.tokens.max()) >= self.vocab_size:
            raise ValueError(
                f"routing trace {self.trace.name}: sequence {index} holds token id "
                f"{int(s.tokens.max())}, outside this model's vocabulary of {self.vocab_size}."
            )
        self._fill(self._target, s.target)
        if self._draft is not None:
            self._fill(self._draft, s.draft)
        self.sequence = index
        agree = s.agree if s.agree is not None else torch.zeros(s.length, dtype=torch.bool)
        return RecordedAcceptance(s.tokens.to(self.device), agree.to(self.device))

    def _fill(self, table: torch.Tensor, routing: torch.Tensor | None) -> None:
        """``table [L, S, k]`` from ``routing [N, L, k]``: positions past the trace (the
        padding rows of a graphed step, captures at far positions) repeat its last row."""
        assert routing is not None
        rows = min(routing.shape[0], self.max_seq_len)
        host = routing[:rows].long().transpose(0, 1)  # [L, rows, k]
        table[:, :rows].copy_(host)
        if rows < self.max_seq_len:
            table[:, rows:].copy_(
                host[:, -1:].to(self.device).expand(-1, self.max_seq_len - rows, -1)
            )

    def current(self) -> TracedSequence | None:
        """The selected sequence, or None."""
        return None if self.sequence is None else self.trace.sequences[self.sequence]

    # ------------------------------------------------------------------- substitution
    def expert_ids(
        self, layer: int, mode: ExpertsMode | None, router_ids: torch.Tensor
    ) -> torch.Tensor:
        """``[T, k]`` ids for MoE layer ``layer``'s rows at :attr:`positions`: the target's
        table in a target forward, the draft's in a draft forward (``router_ids`` outside
        either, where the experts module refuses to run anyway).

        Raises:
            RuntimeError: no positions observed for this forward's rows.
        """
        table = self._target if mode is ExpertsMode.TARGET else None
        if mode is ExpertsMode.DRAFT:
            table = self._draft
        if table is None:
            return router_ids
        positions = self.positions
        if positions is None or positions.numel() != router_ids.shape[0]:
            got = None if positions is None else positions.numel()
            raise RuntimeError(
                f"routing replay: MoE layer {layer} got {router_ids.shape[0]} rows but the "
                f"model's forward gave {got} positions; a replayed model must be called with "
                "position_ids for its one sequence (batch size 1)."
            )
        return table[layer].index_select(0, positions)

    def _observe_positions(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on the model: keep its ``position_ids`` (a view, no copy)."""
        del module, args
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            raise RuntimeError(
                "routing replay: the model was called without position_ids; replayed forwards "
                "go through the target or draft adapter, which passes them."
            )
        self.positions = position_ids.reshape(-1)


def replay_routing(
    lm: Any, trace: RoutingTrace | RoutingReplayConfig | str | Path
) -> RoutingReplay:
    """Attach a routing replay to ``lm`` (a ``SpecterModel``) before its graphs are captured.

    Args:
        lm: the loaded model.
        trace: a trace, or its file; or a config: its trace, whose ``sequence`` the tables
            hold until the first :meth:`RoutingReplay.start` (else sequence 0).

    Returns:
        The replay; :meth:`RoutingReplay.start` before each generation.

    Raises:
        ValueError: a topology other than the model's, a draft without draft routing in the
            trace, or a trace file that is not a routing trace.
        FileNotFoundError: no such file.
        RuntimeError: the model replays already, or has captured CUDA graphs.
    """
    first = 0
    if isinstance(trace, RoutingReplayConfig):
        trace, first = trace.trace, trace.sequence
    if not isinstance(trace, RoutingTrace):
        trace = RoutingTrace.load(trace)
    runtime = lm.runtime
    if getattr(runtime, "routing_replay", None) is not None:
        raise RuntimeError("this model replays a routing trace already; load it again for another.")
    captured = [role for role, stats in lm.graph_stats().items() if stats and stats.get("captures")]
    if captured:
        raise RuntimeError(
            f"the {' and '.join(captured)}'s CUDA graphs were captured before the routing replay "
            "was attached; attach it right after loading, before capture_step_graphs."
        )
    trace.check_topology(
        lm.cache.num_layers, lm.cache.num_experts, int(lm.config.num_experts_per_tok),
        f"{lm.source}",
    )  # fmt: skip
    replay = RoutingReplay(
        trace,
        max_seq_len=lm.kv.cache.max_seq_len,
        vocab_size=int(lm.config.vocab_size),
        device=lm.device,
        with_draft=lm.draft is not None,
    )
    replay.select(first, 0)  # the tables never hold anything but a recorded sequence
    lm.model.register_forward_pre_hook(replay._observe_positions, with_kwargs=True)
    runtime.routing_replay = replay
    return replay

"""Batched speculative decoding: several sequences, one draft pass and one verification a step.

:class:`BatchedSpecController` decodes up to ``num_slots`` sequences together over a draft
and a target following :class:`~specter_spec.batch_model.BatchSpecModel`. A step, for the
active sequences ``b`` (each with ``n_b`` committed tokens, its slot of the target holding
``n_b - 1`` positions):

1. **Depth**: the depth policy picks K; sequence ``b`` drafts ``K_b = min(K, remaining_b
   - 1)`` proposals (no more than its budget can commit).
2. **Draft**: ``max K_b`` batched draft forwards; forward ``i`` runs one row of every
   sequence with ``K_b > i`` (its first feeds the committed tokens the draft has not
   cached), and each proposal is its sequence's argmax or a draw from its own ``q`` with its
   own generator.
3. **Verify**: one batched target forward over every sequence's ``[t_b[n_b-1], d_b[1..K_b]]``
   at its own positions: ``sum (K_b + 1)`` rows.
4. **Accept**: each sequence's greedy or sampled acceptance (``acceptance``) on its own
   rows; every sequence's accepted count, correction or bonus token and proposals come
   back to the host in one copy, the step's one host synchronisation.
5. **Commit**: each sequence commits its ``a_b + 1`` tokens (cut at its stop token or
   budget) and rolls its own slot back in both models; a sequence that finished leaves
   after the step and frees its slot.

So each sequence decodes as :class:`~specter_spec.controller.SpecController` decodes it
alone: greedy output is its target-only greedy output, and sampled output follows the
target's distribution per sequence (with the same seed and the same depths, the same draws).
Sequences join (:meth:`add`, which prefills the new sequence at once) and leave
(:meth:`cancel`, or finishing) at step boundaries. With depth 0 and no draft a step is one
target forward of one row per sequence: batched plain decoding.

The observer (``cache``) sees one draft and one verification per step for the whole
batch: ``on_draft_start(max K_b)``, ``on_draft_token(i)`` per batched draft forward,
``on_verify_start(rows)`` and ``on_verify_end(accepted over the batch)``; its routing
counts and prefetch plan therefore aggregate over the batch. A depth policy learns the
acceptance from every sequence's iteration and the step's costs once a step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from specter_spec.acceptance import AcceptanceResult, greedy_accept, rejection_sample
from specter_spec.batch_model import BatchSpecModel, SlotRows, check_batch_model
from specter_spec.batch_sequence import BatchEvent, BatchFullError, BatchSequence, BatchStepRecord
from specter_spec.depth.policy import (
    DepthPolicy,
    check_depth,
    controller_depth,
    is_plain,
)
from specter_spec.sampling import SamplingConfig, check_finite_logits, sampling_probs
from specter_spec.spec_model import model_argmax, model_device
from specter_spec.speculation_observer import check_observer
from specter_spec.statistics import GenerationStats, IterationStats
from specter_spec.token_stream import prompt_tensor

__all__ = ["BatchEvent", "BatchFullError", "BatchedSpecController"]


class BatchedSpecController:
    """Draft-then-verify decoding of several sequences at once (see the module docstring).

    Args:
        draft: the proposing batched model; None only with ``depth=0``.
        target: the batched model whose output each sequence reproduces exactly.
        cache: a speculation observer (specter-cache's prefetcher), or None.
        depth: K >= 0, or a depth policy (``AdaptiveDepth``).
        clock: returns seconds (default ``time.perf_counter``: no device synchronisation
            beyond the step's one, so on a GPU a phase's time is its launches'; the step's
            whole time is measured after that synchronisation).
        check_kv: check every slot's KV lengths after every step (host ints only).

    Raises:
        TypeError: a model or the observer does not follow its protocol.
        ValueError: ``draft`` is None with speculation, the two models are one object, or
            they hold different numbers of slots.

    Example:
        >>> controller = BatchedSpecController(SlotModels(drafts), SlotModels(targets), depth=4)
        >>> first = controller.add([1, 2, 3], max_new_tokens=16)  # doctest: +SKIP
        >>> while controller.active:  # doctest: +SKIP
        ...     events = controller.step()
    """

    def __init__(
        self,
        draft: BatchSpecModel | None,
        target: BatchSpecModel,
        cache: object | None = None,
        depth: int | DepthPolicy = 4,
        *,
        clock: Callable[[], float] | None = None,
        check_kv: bool = True,
    ) -> None:
        check_batch_model(target, "target")
        self.depth_policy = controller_depth(draft, depth, "batched plain decoding")
        if draft is not None:
            check_batch_model(draft, "draft")
            if draft is target:
                raise ValueError("draft and target are the same object; give each its own")
            if draft.num_slots != target.num_slots:
                raise ValueError(
                    f"the draft holds {draft.num_slots} slots and the target "
                    f"{target.num_slots}; they must hold the same sequences"
                )
        if cache is not None:
            check_observer(cache)
        self.draft = draft
        self.target = target
        self.cache = cache
        self.clock = clock or time.perf_counter
        self.check_kv = check_kv
        self.max_batch = target.num_slots
        self.history: list[BatchStepRecord] = []
        self._draft_argmax = model_argmax(draft)
        self._target_argmax = model_argmax(target)
        self._device = model_device(target)
        self._free = list(range(self.max_batch))
        self._active: list[BatchSequence] = []
        self._sequences: dict[int, BatchSequence] = {}
        self._next_id = 0

    # -- sequences -------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Sequences in the batch (decoding, or leaving at the next step)."""
        return len(self._active)

    def sequence(self, seq_id: int) -> BatchSequence:
        """The state of sequence ``seq_id`` (kept after it finished).

        Raises:
            KeyError: no such sequence.
        """
        try:
            return self._sequences[seq_id]
        except KeyError:
            raise KeyError(
                f"no sequence {seq_id!r}: ids are those add() returned "
                f"({sorted(self._sequences)[:8]}...)"
            ) from None

    def add(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        *,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Iterable[int] = (),
        generator: torch.Generator | None = None,
    ) -> int:
        """Prefill a new sequence into a free slot; it decodes from the next step on.

        Args:
            prompt_ids: ``[P]`` or ``[1, P]`` token ids, P >= 1.
            max_new_tokens: the most tokens it may generate (>= 0).
            sampling: its decoding (default greedy).
            stop_token_ids: tokens that end it (included in its output).
            generator: its random source; overrides ``sampling.seed``.

        Returns:
            The sequence's id.

        Raises:
            BatchFullError: every slot holds an active sequence.
            ValueError, TypeError: a bad prompt, budget, stop list or sampling.
        """
        if not self._free:
            raise BatchFullError(
                f"all {self.max_batch} slots hold active sequences; step until one finishes "
                "(or cancel one) before adding another, or hold more (max_batch)"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}.")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}.")
        stop = frozenset(stop_token_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
            raise TypeError(f"stop_token_ids must be int token ids, got {sorted(stop, key=str)}.")
        sampling = SamplingConfig.greedy() if sampling is None else sampling
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(
                f"sampling must be a SamplingConfig, got {type(sampling).__name__}; "
                "use SamplingConfig.greedy() or SamplingConfig(temperature=...)."
            )
        prompt = prompt_tensor(prompt_ids, self._device)
        device = prompt.device
        length = prompt.numel()
        committed = torch.empty(length + max_new_tokens, dtype=torch.long, device=device)
        committed[:length] = prompt
        slot = self._free.pop(0)
        seq = BatchSequence(
            seq_id=self._next_id,
            slot=slot,
            committed=committed,
            n=length,
            prompt_length=length,
            max_new_tokens=max_new_tokens,
            stop=stop,
            sampling=sampling,
            generator=generator if generator is not None else sampling.make_generator(device),
            stats=GenerationStats(prompt_length=length),
        )
        try:
            seq.stats.prefill_time_s = self._prefill(seq)
        except BaseException:
            self._release(seq)
            raise
        if max_new_tokens == 0:
            seq.finish_reason = "max_new_tokens"
        self._next_id += 1
        self._sequences[seq.seq_id] = seq
        self._active.append(seq)
        return seq.seq_id

    def forget(self, seq_id: int) -> None:
        """Drop finished sequence ``seq_id``'s state (its tokens and statistics), as a
        long-running server does once it has handed them out.

        Raises:
            KeyError: no such sequence.
            RuntimeError: it is still in the batch.
        """
        seq = self.sequence(seq_id)
        if seq in self._active:
            raise RuntimeError(
                f"sequence {seq_id} is still in the batch; cancel it and step once first"
            )
        del self._sequences[seq_id]

    def cancel(self, seq_id: int) -> None:
        """Make sequence ``seq_id`` leave at the next step boundary (its tokens so far are
        kept; the next step reports it finished, reason ``"cancelled"``). A finished
        sequence stays as it is.

        Raises:
            KeyError: no such sequence.
        """
        seq = self.sequence(seq_id)
        if not seq.finished:
            seq.cancelled = True

    # -- one step --------------------------------------------------------------------

    def step(self) -> list[BatchEvent]:
        """One decoding step of every active sequence (see the module docstring).

        Returns:
            One event per sequence that committed tokens or left, in join order.

        Raises:
            RuntimeError: a model breaks the KV contract or returns logits of a wrong shape.
        """
        leaving = [seq for seq in self._active if seq.cancelled or seq.finished]
        events = [self._leave(seq, seq.finish_reason or "cancelled", []) for seq in leaving]
        run = list(self._active)
        if not run:
            return events
        clock = self.clock
        started = clock()
        depth = check_depth(self.depth_policy.choose_depth(), "the depth policy's choice")
        depths = [min(depth, seq.remaining - 1) for seq in run]
        widest = max(depths)
        observer = self.cache
        if observer is not None:
            observer.on_draft_start(widest)
        proposals, draft_probs = self._draft(run, depths, widest)
        draft_end = clock()
        rows = sum(depths) + len(run)
        if observer is not None:
            observer.on_verify_start(rows)
        logits = self._verify(run, proposals)
        outcomes = self._accept(run, proposals, draft_probs, logits)
        # The one host synchronisation of the step: every sequence's accepted count,
        # correction or bonus token and proposals, in a single copy.
        parts = []
        for outcome, props in zip(outcomes, proposals, strict=True):
            parts += [outcome.num_accepted.view(1), outcome.next_token.view(1), props]
        host = torch.cat(parts).tolist()
        verify_end = clock()
        accepted = []
        at = 0
        for d in depths:
            accepted.append(host[at])
            at += 2 + d
        if observer is not None:
            observer.on_verify_end(sum(accepted))
        committed, at = [], 0
        for seq, d, outcome, props in zip(run, depths, outcomes, proposals, strict=True):
            a, next_token = host[at], host[at + 1]
            new = self._commit(seq, [*host[at + 2 : at + 2 + a], next_token], props, outcome, a)
            committed.append(new)
            at += 2 + d
        ended = clock()
        self._record(run, depths, accepted, committed, (started, draft_end, verify_end, ended))
        self.history.append(
            BatchStepRecord(len(run), widest, rows, sum(map(len, committed)), ended - started)
        )
        for seq, new in zip(run, committed, strict=True):
            events.append(
                self._leave(seq, seq.finish_reason, new)
                if seq.finished
                else BatchEvent(seq.seq_id, new, False, None)
            )
        return events

    def _prefill(self, seq: BatchSequence) -> float:
        """Prefill ``seq``'s prompt into its slot (target, and a draft of its own KV);
        returns the seconds it took."""
        target, draft, slot = self.target, self.draft, seq.slot
        start = self.clock()
        target.truncate(slot, 0)
        if draft is not None:
            draft.truncate(slot, 0)
        length = seq.prompt_length
        if length > 1:
            target.prefill(slot, seq.committed[: length - 1].unsqueeze(0), 0)
            speculates = not is_plain(self.depth_policy)
            if draft is not None and speculates and draft.kv_length(slot) < length - 1:
                cached = draft.kv_length(slot)
                draft.prefill(slot, seq.committed[cached : length - 1].unsqueeze(0), cached)
        self._check_contract(seq, where="after prefill")
        return self.clock() - start

    def _draft(
        self, run: list[BatchSequence], depths: list[int], widest: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``widest`` batched draft forwards; per sequence its proposals ``[K_b]`` and, when
        it samples, ``q`` ``[K_b, V]``."""
        device = run[0].committed.device
        empty = torch.empty(0, dtype=torch.long, device=device)
        proposals: list[list[torch.Tensor]] = [[] for _ in run]
        q_rows: list[list[torch.Tensor]] = [[] for _ in run]
        if widest == 0:
            return [empty] * len(run), [None] * len(run)
        draft, observer = self.draft, self.cache
        feeds, positions = [], []
        for seq in run:
            position = draft.kv_length(seq.slot)
            if not 0 <= position <= seq.n - 1:
                raise RuntimeError(
                    f"KV contract broken: the draft's slot {seq.slot} holds {position} "
                    f"positions but only {seq.n} tokens are committed; it must hold at most "
                    f"{seq.n - 1} before drafting."
                )
            feeds.append(seq.committed[position : seq.n])
            positions.append(position)
        for index in range(widest):
            group = [b for b, d in enumerate(depths) if d > index]
            batch = [SlotRows(run[b].slot, feeds[b], positions[b]) for b in group]
            logits = draft.forward_batch(batch)
            ends = _row_ends(batch)
            if ends[-1] >= len(batch):  # a feed of several rows: each entry's last one
                logits = logits.index_select(0, _on_device(ends, logits.device))
            last = logits.to(device)
            greedy = [i for i, b in enumerate(group) if run[b].sampling.is_greedy]
            if greedy:
                rows = last if len(greedy) == len(group) else last[_on_device(greedy, device)]
                tokens = self._draft_argmax(rows)
                for j, i in enumerate(greedy):
                    proposals[group[i]].append(tokens[j])
            for i, b in enumerate(group):
                seq = run[b]
                if seq.sampling.is_greedy:
                    continue
                q = sampling_probs(last[i], seq.sampling)
                proposals[b].append(torch.multinomial(q, 1, generator=seq.generator)[0])
                q_rows[b].append(q)
            if observer is not None:
                observer.on_draft_token(index)
            for b in group:
                positions[b] += feeds[b].shape[0]
                feeds[b] = proposals[b][-1].view(1)
        if self.check_kv:
            for b, seq in enumerate(run):
                if depths[b] and draft.kv_length(seq.slot) != positions[b]:
                    raise RuntimeError(
                        f"the draft's slot {seq.slot} holds {draft.kv_length(seq.slot)} "
                        f"positions after drafting, expected {positions[b]}: forward_batch "
                        "must append exactly the KV of the rows it is given."
                    )
        stacked = [torch.stack(p) if p else empty for p in proposals]
        probs = [torch.stack(q) if q else None for q in q_rows]
        return stacked, probs

    def _verify(self, run: list[BatchSequence], proposals: list[torch.Tensor]) -> torch.Tensor:
        """The target's batched forward over every sequence's verified rows: ``[N, V]``."""
        target = self.target
        batch = []
        for seq, props in zip(run, proposals, strict=True):
            if self.check_kv and target.kv_length(seq.slot) != seq.n - 1:
                raise RuntimeError(
                    f"KV contract broken before verify: the target's slot {seq.slot} holds "
                    f"{target.kv_length(seq.slot)} positions, expected {seq.n - 1} "
                    "(committed minus the uncached last token). A shared-KV draft must keep "
                    "its scratch invisible to the target."
                )
            ids = torch.cat([seq.committed[seq.n - 1 : seq.n], props])
            batch.append(SlotRows(seq.slot, ids, seq.n - 1))
        logits = target.forward_batch(batch)
        rows = sum(r.input_ids.shape[0] for r in batch)
        if logits.dim() != 2 or logits.shape[0] != rows:
            raise RuntimeError(
                f"the target returned logits of shape {tuple(logits.shape)} for {rows} rows; "
                f"expected [{rows}, V]"
            )
        if any(not seq.stats.iterations for seq in run):  # a joining sequence: one host read
            check_finite_logits(logits, "target")
        return logits

    def _accept(
        self,
        run: list[BatchSequence],
        proposals: list[torch.Tensor],
        draft_probs: list[torch.Tensor | None],
        logits: torch.Tensor,
    ) -> list[AcceptanceResult]:
        """Each sequence's acceptance on its own rows (greedy ones share one argmax)."""
        device = run[0].committed.device
        logits = logits.to(device)
        greedy = any(seq.sampling.is_greedy for seq in run)
        choices = self._target_argmax(logits) if greedy else None
        outcomes, begin = [], 0
        for seq, props, q in zip(run, proposals, draft_probs, strict=True):
            end = begin + props.shape[0] + 1
            rows = logits[begin:end]
            if seq.sampling.is_greedy:
                chosen = choices[begin:end]
                outcomes.append(greedy_accept(props, rows, lambda _rows, c=chosen: c))
            else:
                p = sampling_probs(rows, seq.sampling)
                q = p.new_zeros(0, p.shape[-1]) if q is None else q.to(p.dtype)
                try:
                    outcomes.append(rejection_sample(props, q, p, seq.generator))
                except RuntimeError:  # torch.multinomial refuses NaN and infinite probabilities
                    check_finite_logits(rows, "target")
                    raise
            begin = end
        return outcomes

    def _commit(
        self,
        seq: BatchSequence,
        tokens: list[int],
        proposals: torch.Tensor,
        outcome: AcceptanceResult,
        accepted: int,
    ) -> list[int]:
        """Commit ``tokens`` (the accepted proposals, then the correction or bonus token)
        to ``seq``, cut at its stop token or budget, and roll its slot back; returns what
        it committed."""
        new = tokens[: seq.remaining]
        stop_at = next((i for i, t in enumerate(new) if t in seq.stop), None)
        if stop_at is not None:
            new = new[: stop_at + 1]
        count = len(new)
        appended = torch.cat([proposals[:accepted], outcome.next_token.view(1)])
        seq.committed[seq.n : seq.n + count] = appended[:count]
        seq.n += count
        seq.tokens.extend(new)
        self.target.truncate(seq.slot, seq.n - 1)
        if self.draft is not None:
            self.draft.truncate(seq.slot, seq.n - 1)
        self._check_contract(seq, where="after commit")
        if stop_at is not None:
            seq.finish_reason = "stop_token"
        elif seq.remaining == 0:
            seq.finish_reason = "max_new_tokens"
        return new

    def _record(
        self,
        run: list[BatchSequence],
        depths: list[int],
        accepted: list[int],
        committed: list[list[int]],
        times: tuple[float, float, float, float],
    ) -> None:
        """Each sequence's ``IterationStats`` of the step, and the depth policy's feed: the
        acceptance of every sequence, the step's costs once (from a sequence that drafted
        the step's K; none when a sequence's first step carries its prefill's work)."""
        started, draft_end, verify_end, ended = times
        widest = max(depths)
        timed = all(seq.stats.iterations for seq in run)
        carrier = depths.index(widest) if timed else -1
        for b, seq in enumerate(run):
            record = IterationStats(
                depth=depths[b],
                accepted=accepted[b],
                bonus=accepted[b] == depths[b],
                committed=len(committed[b]),
                draft_time_s=draft_end - started,
                verify_time_s=verify_end - draft_end,
                total_time_s=ended - started,
                verified=depths[b],
                first=not seq.stats.iterations,
            )
            seq.stats.iterations.append(record)
            feed = record if b == carrier else dataclasses.replace(record, first=True)
            self.depth_policy.observe(feed)

    def _leave(self, seq: BatchSequence, reason: str | None, tokens: list[int]) -> BatchEvent:
        """Finish ``seq`` (``reason``), free its slot and report it."""
        seq.finish_reason = reason or seq.finish_reason or "cancelled"
        self._active.remove(seq)
        self._release(seq)
        seq.committed = seq.committed[:0]  # its device buffer goes; seq.tokens stays
        return BatchEvent(seq.seq_id, tokens, True, seq.finish_reason)

    def _release(self, seq: BatchSequence) -> None:
        """Empty ``seq``'s slot in both models and make it free again."""
        self.target.truncate(seq.slot, 0)
        if self.draft is not None:
            self.draft.truncate(seq.slot, 0)
        self._free.append(seq.slot)
        self._free.sort()

    def _check_contract(self, seq: BatchSequence, where: str) -> None:
        if not self.check_kv:
            return
        held = self.target.kv_length(seq.slot)
        if held != seq.n - 1:
            raise RuntimeError(
                f"KV contract broken {where}: the target's slot {seq.slot} holds {held} "
                f"positions, expected {seq.n - 1} (committed {seq.n} minus the uncached last "
                "token). Its truncate() must drop every position >= the given length."
            )
        if self.draft is not None and self.draft.kv_length(seq.slot) > seq.n - 1:
            raise RuntimeError(
                f"KV contract broken {where}: the draft's slot {seq.slot} holds "
                f"{self.draft.kv_length(seq.slot)} positions, more than the {seq.n - 1} "
                "committed-and-cached ones; its scratch or a rejected suffix survived truncate()."
            )


def _row_ends(batch: Sequence[SlotRows]) -> list[int]:
    """The index of each entry's last row among the forward's rows."""
    ends, total = [], 0
    for rows in batch:
        total += rows.input_ids.shape[0]
        ends.append(total - 1)
    return ends


def _on_device(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, sent as one copy nothing waits for."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)

"""The speculative decoding controller: draft, verify, accept, commit, roll back."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

import torch

from specter_spec.acceptance import AcceptanceResult, greedy_accept, rejection_sample
from specter_spec.depth.policy import (
    DepthPolicy,
    check_depth,
    controller_depth,
    is_plain,
)
from specter_spec.phase_clock import PhaseClock
from specter_spec.queued_steps import PIPELINE_DEPTH, PlainQueue, QueuedPlainStep, TokenReadback
from specter_spec.recorded_acceptance import AcceptanceOverride, check_acceptance_override
from specter_spec.sampling import SamplingConfig, check_finite_logits, sampling_probs
from specter_spec.spec_model import (
    SpecModel,
    check_spec_model,
    model_argmax,
    model_device,
    prefill,
)
from specter_spec.speculation_observer import check_observer
from specter_spec.statistics import GenerationResult, IterationStats
from specter_spec.token_stream import TokenStream, prompt_tensor

__all__ = ["SpecController", "TokenStream"]


class SpecController:
    """Draft-then-verify decoding for a draft and a target following :class:`SpecModel`.

    One iteration (terms as in :mod:`specter_spec.acceptance`), with ``n``
    committed tokens, the target holding KV for ``n - 1`` of them:

    1. **Draft**: the depth policy picks K; the draft is fed the committed
       tokens it has not cached yet, then its own proposals, K forwards in all,
       producing ``d[1..K]`` (argmax when greedy, else drawn from ``q``).
    2. **Verify**: one target forward over ``[t[n-1], d[1..K]]`` (K + 1 rows)
       gives ``p[0..K]``.
    3. **Accept**: greedy or exact sampled acceptance gives ``a`` accepted
       proposals and a correction or bonus token; the result is read back to
       the host once (the only host synchronisation of the iteration besides
       phase timing, see :class:`PhaseClock`).
    4. **Commit**: ``a + 1`` tokens are committed (cut at a stop token or the
       token budget); the target is truncated to ``n' - 1`` and the draft to at
       most ``n' - 1``, so nothing of a rejected suffix survives; both lengths
       are checked.

    ``cache`` (anything implementing :class:`SpeculationObserver`, e.g.
    specter-cache's) is told about each phase. specter-spec never imports it.

    Args:
        draft: the proposing model; may be None only with ``depth=0``.
        target: the model whose output is reproduced exactly.
        cache: a speculation observer, or None.
        depth: K >= 0 (0 = plain target decoding), or a depth policy such as
            :class:`AdaptiveDepth` (anything with ``choose_depth()`` and
            ``observe(IterationStats)``).
        sampling: greedy or sampled decoding; defaults to greedy.
        clock: returns seconds; defaults to a :class:`PhaseClock` on the
            target's device, which synchronises CUDA at each phase boundary
            (iteration start, draft end, verify end, commit end). Pass
            ``time.perf_counter`` to skip those synchronisations (the phase
            times then measure kernel launches, and an adaptive depth learns
            from those); tests inject a virtual clock.
        check_kv: verify the KV contract after every iteration (three integer
            reads per iteration; a violation raises ``RuntimeError``).
        pipeline_plain: queue plain (K = 0) steps one ahead of reading their tokens
            back (see :mod:`specter_spec.queued_steps`): the device then never idles
            between plain steps while the host streams, counts and picks the next
            depth. None (the default) turns it on when the target's device is CUDA.
            It applies while the observer allows it (``cache`` is None, or its
            ``plain_steps_may_overlap()`` returns True when decoding starts): an
            observer whose plain iterations must not overlap (an expert cache that
            still loads experts) keeps every iteration in order. Queued steps give
            the same tokens; at a stop token the one step queued past it is dropped
            (its KV is truncated). A plain step's ``total_time_s`` runs from the
            previous step's token read (or its own queueing, if later) to its own,
            so iteration times still sum to the decode's wall time.
        acceptance: an :class:`AcceptanceOverride` that decides each iteration's accepted
            count and committed tokens in place of the acceptance rule (a routing replay's
            recorded outcomes, :class:`RecordedAcceptance`); the rule still runs, so each
            iteration does the same work. None (the default): the rule decides.

    Raises:
        TypeError: a model or the observer does not follow its protocol, or
            ``depth`` is neither an int nor a policy.
        ValueError: ``depth`` is negative, or ``draft`` is None with speculation.

    Example:
        >>> controller = SpecController(HFCausalLM(draft_lm), HFCausalLM(target_lm), depth=4)
        >>> result = controller.generate([1, 2, 3], max_new_tokens=16)  # doctest: +SKIP
        >>> result.tokens, result.stats.acceptance_rate  # doctest: +SKIP
    """

    def __init__(
        self,
        draft: SpecModel | None,
        target: SpecModel,
        cache: object | None = None,
        depth: int | DepthPolicy = 4,
        sampling: SamplingConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        check_kv: bool = True,
        pipeline_plain: bool | None = None,
        acceptance: AcceptanceOverride | None = None,
    ) -> None:
        check_spec_model(target, "target")
        if acceptance is not None:
            check_acceptance_override(acceptance)
        if pipeline_plain is not None and not isinstance(pipeline_plain, bool):
            raise TypeError(f"pipeline_plain must be True, False or None, got {pipeline_plain!r}")
        self.depth_policy = controller_depth(draft, depth, "plain target decoding")
        if draft is not None:
            check_spec_model(draft, "draft")
            if draft is target:
                raise ValueError(
                    "draft and target are the same object; they need separate KV caches. "
                    "Wrap the model twice (HFCausalLM(model), HFCausalLM(model))."
                )
        if cache is not None:
            check_observer(cache)
        if sampling is None:
            sampling = SamplingConfig.greedy()
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(
                f"sampling must be a SamplingConfig, got {type(sampling).__name__}; "
                "use SamplingConfig.greedy() or SamplingConfig(temperature=...)."
            )
        self.draft = draft
        self.target = target
        self._draft_argmax = model_argmax(draft)
        self._target_argmax = model_argmax(target)
        self.cache = cache
        self.sampling = sampling
        self.clock = clock
        self.check_kv = check_kv
        self.pipeline_plain = pipeline_plain
        self.acceptance = acceptance

    # -- public API ------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        stop_token_ids: Iterable[int] = (),
        *,
        generator: torch.Generator | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Every call starts from empty KV caches (both models are truncated to 0).

        Args:
            prompt_ids: ``[P]`` or ``[1, P]`` token ids (list or LongTensor), P >= 1.
            max_new_tokens: the most tokens to generate (>= 0).
            stop_token_ids: generation ends right after the first of these is
                committed, even inside an accepted prefix; it is included in
                the output.
            generator: random source for sampled decoding; overrides
                ``sampling.seed``.

        Returns:
            The generated tokens, why generation stopped and its statistics.

        Raises:
            ValueError, TypeError: on a bad prompt, budget or stop token list.
            RuntimeError: if a model breaks the KV contract.
        """
        stream = self.stream(prompt_ids, max_new_tokens, stop_token_ids, generator=generator)
        return stream.result()

    def stream(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        stop_token_ids: Iterable[int] = (),
        *,
        generator: torch.Generator | None = None,
    ) -> TokenStream:
        """Like :meth:`generate`, but yields each token as soon as it is committed.

        Iterating the returned :class:`TokenStream` runs the decoding; its
        ``stats`` grow as it goes, and ``result()`` finishes it.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}.")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}.")
        stop = frozenset(stop_token_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
            raise TypeError(f"stop_token_ids must be int token ids, got {sorted(stop, key=str)}.")
        prompt = prompt_tensor(prompt_ids, model_device(self.target))
        return TokenStream(self, prompt, max_new_tokens, stop, generator)

    # -- one generation --------------------------------------------------------------

    def _decode(
        self,
        stream: TokenStream,
        prompt: torch.Tensor,
        max_new_tokens: int,
        stop: frozenset[int],
        generator: torch.Generator | None,
    ) -> Iterator[int]:
        draft, target, observer = self.draft, self.target, self.cache
        device = prompt.device
        draft_device = (model_device(draft) or device) if draft is not None else device
        clock = self.clock or PhaseClock(device)
        if generator is None:
            generator = self.sampling.make_generator(device)
        prompt_len = prompt.numel()
        # Committed tokens live in one preallocated device buffer: commits are
        # device-side copies, and drafts read their uncached suffix from it.
        committed = torch.empty(prompt_len + max_new_tokens, dtype=torch.long, device=device)
        committed[:prompt_len] = prompt
        stream.tokens.extend(prompt.tolist())  # once per generation, not per token
        if max_new_tokens == 0:
            stream.stop_reason = "max_new_tokens"
            return

        start = clock()
        target.truncate(0)
        if draft is not None:
            draft.truncate(0)
        if prompt_len > 1:
            prefill(target, committed[: prompt_len - 1].unsqueeze(0), 0)
            # Prefilling the draft here keeps the prompt out of the first
            # iteration's draft time (which the adaptive depth learns from).
            speculates = not is_plain(self.depth_policy)
            if draft is not None and speculates and draft.kv_length < prompt_len - 1:
                cached = draft.kv_length
                uncached = committed[cached : prompt_len - 1].unsqueeze(0).to(draft_device)
                prefill(draft, uncached, cached)
        n = prompt_len
        self._check_contract(n, where="after prefill")
        stream.stats.prefill_time_s = clock() - start

        generated = 0
        pipelined = self._pipelines_plain_steps(device)
        plain = PlainQueue(
            readback=TokenReadback(device) if pipelined else None,
            host_clock=time.perf_counter if isinstance(clock, PhaseClock) else clock,
            stop=stop,
        )
        queue = plain.steps
        while True:
            # Tokens not queued yet: every queued step commits exactly one (or the
            # generation stops at its stop token and drops what follows it).
            remaining = max_new_tokens - generated - len(queue)
            if remaining == 0:  # the last tokens are all queued: read them back
                yield from self._retire_plain(stream, plain, keep=0)
                stream.stop_reason = stream.stop_reason or "max_new_tokens"
                return
            # A queued step is still running: the host clock must not wait for it.
            iteration_start = plain.host_clock() if queue else clock()
            depth = check_depth(self.depth_policy.choose_depth(), "the depth policy's choice")
            # More proposals than the budget can commit would be wasted work.
            depth = min(depth, remaining - 1)
            if pipelined and depth == 0:
                queue.append(self._queue_plain(committed, n, generator, plain, iteration_start))
                n += 1
                generated += yield from self._retire_plain(stream, plain, keep=PIPELINE_DEPTH - 1)
                if stream.stop_reason is not None:
                    return
                continue
            if queue:
                # A speculative iteration reads the committed tokens on the host side
                # (stop tokens, KV lengths): every queued step is read back first.
                generated += yield from self._retire_plain(stream, plain, keep=0)
                if stream.stop_reason is not None:
                    return
                iteration_start = clock()
            plain.last_read = None
            remaining = max_new_tokens - generated

            if observer is not None:
                observer.on_draft_start(depth)
            proposals, draft_probs = self._draft(n, depth, committed, generator, draft_device)
            draft_end = clock()

            if observer is not None:
                observer.on_verify_start(depth + 1)
            if self.check_kv and target.kv_length != n - 1:
                raise RuntimeError(
                    f"KV contract broken before verify: the target holds {target.kv_length} "
                    f"positions, expected {n - 1} (committed {n} minus the uncached last token). "
                    "A shared-KV draft must keep its scratch invisible to the target."
                )
            verify_ids = torch.cat([committed[n - 1 : n], proposals]).unsqueeze(0)
            target_logits = self._verify(verify_ids, n - 1)
            self._check_logits(target_logits, depth + 1, "target")
            if not stream.stats.iterations:  # once a generation: one host read
                check_finite_logits(target_logits, "target")
            verified = self._verified_proposals(depth)
            if verified < depth:  # the target verified the leading rows only
                proposals = proposals[:verified]
                target_logits = target_logits[:, : verified + 1]
            outcome = self._accept(proposals, draft_probs, target_logits[0], generator)
            if self.acceptance is not None:  # recorded outcomes (a routing replay)
                proposals, outcome = self.acceptance.decide(n, proposals)
            # The one host synchronisation of the iteration: the accepted count,
            # the correction/bonus token and the proposals, in a single copy.
            host = torch.cat(
                [outcome.num_accepted.view(1), outcome.next_token.view(1), proposals]
            ).tolist()
            verify_end = clock()
            num_accepted, next_token = host[0], host[1]
            if observer is not None:
                observer.on_verify_end(num_accepted)

            new_tokens = [*host[2 : 2 + num_accepted], next_token][:remaining]
            stop_at = next((i for i, t in enumerate(new_tokens) if t in stop), None)
            if stop_at is not None:
                new_tokens = new_tokens[: stop_at + 1]
            count = len(new_tokens)
            appended = torch.cat([proposals[:num_accepted], outcome.next_token.view(1)])
            committed[n : n + count] = appended[:count]
            n += count
            generated += count
            target.truncate(n - 1)
            if draft is not None:
                draft.truncate(n - 1)
            self._check_contract(n, where="after commit")
            iteration_end = clock()

            record = IterationStats(
                depth=depth,
                accepted=num_accepted,
                bonus=num_accepted == verified,
                committed=count,
                draft_time_s=draft_end - iteration_start,
                verify_time_s=verify_end - draft_end,
                total_time_s=iteration_end - iteration_start,
                verified=verified,
                first=not stream.stats.iterations,
            )
            stream.stats.iterations.append(record)
            self.depth_policy.observe(record)
            stream.tokens.extend(new_tokens)
            if stop_at is not None:
                stream.stop_reason = "stop_token"
            elif generated >= max_new_tokens:
                stream.stop_reason = "max_new_tokens"
            yield from new_tokens
            if stream.stop_reason is not None:
                return

    def _pipelines_plain_steps(self, device: torch.device) -> bool:
        """Whether this generation queues plain steps ahead (see ``pipeline_plain``)."""
        if self.pipeline_plain is False or (self.pipeline_plain is None and device.type != "cuda"):
            return False
        observer = self.cache
        if observer is None:
            return True
        may_overlap = getattr(observer, "plain_steps_may_overlap", None)
        return callable(may_overlap) and bool(may_overlap())

    def _queue_plain(
        self,
        committed: torch.Tensor,
        n: int,
        generator: torch.Generator | None,
        plain: PlainQueue,
        queued_at: float,
    ) -> QueuedPlainStep:
        """Queue one plain step: the target's forward over ``committed[n - 1]`` and the
        acceptance of its bonus token, written to ``committed[n]`` on the device and copied
        to a host slot; nothing waits for the device."""
        observer, target = self.cache, self.target
        if observer is not None:
            observer.on_draft_start(0)
            observer.on_verify_start(1)
        if self.check_kv and target.kv_length != n - 1:
            raise RuntimeError(
                f"KV contract broken before a queued plain step: the target holds "
                f"{target.kv_length} positions, expected {n - 1}."
            )
        logits = target.forward(committed[n - 1 : n].unsqueeze(0), n - 1)
        self._check_logits(logits, 1, "target")
        no_proposals = committed[:0]
        outcome = self._accept(no_proposals, None, logits[0], generator)
        if self.acceptance is not None:
            _, outcome = self.acceptance.decide(n, no_proposals)
        committed[n : n + 1] = outcome.next_token.view(1)
        self._check_contract(n + 1, where="after a queued plain step")
        slot, ready = plain.readback.push(outcome.next_token)
        return QueuedPlainStep(position=n, slot=slot, ready=ready, queued_at=queued_at)

    def _retire_plain(
        self,
        stream: TokenStream,
        plain: PlainQueue,
        *,
        keep: int,
    ) -> Generator[int, None, int]:
        """Read queued steps' tokens back, oldest first, until ``keep`` are left: record and
        yield each; at a stop token, drop the steps queued after it and roll both models
        back. Returns the tokens committed."""
        committed = 0
        while len(plain.steps) > keep and stream.stop_reason is None:
            committed += 1
            yield self._retire_one(stream, plain)
        return committed

    def _retire_one(self, stream: TokenStream, plain: PlainQueue) -> int:
        """Read the oldest queued step's token back and record it (see ``_retire_plain``)."""
        queue = plain.steps
        step = queue.popleft()
        token = plain.readback.read(step)
        read_at = plain.host_clock()
        # Queued before the previous step's token was read: the host's work for it ran
        # while the device computed that step (the run's steady state).
        pipelined = plain.last_read is not None and step.queued_at <= plain.last_read
        started = max(step.queued_at, plain.last_read) if pipelined else step.queued_at
        plain.last_read = read_at
        if self.cache is not None:
            self.cache.on_verify_end(0)
        record = IterationStats.plain_step(
            read_at - started, pipelined=pipelined, first=not stream.stats.iterations
        )
        stream.stats.iterations.append(record)
        self.depth_policy.observe(record)
        stream.tokens.append(token)
        if token in plain.stop:
            stream.stop_reason = "stop_token"
            while queue:  # queued past the stop token: its KV goes, its window closes
                queue.popleft()
                if self.cache is not None:
                    self.cache.on_verify_end(0)
            length = step.position  # committed tokens up to the stop token, minus one
            self.target.truncate(length)
            if self.draft is not None:
                self.draft.truncate(length)
            self._check_contract(length + 1, where="after a stop token in queued plain steps")
        return token

    def _verify(self, verify_ids: torch.Tensor, start: int) -> torch.Tensor:
        """The target's forward over the verified rows. A greedy controller lets a target
        that offers it (``allow_row_truncation``, e.g. specter-models' miss-aware row
        truncation) verify only leading rows: greedy tokens cannot change, while sampling
        must see every proposal tested (the cut depends on the proposals), so it never
        allows it; nor is it allowed outside verification (a prefill is all committed)."""
        target = self.target
        truncatable = self.sampling.is_greedy and hasattr(target, "allow_row_truncation")
        if not truncatable:
            return target.forward(verify_ids, start)
        target.allow_row_truncation = True
        try:
            return target.forward(verify_ids, start)
        finally:
            target.allow_row_truncation = False

    def _verified_proposals(self, depth: int) -> int:
        """Proposals whose target logits are exact: ``depth`` unless the target says it
        verified only ``verified_rows`` leading rows."""
        rows = getattr(self.target, "verified_rows", None)
        if rows is None or rows > depth:
            return depth
        if not isinstance(rows, int) or rows < 1:
            raise RuntimeError(
                f"the target reported verified_rows={rows!r}; expected None or an int in "
                f"[1, {depth + 1}] (row 0 is always verified)"
            )
        if not self.sampling.is_greedy:
            raise RuntimeError(
                f"the target verified {rows} of {depth + 1} rows while sampling: row "
                "truncation is exact for greedy decoding only"
            )
        return rows - 1

    def _draft(
        self,
        n: int,
        depth: int,
        committed: torch.Tensor,
        generator: torch.Generator | None,
        draft_device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K draft forwards; returns proposals ``[K]`` and, when sampling, ``q`` ``[K, V]``."""
        device = committed.device
        if depth == 0:
            return torch.empty(0, dtype=torch.long, device=device), None
        draft, observer = self.draft, self.cache
        position = draft.kv_length
        if not 0 <= position <= n - 1:
            raise RuntimeError(
                f"KV contract broken: the draft holds {position} positions but only {n} tokens "
                f"are committed; it must hold at most {n - 1} before drafting."
            )
        feed = committed[position:n].unsqueeze(0).to(draft_device)
        proposals: list[torch.Tensor] = []
        q_rows: list[torch.Tensor] = []
        for index in range(depth):
            logits = draft.forward(feed, position)
            self._check_logits(logits, feed.shape[1], "draft")
            last = logits[0, -1].to(device)
            if self.sampling.is_greedy:
                token = self._draft_argmax(last)
            else:
                q = sampling_probs(last, self.sampling)
                token = torch.multinomial(q, 1, generator=generator)[0]
                q_rows.append(q)
            proposals.append(token)
            if observer is not None:
                observer.on_draft_token(index)
            position += feed.shape[1]
            feed = token.view(1, 1).to(draft_device)
        if self.check_kv and draft.kv_length != position:
            raise RuntimeError(
                f"the draft holds {draft.kv_length} positions after drafting, expected {position}: "
                "forward must append exactly the KV of the tokens it is given."
            )
        draft_probs = torch.stack(q_rows) if q_rows else None
        return torch.stack(proposals), draft_probs

    def _accept(
        self,
        proposals: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        generator: torch.Generator | None,
    ) -> AcceptanceResult:
        if self.sampling.is_greedy:
            return greedy_accept(proposals, target_logits, self._target_argmax)
        target_probs = sampling_probs(target_logits, self.sampling)
        if draft_probs is None:  # K = 0: the bonus token is drawn from p[0]
            draft_probs = target_probs.new_zeros(0, target_probs.shape[-1])
        try:
            return rejection_sample(
                proposals, draft_probs.to(target_probs.dtype), target_probs, generator
            )
        except RuntimeError:  # torch.multinomial refuses NaN and infinite probabilities
            check_finite_logits(target_logits, "target")
            raise

    @staticmethod
    def _check_logits(logits: torch.Tensor, rows: int, role: str) -> None:
        if logits.dim() != 3 or logits.shape[0] != 1 or logits.shape[1] != rows:
            raise RuntimeError(
                f"the {role} model returned logits of shape {tuple(logits.shape)}; "
                f"expected [1, {rows}, V] for {rows} input tokens."
            )

    def _check_contract(self, n: int, where: str) -> None:
        if not self.check_kv:
            return
        if self.target.kv_length != n - 1:
            raise RuntimeError(
                f"KV contract broken {where}: the target holds {self.target.kv_length} positions, "
                f"expected {n - 1} (committed {n} minus the uncached last token). Its truncate() "
                "must drop every position >= the given length."
            )
        if self.draft is not None and self.draft.kv_length > n - 1:
            raise RuntimeError(
                f"KV contract broken {where}: the draft holds {self.draft.kv_length} positions, "
                f"more than the {n - 1} committed-and-cached ones; its scratch or a rejected "
                "suffix survived truncate()."
            )

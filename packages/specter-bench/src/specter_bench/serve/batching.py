"""Continuous batching: the worker loop of a server started with ``max_batch`` N > 1.

The engine's ``batch_session()`` holds the running batch. Between two steps (a step
boundary) the worker

1. admits queued requests into the session (``session.add``: each is prefilled and joins
   at the next step) while fewer than N run;
2. cancels the sequences whose request was cancelled (the client disconnected, a stop
   string matched, the request's time ran out): each ends at once with what it committed
   and leaves the batch at the boundary;
3. runs one step for every running sequence (``session.step()``) and hands each
   sequence's new tokens to its request; sequences that finished (a stop token, their
   ``max_tokens``) end and leave.

It waits for a request only while nothing runs. A request's figures (time to first token,
time per output token, the engine's statistics for its sequence) go to the metrics as in
one-at-a-time serving, and the ``specter_batch_size`` gauge says how many sequences the
running batch holds. A step that fails ends every running request with the error and
starts a new session.

The engine reports a cancelled sequence as finished at the step after ``cancel``; the
request has ended by then, so that chunk is dropped, and the sequence holds its place in
the batch until that step.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from specter_bench.serve.scheduler import Job, Scheduler
from specter_spec import BatchFullError

__all__ = ["BatchedGeneration", "serve_batched"]

log = logging.getLogger("specter.serve")


@dataclass
class BatchedGeneration:
    """One request's sequence in the running batch, as the request's handlers see it (the
    surface of :class:`~specter_bench.serve.engine.GenerationHandle`).

    Attributes:
        seq_id: the session's id of the sequence.
        token_ids: its generated token ids so far.
        text: their text so far.
        stop_reason: None while it runs, then the engine's finish reason (``"stop_token"``,
            ``"max_new_tokens"``, ...) or ``"cancelled"``.
        stats: the engine's statistics of the sequence once it ended.
    """

    seq_id: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):
        raise TypeError("a batched generation is driven by the server's worker, not iterated")

    def cancel(self) -> None:
        """Nothing here: the worker reads the job's cancellation at the next boundary."""


@dataclass
class _Running:
    """A request whose sequence is in the batch."""

    job: Job
    generation: BatchedGeneration
    deadline: float | None
    first: float | None = None
    last: float = 0.0


class _BatchLoop:
    def __init__(self, scheduler: Scheduler, engine: Any) -> None:
        self.scheduler = scheduler
        self.engine = engine
        self.session = engine.batch_session()
        self.running: dict[int, _Running] = {}
        self.pending: deque[Job] = deque()  # taken from the queue, not yet admitted
        self.stopping = False

    # ------------------------------------------------------------------ boundaries
    def room(self) -> bool:
        limit = self.scheduler.max_batch
        return len(self.running) < limit and int(self.session.active) < limit

    def admit(self) -> None:
        """Queued requests into the session while there is room; waits for one only while
        nothing runs (or leaves)."""
        while self.room() and not self.stopping:
            if self.pending:
                job = self.pending.popleft()
            else:
                idle = not self.running and int(self.session.active) == 0
                try:
                    job = self.scheduler.take(block=idle)
                except queue.Empty:
                    return
                if job is None:
                    self.stopping = True
                    return
                self.scheduler.dequeued()
            self.start(job)

    def start(self, job: Job) -> None:
        refused = self.scheduler.admission_error(job)
        if refused is not None:
            self.scheduler.released()
            job.post(*refused)
            return
        try:
            seq_id = self.session.add(
                job.prompt_ids,
                max_new_tokens=job.max_new_tokens,
                sampling=job.sampling,
                stop_token_ids=list(job.stop_token_ids),
            )
        except BatchFullError:  # a cancelled sequence still leaving: try again next step
            self.pending.appendleft(job)
            return
        except Exception as exc:
            log.exception("the engine refused a request")
            self.scheduler.released()
            job.post("error", exc)
            return
        generation = BatchedGeneration(int(seq_id))
        job._generation = generation
        assert job.started is not None
        deadline = None if job.timeout_s is None else job.started + job.timeout_s
        self.running[generation.seq_id] = _Running(job, generation, deadline, last=job.started)
        job.post("start", None)

    def cancel_stopped(self) -> None:
        """End the requests cancelled since the last boundary; their sequences leave."""
        for seq_id, item in list(self.running.items()):
            if item.job.cancelled:
                self.session.cancel(seq_id)
                item.generation.stop_reason = "cancelled"
                self.end(seq_id)

    def end(self, seq_id: int) -> None:
        item = self.running.pop(seq_id)
        generation = item.generation
        try:
            generation.stats = dict(self.session.stats(seq_id) or {})
        except Exception:  # the engine keeps no statistics of a sequence it dropped
            generation.stats = {}
        generation.stats.setdefault("new_tokens", len(generation.token_ids))
        self.scheduler.observe(
            item.job, item.first, item.last, len(generation.token_ids), generation.stats
        )
        self.scheduler.released()
        item.job.post("end", generation)

    # ------------------------------------------------------------------------ steps
    def step(self) -> None:
        """One step of the batch: each sequence's chunk to its request; finished ones end."""
        try:
            chunks = self.session.step()
        except Exception as exc:
            log.exception("the engine failed on a step of the batch")
            self.fail_all(exc)
            return
        now = time.perf_counter()
        for chunk in chunks:
            item = self.running.get(int(chunk.index))
            if item is None:
                continue  # a sequence cancelled at this boundary
            generation = item.generation
            if chunk.token_ids:
                generation.token_ids.extend(chunk.token_ids)
                item.first = item.first if item.first is not None else now
                item.last = now
            generation.text += chunk.text
            item.job.post("chunk", chunk)
            if chunk.finished:
                generation.stop_reason = chunk.finish_reason or "max_new_tokens"
                self.end(generation.seq_id)
            elif item.deadline is not None and now > item.deadline and not item.job.cancelled:
                item.job.timed_out = True
                item.job.cancel("timeout")
        self.scheduler.metrics.batch_size.set(len(self.running))

    def fail_all(self, exc: Exception) -> None:
        """End every running request with ``exc``; their sequences leave (a step of only
        cancelled sequences computes nothing) and a new session starts on a reset model."""
        for seq_id, item in list(self.running.items()):
            self.running.pop(seq_id)
            with contextlib.suppress(KeyError):
                self.session.cancel(seq_id)
            self.scheduler.observe(item.job, item.first, item.last,
                                   len(item.generation.token_ids), {})  # fmt: skip
            self.scheduler.released()
            item.job.post("error", exc)
        try:
            self.session.step()
            self.session = self.engine.batch_session()
        except Exception:  # the old session cannot drain: keep serving on it
            log.exception("the engine's batch did not drain after a failed step")

    def run(self) -> None:
        metrics = self.scheduler.metrics
        while True:
            self.admit()
            self.cancel_stopped()
            metrics.batch_size.set(len(self.running))
            if self.running or int(self.session.active) > 0:
                self.step()
            elif self.stopping:
                return


def serve_batched(scheduler: Scheduler, engine: Any) -> None:
    """Serve ``scheduler``'s queue with continuous batching on ``engine`` (the worker
    thread's loop; returns once the scheduler is stopped and the batch has drained)."""
    _BatchLoop(scheduler, engine).run()

"""The FIFO queue in front of the engine, and the one worker thread that drives it.

Requests wait in arrival order and a single worker thread runs them: one at a time
(``max_batch`` 1), or with continuous batching (``max_batch`` N > 1,
:mod:`~specter_bench.serve.batching`), where waiting requests join the engine's running
batch at step boundaries, up to N, and finished ones leave. The same thread loads the
engine first (so CUDA graphs are captured and replayed on one thread), and the server
answers ``/health`` as ready once it has. The queue is bounded: a request that finds it
full is refused at once (429 with ``Retry-After``) instead of waiting without limit.

Events of a job (its first token, its chunks, its end or its error) are handed to the
request's asyncio queue on the event loop's thread; a job's ``cancel`` (a disconnect, a
stop string, a timeout) reaches the engine's generation, which stops at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specter_bench.serve.engine import GenerationHandle, ServingEngine
from specter_bench.serve.metrics import ServerMetrics
from specter_spec import SamplingConfig

__all__ = ["Job", "JobEvent", "QueueFullError", "Scheduler"]

log = logging.getLogger("specter.serve")


class QueueFullError(Exception):
    """The queue holds its maximum; ``retry_after_s`` is an estimate of when it frees."""

    def __init__(self, waiting: int, retry_after_s: int) -> None:
        super().__init__(f"{waiting} requests are waiting")
        self.waiting = waiting
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class JobEvent:
    """What the worker reports: ``kind`` is ``start`` (the engine took the job),
    ``chunk`` (``value`` a GenerationChunk), ``end`` (``value`` the finished
    GenerationHandle, or None for a job cancelled before it started) or ``error``
    (``value`` the exception); ``at`` is ``time.perf_counter()`` when it happened."""

    kind: str
    value: Any
    at: float


@dataclass
class Job:
    """One request's generation.

    Attributes:
        prompt_ids: the prompt's token ids.
        max_new_tokens: the most tokens to generate.
        sampling: how tokens are chosen.
        stop_token_ids: tokens that end the generation (the tokenizer's EOS).
        depth: a per-request speculation depth (None: the engine's own).
        timeout_s: the most seconds the generation may run (None: no limit); past it the
            generation stops at its next step and ``timed_out`` is set.
        arrived: ``time.perf_counter()`` when the request arrived.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    stop_token_ids: Sequence[int]
    depth: int | None = None
    timeout_s: float | None = None
    arrived: float = field(default_factory=time.perf_counter)
    cancel_reason: str | None = None
    timed_out: bool = False
    started: float | None = None
    polled: float = 0.0
    events: asyncio.Queue[JobEvent] = field(default_factory=asyncio.Queue)
    _loop: asyncio.AbstractEventLoop | None = None
    _generation: GenerationHandle | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self, reason: str) -> None:
        """Stop the generation at its next step (or skip it if it has not started)."""
        if self._cancelled.is_set():
            return
        self.cancel_reason = reason
        self._cancelled.set()
        generation = self._generation
        if generation is not None:
            generation.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def post(self, kind: str, value: Any) -> None:
        """Hand an event to the request's coroutine (from the worker thread)."""
        event = JobEvent(kind, value, time.perf_counter())
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the event loop has closed (shutting down)
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)


class Scheduler:
    """A bounded FIFO of jobs and the worker thread that loads the engine and runs them.

    Args:
        load: builds the engine (runs on the worker thread).
        metrics: where queue depth and finished generations are recorded.
        max_queue: jobs that may wait while the engine's batch is full; one more is
            refused (0: none wait).
        queue_timeout_s: the most seconds a job may wait before it is refused (None: none).
        max_batch: the most generations the engine runs at once (1: one at a time; more:
            continuous batching through the engine's ``batch_session``).
    """

    def __init__(
        self,
        load: Callable[[], ServingEngine],
        metrics: ServerMetrics,
        *,
        max_queue: int = 32,
        queue_timeout_s: float | None = None,
        max_batch: int = 1,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._load = load
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.queue_timeout_s = queue_timeout_s
        self.engine: ServingEngine | None = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        self.finished_loading = threading.Event()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._recent_s: deque[float] = deque(maxlen=16)
        self._thread = threading.Thread(target=self._work, name="specter-engine", daemon=True)

    # -------------------------------------------------------------------- event loop side

    def start(self) -> None:
        """Start the worker thread (it loads the engine, then serves the queue)."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to finish after the running job and wait for it a while."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def busy(self) -> bool:
        return self._running > 0 or self._waiting > 0

    def submit(self, job: Job) -> None:
        """Queue ``job`` (call on the event loop's thread).

        Raises:
            QueueFullError: ``max_queue`` jobs wait already while ``max_batch`` run.
        """
        job._loop = asyncio.get_running_loop()
        with self._lock:
            if self._running + self._waiting >= self.max_batch + self.max_queue:
                raise QueueFullError(self._waiting, self._retry_after(self._waiting))
            self._waiting += 1
            self.metrics.queue_depth.set(self._waiting)
        self._queue.put(job)

    def _retry_after(self, waiting: int) -> int:
        """Seconds until a place frees, from the recent jobs' mean duration and the
        generations that run at once (at least 1)."""
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        return max(1, math.ceil(mean * max(1, waiting) / self.max_batch))

    # ------------------------------------------------------------------------ worker side

    def _work(self) -> None:
        try:
            self.engine = self._load()
        except BaseException as exc:
            self.load_error = exc
            log.error("loading the model failed: %s", exc)
            self.finished_loading.set()
            return
        if self.max_batch > 1 and not callable(getattr(self.engine, "batch_session", None)):
            self.load_error = ValueError(
                f"max_batch={self.max_batch}: this engine has no batch_session, so it decodes "
                "one request at a time; serve it with --max-batch 1"
            )
            log.error("%s", self.load_error)
            self.finished_loading.set()
            return
        self.ready.set()
        self.finished_loading.set()
        if self.max_batch > 1:
            from specter_bench.serve.batching import serve_batched

            serve_batched(self, self.engine)
            return
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.dequeued()
            final: tuple[str, Any] = ("error", RuntimeError("the engine's worker failed"))
            try:
                final = self._run(job)
            finally:
                # The engine is free before the client hears of the end, so a client that
                # sends its next request at once finds the place its last one left.
                self.released()
                job.post(*final)

    def dequeued(self) -> None:
        """A job left the queue for the engine (worker side)."""
        with self._lock:
            self._waiting -= 1
            self._running += 1
            self.metrics.queue_depth.set(self._waiting)
            self.metrics.running.set(self._running)

    def released(self) -> None:
        """A job's generation ended: its place in the engine is free (worker side)."""
        with self._lock:
            self._running -= 1
            self.metrics.running.set(self._running)

    def take(self, block: bool) -> Job | None:
        """The next queued job (waiting for one when ``block``).

        Raises:
            queue.Empty: none is queued and ``block`` is False.
        """
        return self._queue.get(block=block)

    def admission_error(self, job: Job) -> tuple[str, Any] | None:
        """The final event of a job that must not start (cancelled while queued, or past the
        queue timeout), else None; sets ``job.started``."""
        job.started = time.perf_counter()
        waited = job.started - job.arrived
        if job.cancelled:
            return ("end", None)
        if self.queue_timeout_s is not None and waited > self.queue_timeout_s:
            return ("error", TimeoutError(f"waited {waited:.1f} s for the engine"))
        return None

    def observe(
        self, job: Job, first: float | None, last: float, tokens: int, stats: dict[str, Any]
    ) -> None:
        """Record a finished (or stopped) job's figures in the metrics."""
        assert job.started is not None
        ended = time.perf_counter()
        self._recent_s.append(ended - job.started)
        self.metrics.observe_generation(
            queue_s=job.started - job.arrived,
            ttft_s=None if first is None else first - job.arrived,
            tpot_s=(last - first) / (tokens - 1) if first is not None and tokens > 1 else None,
            duration_s=ended - job.arrived,
            prompt_tokens=len(job.prompt_ids),
            completion_tokens=tokens,
            stats=stats,
        )
        if job.cancel_reason is not None:
            self.metrics.cancelled.labels(job.cancel_reason).inc()

    def _run(self, job: Job) -> tuple[str, Any]:
        """Run one job, posting its start and chunks; returns its final event."""
        refused = self.admission_error(job)
        if refused is not None:
            return refused
        assert self.engine is not None
        assert job.started is not None
        job.post("start", None)
        extra = {} if job.depth is None else {"depth": job.depth}
        first: float | None = None
        last = job.started
        tokens = 0
        generation = None
        try:
            generation = self.engine.generate(
                job.prompt_ids,
                max_new_tokens=job.max_new_tokens,
                sampling=job.sampling,
                stop_token_ids=list(job.stop_token_ids),
                **extra,
            )
            job._generation = generation
            if job.cancelled:
                generation.cancel()
            deadline = None if job.timeout_s is None else job.started + job.timeout_s
            for chunk in generation:
                now = time.perf_counter()
                if chunk.token_ids:
                    tokens += len(chunk.token_ids)
                    first = first if first is not None else now
                    last = now
                job.post("chunk", chunk)
                if deadline is not None and now > deadline and not job.cancelled:
                    job.timed_out = True
                    job.cancel("timeout")
        except Exception as exc:
            log.exception("the engine failed on a request")
            return ("error", exc)
        finally:
            self.observe(job, first, last, tokens, dict(getattr(generation, "stats", None) or {}))
        return ("end", generation)

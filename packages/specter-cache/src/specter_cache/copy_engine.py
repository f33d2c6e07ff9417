"""Host-to-device copy streams and the events that order them against compute.

The expert cache issues every slot write (tensor data and expert-to-slot map entries) through
a ``CopyEngine``:

* ``CudaCopyEngine``: a dedicated CUDA stream; ``non_blocking`` copies from pinned memory;
  readiness events recorded on the copy stream; the compute stream waits on them with
  ``wait_event`` (no host block); last-use events recorded on the compute stream make the copy
  stream wait before a slot is overwritten.
* ``ImmediateCopyEngine``: CPU tensors; copies run synchronously and every event is complete.
* ``DeferredCopyEngine``: CPU tensors, but copies are queued and run only when a test steps the
  queue or someone waits on an event. It lets CPU tests exercise the states a real copy stream
  goes through (loads in flight, readiness order) without a GPU.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import torch


class TransferEvent(ABC):
    """A point in a stream's work: a load's readiness, a kernel's last use of a slot."""

    @abstractmethod
    def query(self) -> bool:
        """Whether the work before the event has completed (never blocks)."""

    @abstractmethod
    def wait(self) -> None:
        """Make the consumer's current compute stream wait for the event.

        CUDA: ``current_stream.wait_event`` (the host does not block). CPU: completes the work.
        """

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until the event has completed."""

    @abstractmethod
    def elapsed_seconds(self, end: TransferEvent) -> float:
        """Seconds from this event to ``end``; both must be timing events and complete."""


class CopyEngine(ABC):
    """Where and in which order slot writes happen (see module docstring)."""

    device: torch.device

    @property
    @abstractmethod
    def is_synchronous(self) -> bool:
        """True when ``copy`` has finished by the time it returns (CPU immediate)."""

    @contextlib.contextmanager
    def copy_context(self) -> Iterator[None]:
        """Scope in which ``copy``/``record`` go to the copy stream."""
        yield

    @abstractmethod
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Enqueue ``dst.copy_(src)`` on the copy stream, after everything enqueued before."""

    @abstractmethod
    def wait_for(self, event: TransferEvent | None) -> None:
        """Make later copies wait for ``event`` (a compute stream's last use of a slot)."""

    def invalidate(
        self,
        dsts: Sequence[torch.Tensor],
        src: torch.Tensor,
        after: Sequence[TransferEvent | None],
    ) -> None:
        """Copy ``src`` into each small map entry of ``dsts`` ahead of the data copies that
        follow it (inside ``copy_context``), once the events ``after`` are done (the entries'
        previous updates, and the last kernels that read them expecting the old values).

        Engines whose copies complete in order of issue (the CPU ones) just copy. The CUDA
        engine copies on a side stream that carries nothing else, so a consumer can wait for
        every invalidation issued so far (``invalidations_done``) without waiting for the
        data copies queued before them."""
        for dst in dsts:
            self.copy(dst, src)

    def invalidations_done(self) -> TransferEvent | None:
        """An event after every ``invalidate`` so far, for a consumer to wait on; None when
        nothing needs waiting for (the CPU engines)."""
        return None

    @abstractmethod
    def record(self, timing: bool = False) -> TransferEvent:
        """An event after the copies enqueued so far (a load's readiness)."""

    def landing_marker(self) -> object | None:
        """A reusable marker of a point in the copy stream (None: copies complete as they
        are issued, so there is never anything to wait for).

        ``mark_landing`` moves it to after the copies enqueued so far; ``wait_landing``
        makes the compute stream wait for its latest position. Unlike a ``TransferEvent``
        (one per point), the marker is one object for good, so a CUDA graph can capture a
        wait on it once and each replay waits for wherever it was last moved to."""
        return None

    def mark_landing(self, marker: object | None) -> None:
        """Move ``marker`` (from :meth:`landing_marker`) to after the copies enqueued so far."""
        return None

    def wait_landing(self, marker: object | None) -> None:
        """Make the consumer's current compute stream wait for ``marker``'s latest position
        (the host does not block on CUDA; inside a graph capture this is a wait node)."""
        return None

    @abstractmethod
    def record_compute(self, timing: bool = False) -> TransferEvent:
        """An event on the consumer's current compute stream (a last use, a time marker)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until every enqueued copy has completed."""


# ------------------------------------------------------------------------------- CPU: now
class HostEvent(TransferEvent):
    """An event that is complete from the start; it carries the host time it was made."""

    __slots__ = ("time",)

    def __init__(self, stamp: float | None = None):
        self.time = time.perf_counter() if stamp is None else stamp

    def query(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def elapsed_seconds(self, end: TransferEvent) -> float:
        if not isinstance(end, HostEvent | DeferredEvent):
            raise TypeError(f"cannot time from a host event to {type(end).__name__}")
        end.synchronize()
        return end.time - self.time  # type: ignore[operator]


class ImmediateCopyEngine(CopyEngine):
    """CPU copies that run at once; every event is already complete."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        if self.device.type != "cpu":
            raise ValueError(f"ImmediateCopyEngine moves CPU tensors; got device {self.device}")

    @property
    def is_synchronous(self) -> bool:
        return True

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def wait_for(self, event: TransferEvent | None) -> None:
        return None

    def record(self, timing: bool = False) -> TransferEvent:
        return HostEvent()

    def record_compute(self, timing: bool = False) -> TransferEvent:
        return HostEvent()

    def synchronize(self) -> None:
        return None


# -------------------------------------------------------------------------- CPU: deferred
class DeferredEvent(TransferEvent):
    """Completes once the deferred engine has run the copies enqueued before it."""

    __slots__ = ("engine", "seq", "time")

    def __init__(self, engine: DeferredCopyEngine, seq: int):
        self.engine = engine
        self.seq = seq
        self.time: float | None = None

    def query(self) -> bool:
        return self.engine.completed >= self.seq

    def wait(self) -> None:
        self.engine.run_until(self.seq)

    def synchronize(self) -> None:
        self.engine.run_until(self.seq)

    def elapsed_seconds(self, end: TransferEvent) -> float:
        self.synchronize()
        end.synchronize()
        if self.time is None or not isinstance(end, HostEvent | DeferredEvent) or end.time is None:
            raise TypeError("deferred events time only against host or deferred events")
        return end.time - self.time


class _DeferredMarker:
    """A deferred engine's landing marker: the number of copies enqueued when last moved."""

    __slots__ = ("seq",)

    def __init__(self) -> None:
        self.seq = 0


class DeferredCopyEngine(CopyEngine):
    """CPU copies queued in order and run only on ``step``, ``wait`` or ``synchronize``.

    For tests: a real copy stream's states (loads in flight, completion order) on the CPU.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        if self.device.type != "cpu":
            raise ValueError(f"DeferredCopyEngine moves CPU tensors; got device {self.device}")
        self._ops: list[tuple[torch.Tensor, torch.Tensor] | DeferredEvent] = []
        self._next = 0  # index of the next op to run
        self.enqueued = 0  # copies enqueued so far
        self.completed = 0  # copies completed so far

    @property
    def is_synchronous(self) -> bool:
        return False

    @property
    def pending(self) -> int:
        """Copies enqueued and not yet run."""
        return self.enqueued - self.completed

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._ops.append((dst, src))
        self.enqueued += 1

    def wait_for(self, event: TransferEvent | None) -> None:
        # CPU compute is synchronous: a last use recorded by the host has already happened.
        return None

    def record(self, timing: bool = False) -> TransferEvent:
        ev = DeferredEvent(self, self.enqueued)
        if self.completed >= ev.seq:
            ev.time = time.perf_counter()
        else:
            self._ops.append(ev)
        return ev

    def record_compute(self, timing: bool = False) -> TransferEvent:
        return HostEvent()

    def landing_marker(self) -> object | None:
        return _DeferredMarker()

    def mark_landing(self, marker: object | None) -> None:
        if isinstance(marker, _DeferredMarker):
            marker.seq = self.enqueued

    def wait_landing(self, marker: object | None) -> None:
        if isinstance(marker, _DeferredMarker):
            self.run_until(marker.seq)

    def step(self, copies: int = 1) -> int:
        """Run up to ``copies`` queued copies in order; returns how many ran."""
        ran = 0
        while self._next < len(self._ops) and ran < copies:
            op = self._ops[self._next]
            self._next += 1
            if isinstance(op, DeferredEvent):
                op.time = time.perf_counter()
                continue
            dst, src = op
            dst.copy_(src)
            self.completed += 1
            ran += 1
        # Stamp events that sit right after the copies just run.
        while self._next < len(self._ops) and isinstance(self._ops[self._next], DeferredEvent):
            ev = self._ops[self._next]
            ev.time = time.perf_counter()  # type: ignore[union-attr]
            self._next += 1
        if self._next == len(self._ops):
            self._ops.clear()
            self._next = 0
        return ran

    def run_until(self, seq: int) -> None:
        """Run queued copies until ``seq`` copies have completed."""
        if seq > self.enqueued:
            raise ValueError(f"no copy number {seq} was enqueued (only {self.enqueued})")
        while self.completed < seq:
            self.step(seq - self.completed)

    def synchronize(self) -> None:
        self.run_until(self.enqueued)


# ------------------------------------------------------------------------------------ CUDA
class CudaEvent(TransferEvent):
    """A ``torch.cuda.Event`` recorded on a copy or compute stream."""

    __slots__ = ("event",)

    def __init__(self, event: torch.cuda.Event):
        self.event = event

    def query(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        torch.cuda.current_stream(self.event.device).wait_event(self.event)

    def synchronize(self) -> None:
        self.event.synchronize()

    def elapsed_seconds(self, end: TransferEvent) -> float:
        if not isinstance(end, CudaEvent):
            raise TypeError(f"cannot time from a CUDA event to {type(end).__name__}")
        self.event.synchronize()
        end.event.synchronize()
        return self.event.elapsed_time(end.event) / 1e3


class CudaCopyEngine(CopyEngine):
    """A dedicated CUDA copy stream for host-to-device expert loads.

    Args:
        device: the CUDA device.
        priority: stream priority (lower is higher priority; 0 is the default).
    """

    def __init__(self, device: torch.device | str = "cuda", priority: int = 0):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CudaCopyEngine needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.stream = torch.cuda.Stream(device=device, priority=priority)
        self.map_stream = torch.cuda.Stream(device=device, priority=-1)
        self._invalidated: CudaEvent | None = None
        # Inside copy_context: the events each stream already waits for. Every event of
        # this package is recorded once (each ``record`` makes a new one), so a second wait
        # on one is a no-op and is skipped. Emptied when the outermost context ends.
        self._depth = 0
        self._waited: dict[int, torch.cuda.Event] = {}
        self._map_waited: dict[int, torch.cuda.Event] = {}

    @property
    def is_synchronous(self) -> bool:
        return False

    @contextlib.contextmanager
    def copy_context(self) -> Iterator[None]:
        self._depth += 1
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._waited.clear()
                self._map_waited.clear()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # Inside copy_context the current stream is the copy stream.
        dst.copy_(src, non_blocking=True)

    @staticmethod
    def _wait(stream: torch.cuda.Stream, event: TransferEvent, seen: dict | None) -> None:
        if not isinstance(event, CudaEvent):
            raise TypeError(f"a CUDA stream cannot wait on {type(event).__name__}")
        if seen is not None:
            if id(event.event) in seen:
                return
            seen[id(event.event)] = event.event  # kept alive: its id stays unique
        stream.wait_event(event.event)

    def wait_for(self, event: TransferEvent | None) -> None:
        if event is not None:
            self._wait(self.stream, event, self._waited if self._depth else None)

    def record(self, timing: bool = False) -> TransferEvent:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(self.stream)
        return CudaEvent(ev)

    def invalidate(
        self,
        dsts: Sequence[torch.Tensor],
        src: torch.Tensor,
        after: Sequence[TransferEvent | None],
    ) -> None:
        seen = self._map_waited if self._depth else None
        for event in after:
            if event is not None:
                self._wait(self.map_stream, event, seen)
        with torch.cuda.stream(self.map_stream):
            for dst in dsts:
                dst.copy_(src, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(self.map_stream)
        self.stream.wait_event(ev)  # the data copies that follow overwrite after it
        self._invalidated = CudaEvent(ev)

    def invalidations_done(self) -> TransferEvent | None:
        return self._invalidated

    def record_compute(self, timing: bool = False) -> TransferEvent:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(torch.cuda.current_stream(self.device))
        return CudaEvent(ev)

    def landing_marker(self) -> object | None:
        # external: a wait captured in a graph is a wait node on this event (each replay
        # waits for its latest record), not a dependency inside the capture. Recorded once
        # now: torch creates an event at its first record, and a wait on one never created
        # is skipped, in a capture too (no wait node at all).
        marker = torch.cuda.Event(external=True)
        marker.record(self.stream)
        return marker

    def mark_landing(self, marker: object | None) -> None:
        if isinstance(marker, torch.cuda.Event):
            marker.record(self.stream)

    def wait_landing(self, marker: object | None) -> None:
        if isinstance(marker, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(marker)

    def synchronize(self) -> None:
        self.stream.synchronize()


def default_copy_engine(device: torch.device | str) -> CopyEngine:
    """The engine for ``device``: a CUDA copy stream, or immediate CPU copies.

    Raises:
        ValueError: a device that is neither CPU nor CUDA.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return CudaCopyEngine(device)
    if device.type == "cpu":
        return ImmediateCopyEngine(device)
    raise ValueError(f"specter-cache supports 'cpu' and 'cuda' devices, got {device}")

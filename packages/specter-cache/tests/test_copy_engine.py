"""Copy engines on the CPU: immediate copies, and deferred copies that mimic a copy stream."""

import pytest
import torch

from specter_cache.copy_engine import DeferredCopyEngine, ImmediateCopyEngine, default_copy_engine


def test_immediate_engine_copies_at_once_and_events_are_complete():
    engine = ImmediateCopyEngine()
    dst, src = torch.zeros(4), torch.randn(4)
    with engine.copy_context():
        engine.copy(dst, src)
        ev = engine.record()
    assert torch.equal(dst, src)
    assert ev.query()
    assert engine.is_synchronous


def test_deferred_engine_runs_copies_in_order_only_when_asked():
    engine = DeferredCopyEngine()
    g = torch.Generator().manual_seed(0)
    dsts = [torch.zeros(3) for _ in range(4)]
    srcs = [torch.randn(3, generator=g) for _ in range(4)]
    events = []
    for d, s in zip(dsts, srcs, strict=True):
        engine.copy(d, s)
        events.append(engine.record(timing=True))
    assert engine.pending == 4
    assert not any(ev.query() for ev in events)
    assert all(torch.equal(d, torch.zeros(3)) for d in dsts)
    assert engine.step(1) == 1
    assert [ev.query() for ev in events] == [True, False, False, False]
    assert torch.equal(dsts[0], srcs[0])
    assert torch.equal(dsts[1], torch.zeros(3))
    events[2].wait()  # completes copies up to and including the third, not the fourth
    assert [ev.query() for ev in events] == [True, True, True, False]
    assert torch.equal(dsts[2], srcs[2])
    assert torch.equal(dsts[3], torch.zeros(3))
    assert events[0].elapsed_seconds(events[2]) >= 0
    engine.synchronize()
    assert engine.pending == 0
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
    with pytest.raises(ValueError, match="no copy number"):
        engine.run_until(99)


def test_default_engine_by_device():
    assert isinstance(default_copy_engine("cpu"), ImmediateCopyEngine)
    with pytest.raises(ValueError, match="'cpu' and 'cuda'"):
        default_copy_engine("meta")
    with pytest.raises(ValueError, match="CPU tensors"):
        DeferredCopyEngine("meta")

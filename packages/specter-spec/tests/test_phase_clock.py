"""PhaseClock: waits for the compute stream (never the whole device) before reading the
time, and does nothing else."""

import pytest
import torch

from specter_spec import PhaseClock


def _forbid_device_sync(monkeypatch):
    def device_sync(*args, **kwargs):
        raise AssertionError("PhaseClock must not wait for every stream of the device")

    monkeypatch.setattr(torch.cuda, "synchronize", device_sync)


def test_cpu_clock_never_synchronises_and_does_not_go_back(monkeypatch):
    _forbid_device_sync(monkeypatch)
    streams = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: streams.append(a))
    clock = PhaseClock("cpu")
    readings = [clock() for _ in range(5)]
    assert readings == sorted(readings)
    assert streams == []


def test_cuda_clock_waits_for_its_compute_stream_once_per_reading(monkeypatch):
    _forbid_device_sync(monkeypatch)
    calls = []

    class Stream:  # no GPU needed: the wait is recorded, not run
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            calls.append(self.device)

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    clock = PhaseClock("cuda:0")
    clock()
    clock()
    assert calls == [torch.device("cuda:0")] * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clock_lets_copy_stream_work_run_on():
    clock = PhaseClock("cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of a side stream's work
        side_done = torch.cuda.Event()
        side_done.record(side)
    torch.cuda._sleep(1_000_000)  # a little compute-stream work
    compute_done = torch.cuda.Event()
    compute_done.record()
    clock()
    assert compute_done.query()  # the compute stream was waited for
    assert not side_done.query()  # the side stream was not
    side.synchronize()

"""PhaseClock: synchronises CUDA before reading the time, and nothing else."""

import torch

from specter_spec import PhaseClock


def test_cpu_clock_never_synchronises_and_does_not_go_back(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: calls.append(args))
    clock = PhaseClock("cpu")
    readings = [clock() for _ in range(5)]
    assert readings == sorted(readings)
    assert calls == []


def test_cuda_clock_synchronises_its_device_once_per_reading(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    clock = PhaseClock("cuda:0")  # no GPU needed: synchronize is recorded, not run
    clock()
    clock()
    assert calls == [torch.device("cuda:0")] * 2

"""Backend dispatch: the environment variable, its errors, and the device default."""

import pytest
import torch

from specter_kernels.backend import BACKEND_ENV_VAR, requested_backend, select_backend


def test_auto_picks_torch_on_cpu(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    assert requested_backend() == "auto"
    assert select_backend(torch.device("cpu")) == "torch"


def test_forced_torch_wins_even_on_cuda_devices(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "TORCH")
    assert select_backend(torch.device("cuda", 0)) == "torch"


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv(BACKEND_ENV_VAR, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(torch.device("cpu")) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        select_backend(torch.device("cpu"))


def test_unknown_backend_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "cutlass")
    with pytest.raises(ValueError, match=r"auto.*triton.*torch"):
        select_backend(torch.device("cpu"))

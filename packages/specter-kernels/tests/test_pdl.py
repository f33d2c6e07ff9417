"""Programmatic dependent launch: when it is used, and that it changes no bits on the GPU."""

import pytest
import torch

import specter_kernels as sk
from specter_kernels import pdl


def test_pdl_is_off_on_the_cpu_and_under_the_interpreter(monkeypatch):
    assert pdl.pdl_options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))  # the interpreter cannot launch PDL


def test_the_variable_turns_pdl_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(pdl, "_capable", lambda index: True)
    monkeypatch.delenv(pdl.PDL_ENV_VAR, raising=False)
    assert pdl.pdl_options(torch.device("cuda", 0)) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv(pdl.PDL_ENV_VAR, "0")
    assert pdl.pdl_options(torch.device("cuda", 0)) == {"PDL": False}
    monkeypatch.setenv(pdl.PDL_ENV_VAR, "1")
    monkeypatch.setattr(pdl, "_capable", lambda index: False)  # before Hopper
    assert pdl.pdl_options(torch.device("cuda", 0)) == {"PDL": False}


def _layer(x, norm, w1, w2):
    """A decode-layer-like chain of this package's kernels: norm, GEMM, SwiGLU, GEMM."""
    h = sk.rms_norm(x, norm, 1e-6)
    h = sk.silu_and_mul(sk.invariant_linear(h, w1))
    return sk.invariant_linear(h, w2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_chain_of_kernels_gives_the_same_bits_with_and_without_pdl(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    if not pdl.pdl_enabled(torch.device("cuda")):
        pytest.skip("this GPU or environment does not use PDL")
    H, I = 2048, 1408
    norm = torch.randn(H, device="cuda").half()
    w1 = (torch.randn(2 * I, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(H, I, device="cuda") * 0.02).half()
    x = torch.randn(5, H, device="cuda").half()

    def chain(x):
        for _ in range(8):  # each kernel reads what the one before it wrote
            x = x + _layer(x, norm, w1, w2)
        return x

    monkeypatch.setenv(pdl.PDL_ENV_VAR, "0")
    plain = chain(x)
    monkeypatch.setenv(pdl.PDL_ENV_VAR, "1")
    assert torch.equal(chain(x), plain)
    static = x.clone()
    chain(static)  # compiled with PDL before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static)
    for _ in range(5):
        fresh = torch.randn_like(x)
        static.copy_(fresh)
        graph.replay()
        monkeypatch.setenv(pdl.PDL_ENV_VAR, "0")
        expected = chain(fresh)
        monkeypatch.setenv(pdl.PDL_ENV_VAR, "1")
        assert torch.equal(out, expected)

"""SwiGLU's activation inside the gate/up projection's GEMV: the bits of the GEMV then
``silu_and_mul``, each row's bits whatever the row count, the dispatch, and bad inputs."""

import pytest
import torch

import specter_kernels as sk
import specter_kernels.invariant_gemv_triton as gt
from kernel_helpers import rel_err
from specter_kernels.invariant_gemv_config import InvariantGemvConfig
from specter_kernels.invariant_gemv_triton import launch_invariant_gemv


def _gemv(x, weight, config, swiglu):
    width = weight.shape[0] // 2 if swiglu else weight.shape[0]
    out = torch.empty(x.shape[0], width, dtype=x.dtype)
    return launch_invariant_gemv(x, weight, out, None, config, swiglu=swiglu)


def _problem(M, inter, K, dtype=torch.float16):
    # Gate and up columns of a few units, so silu's exp and its rounding are exercised.
    x = torch.randn(M, K).to(dtype)
    return x, (torch.randn(2 * inter, K) * (3 / K**0.5)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("inter", "K", "config"),
    [
        (12, 40, InvariantGemvConfig(4, 2, 1)),  # K not a power of two: masked lanes
        (19, 64, InvariantGemvConfig(8, 4, 2)),  # I not a multiple of the tile
    ],
)
def test_the_swiglu_gemv_has_the_bits_of_the_gemv_then_silu_and_mul(
    seed, triton_backend, dtype, inter, K, config
):
    for M in (1, 2, 5):
        x, weight = _problem(M, inter, K, dtype)
        fused = _gemv(x, weight, config, swiglu=True)
        assert fused.shape == (M, inter)
        two_launches = sk.silu_and_mul(_gemv(x, weight, config, swiglu=False))
        assert torch.equal(fused, two_launches)
        want = sk.swiglu_linear_reference(x.double(), weight.double())
        assert rel_err(fused, want) < 3e-3


def test_each_swiglu_row_is_bitwise_independent_of_the_row_count(seed, triton_backend):
    M, inter, K = 6, 10, 48
    x, weight = _problem(M, inter, K)
    config = InvariantGemvConfig(4, 2, 3)
    full = _gemv(x, weight, config, swiglu=True)
    for m in range(1, M):
        assert torch.equal(full[:m], _gemv(x[:m], weight, config, swiglu=True))
    changed = x.clone()
    changed[1:] = torch.randn(M - 1, K).half()
    assert torch.equal(_gemv(changed, weight, config, swiglu=True)[0], full[0])


def test_swiglu_linear_takes_one_launch_where_the_gemv_applies(seed, triton_backend, monkeypatch):
    calls = []
    real = gt.launch_invariant_gemv
    monkeypatch.setattr(
        gt, "launch_invariant_gemv", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    x, weight = _problem(3, 20, 48)
    fused = sk.swiglu_linear(x, weight, constant_weight=True)
    assert calls == [{"swiglu": True}]
    two_calls = sk.silu_and_mul(sk.invariant_linear(x, weight, constant_weight=True))
    assert torch.equal(fused, two_calls)
    assert torch.equal(sk.swiglu_linear(x[None], weight)[0], fused)  # leading dims kept
    # A K the GEMV does not take (K % 8 != 0): the two calls.
    calls.clear()
    odd_x, odd_w = _problem(2, 20, 36)
    out = sk.swiglu_linear(odd_x, odd_w)
    assert calls == []
    assert torch.equal(out, sk.silu_and_mul(sk.invariant_linear(odd_x, odd_w)))


def test_swiglu_linear_on_the_torch_backend_is_the_two_calls(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    x, weight = _problem(4, 8, 16, torch.float32)
    want = sk.silu_and_mul(sk.invariant_linear(x, weight))
    assert torch.equal(sk.swiglu_linear(x, weight), want)
    assert rel_err(sk.swiglu_linear_reference(x, weight), want.double()) < 1e-5


def test_bad_inputs_are_refused_with_the_shapes_named():
    weight = torch.randn(40, 48).half()
    with pytest.raises(ValueError, match=r"x \(3, 40\) must be \[\.\.\., K\].*K = 48"):
        sk.swiglu_linear(torch.randn(3, 40).half(), weight)
    with pytest.raises(ValueError, match=r"weight must be \[2I, K\].*\(39, 48\)"):
        sk.swiglu_linear(torch.randn(3, 48).half(), weight[:39])
    with pytest.raises(TypeError, match=r"x is torch\.float32 but weight is torch\.float16"):
        sk.swiglu_linear(torch.randn(3, 48), weight)
    with pytest.raises(TypeError, match=r"x has dtype torch\.int32"):
        sk.swiglu_linear(torch.zeros(3, 48, dtype=torch.int32), weight)
    with pytest.raises(ValueError, match=r"swiglu needs a \[2I, K\] weight"):
        launch_invariant_gemv(
            torch.randn(1, 48).half(), weight, torch.empty(1, 40).half(), None,
            InvariantGemvConfig(4, 1, 1), swiglu=True,
        )  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("inter", "K"), [(2816, 2048), (10944, 2048), (5632, 2048)])
def test_on_the_gpu_the_fused_launch_has_the_two_launch_bits(seed, monkeypatch, inter, K):
    # DeepSeek-V2-Lite's shared experts (I = 2 x 1408) and dense layer (I = 10944), and
    # Qwen1.5-MoE's shared expert (I = 5632), with the shipped tiles; columns of a few units,
    # so CUDA's expf and the roundings are exercised.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    weight = (torch.randn(2 * inter, K, device="cuda") * (3 / K**0.5)).half()
    for M in range(1, 10):
        x = torch.randn(M, K, device="cuda").half()
        fused = sk.swiglu_linear(x, weight, constant_weight=True)
        two_calls = sk.silu_and_mul(sk.invariant_linear(x, weight, constant_weight=True))
        assert torch.equal(fused, two_calls)
        if M > 1:
            assert torch.equal(fused[:1], sk.swiglu_linear(x[:1], weight))

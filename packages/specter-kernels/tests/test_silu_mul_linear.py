"""SwiGLU's activation inside the down projection's GEMV: the bits of ``silu_and_mul`` then
the GEMV, each row's bits whatever the row count, the dispatch, and bad inputs."""

import pytest
import torch

import specter_kernels as sk
import specter_kernels.invariant_gemv_config as gc
import specter_kernels.invariant_gemv_triton as gt
from kernel_helpers import rel_err
from specter_kernels.invariant_gemv_config import InvariantGemvConfig
from specter_kernels.invariant_gemv_triton import launch_invariant_gemv
from specter_kernels.silu_mul_linear import silu_mul_linear, silu_mul_linear_reference


def _gemv(x, weight, config, glu):
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    return launch_invariant_gemv(x, weight, out, None, config, glu=glu)


def _gate_up(M, inter, dtype=torch.float16):
    # Gates from -12 to 12, so silu's exp and its rounding are exercised in both tails.
    return (torch.randn(M, 2 * inter) * 4).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("N", "inter", "config"),
    [
        (24, 40, InvariantGemvConfig(4, 2, 1)),  # I not a power of two: masked lanes
        (37, 64, InvariantGemvConfig(8, 4, 2)),  # N not a multiple of the tile
    ],
)
def test_the_glu_gemv_has_the_bits_of_silu_and_mul_then_the_gemv(
    seed, triton_backend, dtype, N, inter, config
):
    weight = torch.randn(N, inter).to(dtype)
    for M in (1, 2, 5):
        x = _gate_up(M, inter, dtype)
        fused = _gemv(x, weight, config, glu=True)
        two_launches = _gemv(sk.silu_and_mul(x), weight, config, glu=False)
        assert torch.equal(fused, two_launches)
        want = sk.silu_and_mul_reference(x.double()) @ weight.double().T
        assert rel_err(fused, want) < 3e-3


def test_each_glu_row_is_bitwise_independent_of_the_row_count(seed, triton_backend):
    M, N, inter = 6, 20, 48
    x, weight = _gate_up(M, inter), torch.randn(N, inter).half()
    config = InvariantGemvConfig(4, 2, 3)
    full = _gemv(x, weight, config, glu=True)
    for m in range(1, M):
        assert torch.equal(full[:m], _gemv(x[:m], weight, config, glu=True))
    changed = x.clone()
    changed[1:] = _gate_up(M - 1, inter)
    assert torch.equal(_gemv(changed, weight, config, glu=True)[0], full[0])


def test_silu_mul_linear_takes_one_launch_where_the_gemv_applies(seed, triton_backend, monkeypatch):
    calls = []
    real = gt.launch_invariant_gemv
    monkeypatch.setattr(
        gt, "launch_invariant_gemv", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    x, weight = _gate_up(3, 48), torch.randn(20, 48).half()
    fused = silu_mul_linear(x, weight, constant_weight=True)
    assert calls == [{"glu": True}]
    two_calls = sk.invariant_linear(sk.silu_and_mul(x), weight, constant_weight=True)
    assert torch.equal(fused, two_calls)
    assert rel_err(fused, silu_mul_linear_reference(x.double(), weight.double())) < 3e-3
    # Leading dims are kept.
    assert torch.equal(silu_mul_linear(x[None], weight)[0], fused)
    # I % 8 != 0: the two calls (silu_and_mul, then invariant_linear's own choice).
    calls.clear()
    odd_x, odd_w = _gate_up(2, 36), torch.randn(20, 36).half()
    out = silu_mul_linear(odd_x, odd_w)
    assert all(not k.get("glu") for k in calls)
    assert torch.equal(out, sk.invariant_linear(sk.silu_and_mul(odd_x), odd_w))
    # No GEMV tile for (N, I): the two calls, the down projection on the tensor-core kernel.
    calls.clear()
    monkeypatch.setattr(gc, "gemv_config", lambda *a: None)
    out = silu_mul_linear(x, weight)
    assert calls == []
    assert torch.equal(out, sk.invariant_linear(sk.silu_and_mul(x), weight))


def test_silu_mul_linear_on_the_torch_backend_is_the_two_calls(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    x, weight = _gate_up(4, 16, torch.float32), torch.randn(8, 16)
    want = sk.invariant_linear(sk.silu_and_mul(x), weight)
    assert torch.equal(silu_mul_linear(x, weight), want)
    assert rel_err(silu_mul_linear_reference(x, weight), want.double()) < 1e-5


def test_bad_inputs_are_refused_with_the_shapes_named():
    weight = torch.randn(20, 48).half()
    with pytest.raises(ValueError, match=r"x \(3, 48\) must be \[\.\.\., 2I\].*must be 96"):
        silu_mul_linear(torch.randn(3, 48).half(), weight)
    with pytest.raises(ValueError, match=r"x \(3, 95\) must be \[\.\.\., 2I\].*must be 96"):
        silu_mul_linear(torch.randn(3, 95).half(), weight)  # an odd last dim
    with pytest.raises(TypeError, match=r"x is torch\.float32 but weight is torch\.float16"):
        silu_mul_linear(torch.randn(3, 96), weight)
    with pytest.raises(TypeError, match=r"x has dtype torch\.int32"):
        silu_mul_linear(torch.zeros(3, 96, dtype=torch.int32), weight)
    with pytest.raises(ValueError, match=r"weight must be \[N, I\]"):
        silu_mul_linear(torch.randn(3, 96).half(), weight[None])
    with pytest.raises(ValueError, match=r"glu needs K % 8 == 0.*got K=36"):
        launch_invariant_gemv(
            torch.randn(1, 72).half(), torch.randn(4, 36).half(), torch.empty(1, 4).half(),
            None, InvariantGemvConfig(4, 1, 1), glu=True,
        )  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("N", "inter"), [(2048, 2816), (2048, 5632)])
def test_on_the_gpu_the_fused_launch_has_the_two_launch_bits(seed, monkeypatch, N, inter):
    # DeepSeek-V2-Lite's shared-expert down projection (I = 2 x 1408) and Qwen1.5-MoE's
    # (I = 5632), with the shipped tiles; gates spread wide, so CUDA's expf is exercised.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    weight = (torch.randn(N, inter, device="cuda") * 0.02).half()
    for M in range(1, 10):
        x = (torch.randn(M, 2 * inter, device="cuda") * 4).half()
        fused = silu_mul_linear(x, weight, constant_weight=True)
        two_calls = sk.invariant_linear(sk.silu_and_mul(x), weight, constant_weight=True)
        assert torch.equal(fused, two_calls)
        if M > 1:
            assert torch.equal(fused[:1], silu_mul_linear(x[:1], weight))

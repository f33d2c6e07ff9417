"""Fused residual adds: the add-then-RMSNorm and the two-branch residual add give the bits of
the separate torch adds and ``rms_norm``, per row whatever the row count, with clear errors."""

import pytest
import torch

import specter_kernels as sk


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [1, 48, 1100, 5000])
def test_add_rms_norm_gives_the_bits_of_the_add_and_the_norm(seed, backend, dtype, N):
    weight = (1 + 0.3 * torch.randn(N)).to(dtype)
    x = (3 * torch.randn(2, 3, N)).to(dtype)
    residual = (3 * torch.randn(2, 3, N)).to(dtype)
    summed, normed = sk.add_rms_norm(x, residual, weight, 1e-5)
    assert summed.dtype == normed.dtype == dtype
    assert summed.shape == normed.shape == x.shape
    assert torch.equal(summed, residual + x)  # torch's add, rounded once
    # rms_norm of the rounded sum, on the same backend: the same bits, not just close
    assert torch.equal(normed, sk.rms_norm(residual + x, weight, 1e-5))


def test_add_rms_norm_reference_is_the_add_then_the_norm(seed):
    weight = 1 + 0.3 * torch.randn(32)
    x, residual = torch.randn(4, 32).half(), torch.randn(4, 32).half()
    summed, normed = sk.add_rms_norm_reference(x, residual, weight, 1e-6)
    assert torch.equal(summed, residual + x)
    assert torch.equal(normed, sk.rms_norm_reference(residual + x, weight, 1e-6))
    assert normed.dtype == torch.float32  # fp32 weight, fp16 rows: promoted, as rms_norm


def test_add_rms_norm_rows_are_batch_invariant(seed, triton_backend):
    N = 300
    weight = (1 + 0.3 * torch.randn(N)).half()
    x, residual = (4 * torch.randn(7, N)).half(), (4 * torch.randn(7, N)).half()
    summed, normed = sk.add_rms_norm(x, residual, weight, 1e-6)
    alone = [sk.add_rms_norm(x[i : i + 1], residual[i : i + 1], weight, 1e-6) for i in range(7)]
    assert torch.equal(summed, torch.cat([s for s, _ in alone]))
    assert torch.equal(normed, torch.cat([n for _, n in alone]))


def test_add_rms_norm_takes_strided_rows(seed, backend):
    N = 64
    x = torch.randn(N, 6).half().t()  # [6, N], stride 1 along rows
    residual = torch.randn(6, 2 * N).half()[:, ::2]  # stride 2 along N
    summed, normed = sk.add_rms_norm(x, residual, torch.ones(N).half(), 1e-6)
    assert torch.equal(summed, residual + x)
    assert torch.equal(normed, sk.rms_norm(residual + x, torch.ones(N).half(), 1e-6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [1, 48, 2500])
def test_residual_add_rounds_the_inner_sum_first(seed, backend, dtype, N):
    residual, a, b = ((4 * torch.randn(3, N)).to(dtype) for _ in range(3))
    out = sk.residual_add(residual, a, b)
    assert out.dtype == dtype
    assert out.shape == residual.shape
    assert torch.equal(out, residual + (a + b))
    if dtype == torch.float16 and N > 1:  # the rounding order shows: a one-rounding sum differs
        once = (residual.float() + a.float() + b.float()).half()
        assert not torch.equal(out, once)


def test_residual_add_takes_strided_and_3d_inputs(seed, backend):
    residual = torch.randn(1, 5, 40).half()
    a = torch.randn(1, 40, 5).half().transpose(1, 2)
    b = torch.randn(1, 5, 80).half()[..., ::2]
    assert torch.equal(sk.residual_add(residual, a, b), residual + (a + b))


def test_bad_inputs_are_refused():
    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match=r"residual has dtype torch\.float16"):
        sk.add_rms_norm(x, x.half(), torch.ones(8), 1e-6)
    with pytest.raises(TypeError, match="float64"):
        sk.add_rms_norm(x.double(), x.double(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"residual is \(2, 9\)"):
        sk.add_rms_norm(x, torch.randn(2, 9), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"weight \[N\]"):
        sk.add_rms_norm(x, x, torch.ones(9), 1e-6)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        sk.add_rms_norm(x, x, torch.ones(8), -1.0)
    with pytest.raises(ValueError, match=r"b is \(2, 7\)"):
        sk.residual_add(x, x, torch.randn(2, 7))
    with pytest.raises(TypeError, match=r"a has dtype torch\.bfloat16"):
        sk.residual_add(x, x.bfloat16(), x)
    with pytest.raises(ValueError, match="at least one dimension"):
        sk.residual_add(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0))

"""Batch-invariant row sum, mean, softmax and norms against torch, and bitwise invariance."""

import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk
from kernel_helpers import rel_err


def _ops(weight, bias):
    N = weight.shape[0]
    return {
        "row_sum": (sk.invariant_row_sum, lambda x: x.double().sum(-1)),
        "mean": (sk.invariant_mean, lambda x: x.double().mean(-1)),
        "softmax": (sk.invariant_softmax, lambda x: torch.softmax(x.double(), -1)),
        "log_softmax": (sk.invariant_log_softmax, lambda x: torch.log_softmax(x.double(), -1)),
        "layer_norm": (
            lambda x: sk.invariant_layer_norm(x, (N,), weight.to(x.dtype), bias.to(x.dtype)),
            lambda x: F.layer_norm(x.double(), (N,), weight.double(), bias.double()),
        ),
        "rms_norm": (
            lambda x: sk.invariant_rms_norm(x, (N,), weight.to(x.dtype), 1e-6),
            lambda x: F.rms_norm(x.double(), (N,), weight.double(), 1e-6),
        ),
    }


OPS = ["row_sum", "mean", "softmax", "log_softmax", "layer_norm", "rms_norm"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [1, 33, 1100])
@pytest.mark.parametrize("op", OPS)
def test_matches_torch(seed, backend, dtype, N, op):
    fn, reference = _ops(torch.randn(N), torch.randn(N))[op]
    x = (torch.randn(2, 3, N) * 3).to(dtype)
    out = fn(x)
    assert out.shape == reference(x).shape
    assert rel_err(out, reference(x)) < (3e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("op", OPS)
def test_rows_are_bitwise_independent_of_the_row_count(seed, backend, dtype, op):
    M, N = 11, 1037
    fn, _ = _ops(torch.randn(N), torch.randn(N))[op]
    x = (torch.randn(M, N) * 3).to(dtype)
    full = fn(x)
    for m in (1, 3, M):
        assert torch.equal(full[:m], fn(x[:m]))
    changed = x.clone()
    changed[1:] = torch.randn(M - 1, N).to(dtype)
    assert torch.equal(fn(changed)[0], full[0])


def test_trailing_zeros_do_not_change_a_row_sum(seed, backend):
    # Attention over a longer (masked) key range sums the same row plus zeros.
    x = torch.randn(4, 300)
    padded = torch.cat([x, torch.zeros(4, 900)], dim=1)
    assert torch.equal(sk.invariant_row_sum(x), sk.invariant_row_sum(padded))


def test_softmax_keeps_torch_semantics_at_the_edges(seed, backend):
    x = torch.randn(3, 20)
    x[1] = float("-inf")
    out = sk.invariant_softmax(x)
    assert torch.isnan(out[1]).all()
    assert torch.isnan(torch.softmax(x, -1)[1]).all()
    assert torch.allclose(out[0::2], torch.softmax(x, -1)[0::2], atol=1e-6)
    half = sk.invariant_softmax(x[0::2], dtype=torch.float16)
    assert half.dtype == torch.float16
    assert sk.invariant_mean(x.half(), keepdim=True, dtype=torch.float32).shape == (3, 1)


def test_other_dims_and_dtypes_are_refused():
    with pytest.raises(ValueError, match="last dim"):
        sk.invariant_softmax(torch.randn(3, 4), dim=0)
    with pytest.raises(TypeError, match="float64"):
        sk.invariant_row_sum(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="normalized_shape"):
        sk.invariant_layer_norm(torch.randn(3, 4, 5), (4, 5))
    with pytest.raises(ValueError, match="weight"):
        sk.invariant_rms_norm(torch.randn(3, 4), (4,), torch.randn(5))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_masked_padding_equals_the_unpadded_row(seed, backend, log):
    # Window-mode attention: the same keys plus -inf ones past the filled length.
    from specter_kernels.invariant.reductions import _softmax

    x = torch.randn(4, 300) * 3
    padded = torch.cat([x, torch.full((4, 900), float("-inf"))], dim=1)
    out = _softmax(padded, -1, None, log=log, zero_masked_rows=True)
    assert torch.equal(out[:, :300], _softmax(x, -1, None, log=log, zero_masked_rows=True))
    if not log:
        assert torch.equal(out[:, 300:], torch.zeros(4, 900))


def test_an_all_masked_row_gives_zeros_where_asked(seed, backend):
    from specter_kernels.invariant.reductions import _softmax

    x = torch.randn(3, 40)
    x[1] = float("-inf")
    out = _softmax(x, -1, torch.float16, log=False, zero_masked_rows=True)
    assert out.dtype == torch.float16  # ``dtype`` casts the input, as torch's does
    assert torch.equal(out[1], torch.zeros(40, dtype=torch.float16))
    expected = torch.softmax(x[0::2].half().float(), -1)
    assert torch.allclose(out[0::2].float(), expected, atol=1e-3)

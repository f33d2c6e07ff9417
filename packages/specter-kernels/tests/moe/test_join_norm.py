"""The MoE join with the next RMSNorm: the bits of the join (``residual_add`` or
``residual_add_routed_pairs``) and of ``rms_norm`` on its sum, per row whatever the row count,
every output written, clear errors."""

import pytest
import torch

import specter_kernels as sk


def _rows(T, N, dtype, k=None):
    residual = (3 * torch.randn(T, N)).to(dtype)
    shared = torch.randn(T, N).to(dtype)
    routed = torch.randn(T, k, N) if k else torch.randn(T, N).to(dtype)
    weight = (1 + 0.3 * torch.randn(N)).to(dtype)
    return residual, routed, shared, weight


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [1, 48, 1100, 5000])
def test_join_and_norm_give_the_bits_of_the_two_calls(seed, backend, dtype, N):
    residual, routed, shared, weight = _rows(3, N, dtype)
    summed, normed = sk.residual_add_rms_norm(residual, routed, shared, weight, 1e-5)
    assert summed.dtype == normed.dtype == dtype
    assert torch.equal(summed, sk.residual_add(residual, routed, shared))
    assert torch.equal(normed, sk.rms_norm(summed, weight, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("N", "k"), [(48, 1), (1100, 6), (5000, 2)])
def test_pair_join_and_norm_give_the_bits_of_the_two_calls(seed, backend, dtype, N, k):
    residual, pairs, shared, weight = _rows(2, N, dtype, k)
    summed, normed = sk.residual_add_routed_pairs_rms_norm(residual, pairs, shared, weight, 1e-6)
    assert torch.equal(summed, sk.residual_add_routed_pairs(residual, pairs, shared))
    assert torch.equal(normed, sk.rms_norm(summed, weight, 1e-6))


def test_references_are_the_join_then_the_norm(seed):
    residual, routed, shared, weight = _rows(4, 32, torch.float16)
    weight = weight.float()
    summed, normed = sk.residual_add_rms_norm_reference(residual, routed, shared, weight, 1e-6)
    assert torch.equal(summed, residual + (routed + shared))
    assert torch.equal(normed, sk.rms_norm_reference(summed, weight, 1e-6))
    assert normed.dtype == torch.float32  # fp32 weight, fp16 rows: promoted, as rms_norm
    pairs = torch.randn(4, 3, 32)
    summed, normed = sk.residual_add_routed_pairs_rms_norm_reference(
        residual, pairs, shared, weight, 1e-6
    )
    assert torch.equal(summed, sk.residual_add_routed_pairs_reference(residual, pairs, shared))
    assert torch.equal(normed, sk.rms_norm_reference(summed, weight, 1e-6))


def test_rows_are_batch_invariant_and_every_output_written(seed, poisoned):
    residual, pairs, shared, weight = _rows(5, 300, torch.float16, 4)
    summed, normed = sk.residual_add_routed_pairs_rms_norm(residual, pairs, shared, weight, 1e-6)
    assert not summed.isnan().any()
    assert not normed.isnan().any()
    for i in range(5):
        one = sk.residual_add_routed_pairs_rms_norm(
            residual[i : i + 1], pairs[i : i + 1], shared[i : i + 1], weight, 1e-6
        )
        assert torch.equal(one[0][0], summed[i])
        assert torch.equal(one[1][0], normed[i])
    routed = torch.randn(5, 300).half()
    summed, normed = sk.residual_add_rms_norm(residual, routed, shared, weight, 1e-6)
    assert torch.equal(normed[2:3], sk.residual_add_rms_norm(
        residual[2:3], routed[2:3], shared[2:3], weight, 1e-6)[1])  # fmt: skip


def test_strided_pairs_are_read(seed, backend):
    residual, pairs, shared, weight = _rows(3, 64, torch.float16, 6)
    wide = torch.randn(3, 6, 80)
    wide[:, :, 8:72] = pairs
    a = sk.residual_add_routed_pairs_rms_norm(residual, wide[:, :, 8:72], shared, weight, 1e-6)
    b = sk.residual_add_routed_pairs_rms_norm(residual, pairs, shared, weight, 1e-6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda r, a, s, w: (r, a.float(), s, w), ValueError, r"routed must match residual"),
        (lambda r, a, s, w: (r, a, s[:2], w), ValueError, r"shared must match residual"),
        (lambda r, a, s, w: (r, a, s, w[:5]), ValueError, r"weight \[N\]"),
        (lambda r, a, s, w: (r.long(), a, s, w), TypeError, r"residual has dtype torch.int64"),
        (lambda r, a, s, w: (r[None], a[None], s[None], w), ValueError, r"must be \[T, H\]"),
    ],
)
def test_bad_inputs_are_refused(make, error, match):
    residual, routed, shared, weight = _rows(3, 16, torch.float16)
    with pytest.raises(error, match=match):
        sk.residual_add_rms_norm(*make(residual, routed, shared, weight), 1e-6)


def test_bad_pairs_are_refused():
    residual, _, shared, weight = _rows(3, 16, torch.float16)
    with pytest.raises(TypeError, match=r"float32 \[T, k, H\]"):
        sk.residual_add_routed_pairs_rms_norm(
            residual, torch.zeros(3, 2, 16).half(), shared, weight, 1e-6
        )
    with pytest.raises(ValueError, match="eps"):
        sk.residual_add_routed_pairs_rms_norm(residual, torch.zeros(3, 2, 16), shared, weight, -1.0)

"""Last-dim argmax: torch.argmax's index (first of ties, NaN the largest) whatever the
split of a row into programs, the counters left at zero, clear errors."""

import pytest
import torch

import specter_kernels as sk


@pytest.fixture
def small_blocks(monkeypatch, triton_backend):
    """The Triton kernel with 16-value programs, so rows of a few dozen values are merged
    from several partials (the shipped 4096 would give one program)."""
    from specter_kernels.sampling import argmax_triton

    monkeypatch.setattr(argmax_triton, "BLOCK", 16)
    return argmax_triton


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("V", [1, 15, 16, 47, 100])
def test_matches_torch_argmax(seed, small_blocks, dtype, V):
    x = torch.randn(3, V).to(dtype)
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))


def test_ties_go_to_the_first_index_across_programs(seed, small_blocks):
    x = torch.zeros(4, 70)
    x[0, [5, 40, 69]] = 2.0  # three programs hold the peak: the first one's index wins
    x[1, [33, 34]] = 1.0  # two in one program
    x[2] = -1.0  # a constant row: index 0
    x[3, 69] = float("inf")
    assert sk.argmax_last_dim(x).tolist() == [5, 33, 0, 69]
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))


def test_nan_counts_as_the_largest_value(seed, small_blocks):
    x = torch.randn(3, 50)
    x[0, 37] = float("nan")
    x[0, 45] = float("nan")
    x[1, 2] = float("inf")
    x[1, 20] = float("nan")
    x[2] = float("-inf")
    got = sk.argmax_last_dim(x)
    assert got.tolist() == [37, 20, 0]
    assert torch.equal(got, x.argmax(dim=-1))


def test_leading_dims_and_strided_rows(seed, small_blocks):
    x = torch.randn(2, 3, 40).half()
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))
    wide = torch.randn(5, 90)
    assert torch.equal(sk.argmax_last_dim(wide[:, 7:71]), wide[:, 7:71].argmax(dim=-1))
    columns = torch.randn(40, 6).t()  # last dim not contiguous: copied first
    assert torch.equal(sk.argmax_last_dim(columns), columns.argmax(dim=-1))


def test_counters_left_at_zero_and_reused(seed, small_blocks):
    # Each row's last program sets its counter back to zero, so the next launch's tickets
    # count from zero again and its merge runs once, on that launch's partials.
    from specter_kernels.invariant import matmul_triton as invariant_matmul_triton

    x = torch.randn(5, 64)
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))
    counters = invariant_matmul_triton.tile_counters(x.device, 5)
    assert int(counters.count_nonzero()) == 0
    x[:, 50] = 100.0
    assert sk.argmax_last_dim(x).tolist() == [50] * 5
    assert int(counters.count_nonzero()) == 0


def test_every_partial_written(seed, poisoned, monkeypatch):
    # Partials and output come from torch.empty filled with NaN / -777: a partial left
    # unwritten would win the merge as a NaN.
    from specter_kernels.sampling import argmax_triton

    monkeypatch.setattr(argmax_triton, "BLOCK", 16)
    x = torch.randn(3, 61)
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))


def test_shipped_block_is_one_program_for_small_rows(seed, triton_backend):
    # At the shipped BLOCK a 300-value row is one program: no partials, no counter.
    x = torch.randn(2, 300).half()
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (torch.tensor(1.0), ValueError, r"non-empty last dim, got shape \(\)"),
        (torch.zeros(3, 0), ValueError, r"got shape \(3, 0\)"),
        (torch.zeros(3, 4, dtype=torch.int64), TypeError, "dtype torch.int64"),
        ([1.0, 2.0], TypeError, "must be a tensor, got list"),
    ],
)
def test_bad_input_is_refused(backend, x, error, match):
    with pytest.raises(error, match=match):
        sk.argmax_last_dim(x)


def test_fp64_takes_the_reference(seed, triton_backend, monkeypatch):
    from specter_kernels.sampling import argmax_triton

    monkeypatch.setattr(argmax_triton, "launch_argmax", None)  # would fail if called
    x = torch.randn(3, 40, dtype=torch.float64)
    x[1, 5] = x[1, 9] = 1e300  # beyond fp32
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))


def test_reference_is_torch_argmax(seed):
    x = torch.randn(4, 33)
    assert torch.equal(sk.argmax_last_dim_reference(x), torch.argmax(x, dim=-1))

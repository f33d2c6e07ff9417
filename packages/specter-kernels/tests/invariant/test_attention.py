"""Batch-invariant attention against SDPA, and bitwise invariance to the query count."""

import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk
from kernel_helpers import rel_err


def _qkv(B, Hq, Hk, T, L, D, Dv, dtype):
    return (
        torch.randn(B, Hq, T, D).to(dtype),
        torch.randn(B, Hk, L, D).to(dtype),
        torch.randn(B, Hk, L, Dv).to(dtype),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("masking", ["none", "causal", "bool", "float"])
def test_matches_sdpa(seed, backend, dtype, masking):
    B, Hq, Hk, T, L, D, Dv = 2, 4, 2, 5, 9, 24, 16
    q, k, v = _qkv(B, Hq, Hk, T, L, D, Dv, dtype)
    kwargs = {"enable_gqa": True, "scale": 0.3}
    if masking == "causal":
        kwargs["is_causal"] = True
    elif masking == "bool":
        mask = torch.rand(B, 1, T, L) < 0.7
        mask[..., 0] = True  # no fully masked row: SDPA backends disagree there
        kwargs["attn_mask"] = mask
    elif masking == "float":
        kwargs["attn_mask"] = torch.randn(T, L).to(dtype)
    out = sk.invariant_attention(q, k, v, **kwargs)
    if masking == "float":  # SDPA wants the mask in the query's dtype
        kwargs["attn_mask"] = kwargs["attn_mask"].double()
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)
    assert out.dtype == dtype
    assert out.shape == (B, Hq, T, Dv)
    assert rel_err(out, expected) < (3e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_query_rows_are_bitwise_independent_of_their_count(seed, backend, dtype):
    # A static cache: L fixed, the first T queries at positions 0..T-1 see keys <= position.
    B, Hq, Hk, T, L, D = 1, 4, 2, 9, 16, 16
    q, k, v = _qkv(B, Hq, Hk, T, L, D, D, dtype)
    visible = torch.arange(L)[None, :] <= torch.arange(T)[:, None]
    full = sk.invariant_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    for m in (1, 3, T):
        part = sk.invariant_attention(q[:, :, :m], k, v, attn_mask=visible[:m], enable_gqa=True)
        assert torch.equal(full[:, :, :m], part)


def test_a_fully_masked_row_gives_zeros(seed, backend):
    q, k, v = _qkv(1, 2, 2, 3, 5, 16, 16, torch.float32)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out = sk.invariant_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 16))
    assert torch.isfinite(out).all()


def test_bad_inputs_are_refused():
    q, k, v = _qkv(1, 4, 2, 3, 5, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="enable_gqa"):
        sk.invariant_attention(q, k, v)
    with pytest.raises(ValueError, match="not both"):
        sk.invariant_attention(
            q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True, enable_gqa=True
        )
    with pytest.raises(TypeError, match="dtypes differ"):
        sk.invariant_attention(q.half(), k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="broadcast"):
        sk.invariant_attention(
            q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool), enable_gqa=True
        )

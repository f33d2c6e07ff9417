"""Interleaved rotary embedding: transformers' DeepSeek-V2 arithmetic in one launch."""

import pytest
import torch
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb

import specter_kernels as sk
from kernel_helpers import rel_err


def _freqs(batch: int, seq: int, half: int, offset: int = 0) -> torch.Tensor:
    """``[batch, seq, half]`` complex64 as DeepSeek-V2's rotary module makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half)))
    pos = torch.arange(offset, offset + seq, dtype=torch.float)
    angles = pos[:, None] * inv[None, :]
    freqs = torch.polar(torch.ones_like(angles), angles)
    return freqs.unsqueeze(0).expand(batch, -1, -1).contiguous()


def test_reference_is_transformers_apply_rotary_emb(seed):
    q = torch.randn(2, 3, 5, 8).half()
    k = torch.randn(2, 1, 5, 8).half()
    freqs = _freqs(2, 5, 4, offset=7)
    expected_q, expected_k = apply_rotary_emb(q, k, freqs)
    assert torch.equal(sk.rotary_complex_reference(q, freqs), expected_q)
    assert torch.equal(sk.rotary_complex_reference(k, freqs), expected_k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("B", "H", "S", "D"), [(1, 1, 1, 2), (1, 4, 3, 64), (2, 3, 5, 10)])
def test_matches_the_reference(seed, backend, dtype, B, H, S, D):
    x = (2 * torch.randn(B, H, S, D)).to(dtype)
    freqs = _freqs(B, S, D // 2, offset=11)
    out = sk.rotary_complex(x, freqs)
    expected = sk.rotary_complex_reference(x.double().float(), freqs).double()
    assert out.shape == x.shape
    assert out.dtype == dtype
    assert out.is_contiguous()
    assert rel_err(out, expected) < (1e-3 if dtype == torch.float16 else 1e-6)


def test_strided_rope_slice_and_broadcast_positions(seed, backend):
    # The rope part of a query: the last 8 of 24 features, heads transposed in.
    q = torch.randn(2, 6, 3, 24).half().transpose(1, 2)  # [B, H=3, S=6, 24], not contiguous
    q_pe = q[..., 16:]
    freqs = _freqs(1, 6, 4, offset=2)  # one batch row of positions, broadcast over B
    out = sk.rotary_complex(q_pe, freqs)
    expected = sk.rotary_complex_reference(q_pe, freqs)
    assert rel_err(out, expected) < 1e-3


def test_rows_are_batch_invariant(seed, triton_backend):
    x = torch.randn(1, 2, 7, 16).half()
    freqs = _freqs(1, 7, 8)
    together = sk.rotary_complex(x, freqs)
    alone = torch.cat(
        [sk.rotary_complex(x[:, :, i : i + 1], freqs[:, i : i + 1]) for i in range(7)], dim=2
    )
    assert torch.equal(together, alone)


def test_bad_inputs_are_refused():
    x = torch.randn(1, 2, 3, 8)
    freqs = _freqs(1, 3, 4)
    with pytest.raises(TypeError, match="float64"):
        sk.rotary_complex(x.double(), freqs)
    with pytest.raises(TypeError, match="complex64"):
        sk.rotary_complex(x, torch.view_as_real(freqs))
    with pytest.raises(ValueError, match="D even"):
        sk.rotary_complex(torch.randn(1, 2, 3, 7), freqs)
    with pytest.raises(ValueError, match=r"\[B or 1, S, D/2\]"):
        sk.rotary_complex(x, _freqs(1, 4, 4))
    with pytest.raises(ValueError, match=r"\[B or 1, S, D/2\]"):
        sk.rotary_complex(x, _freqs(3, 3, 4))

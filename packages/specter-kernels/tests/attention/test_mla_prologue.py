"""The MLA prologue in one launch: the latent norm, the rotary embedding, the cache writes."""

import pytest
import torch
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb

import specter_kernels as sk
from kernel_helpers import rel_err


def _freqs(seq: int, half: int, offset: int = 0) -> torch.Tensor:
    """``[1, seq, half]`` complex64 as DeepSeek-V2's rotary module makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half)))
    angles = torch.arange(offset, offset + seq, dtype=torch.float)[:, None] * inv[None, :]
    return torch.polar(torch.ones_like(angles), angles)[None]


def _inputs(T: int, H: int = 3, nope: int = 8, rope: int = 8, R: int = 24, dtype=torch.float16):
    """Views of a fused projection's output as the attention makes them: q [T, H, nope +
    rope] and the compressed [T, R + rope] side by side in one row."""
    width = H * (nope + rope) + R + rope
    fused = (2 * torch.randn(T, width)).to(dtype)
    q = fused[:, : H * (nope + rope)].view(T, H, nope + rope)
    compressed = fused[:, H * (nope + rope) :]
    weight = (1 + 0.1 * torch.randn(R)).to(dtype)
    return q[..., nope:], compressed[:, :R], compressed[:, R:], weight


def _caches(S: int, R: int = 24, rope: int = 8, dtype=torch.float16):
    return torch.full((S, R), 7.0, dtype=dtype), torch.full((S, rope), 7.0, dtype=dtype)


def test_the_reference_is_transformers_norm_rotary_and_cache_writes(seed):
    T, S, start = 3, 10, 4
    q_pe, kv_nope, k_pe, weight = _inputs(T)
    freqs = _freqs(T, 4, offset=start)
    latent_cache, rope_cache = _caches(S)
    out = sk.mla_prologue_reference(
        q_pe, kv_nope, k_pe, weight, 1e-6, freqs, latent_cache, rope_cache, start
    )
    expected_q, expected_k = apply_rotary_emb(q_pe.transpose(0, 1)[None], k_pe[None, None], freqs)
    assert torch.equal(out, expected_q[0])
    assert torch.equal(rope_cache[start : start + T], expected_k[0, 0])
    assert torch.equal(
        latent_cache[start : start + T], sk.rms_norm_reference(kv_nope, weight, 1e-6)
    )
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[start : start + T] = False
    assert (latent_cache[untouched] == 7).all()
    assert (rope_cache[untouched] == 7).all()


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("positions", [False, True])
def test_matches_the_reference(seed, backend, T, positions):
    S = 12
    q_pe, kv_nope, k_pe, weight = _inputs(T)
    freqs = _freqs(T, 4, offset=3)
    rows = torch.randperm(S)[:T] if positions else 6
    caches, expected_caches = _caches(S), _caches(S)
    out = sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *caches, rows)
    expected = sk.mla_prologue_reference(
        q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *expected_caches, rows
    )
    assert out.shape == (3, T, 8)
    assert out.is_contiguous()
    assert out.dtype == torch.float16
    assert rel_err(out, expected) < 1e-3
    for cache, want in zip(caches, expected_caches, strict=True):
        assert rel_err(cache, want) < 1e-3
        assert torch.equal(cache == 7, want == 7)  # the same rows written, the others kept


def test_rows_are_batch_invariant(seed, triton_backend):
    """A token's outputs do not depend on the tokens launched with it."""
    T, S = 4, 8
    q_pe, kv_nope, k_pe, weight = _inputs(T)
    freqs = _freqs(T, 4)
    together = _caches(S)
    out = sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *together, 2)
    alone = _caches(S)
    outs = [
        sk.mla_prologue(
            q_pe[i : i + 1],
            kv_nope[i : i + 1],
            k_pe[i : i + 1],
            weight,
            1e-6,
            freqs[:, i : i + 1],
            *alone,
            2 + i,
        )
        for i in range(T)
    ]
    assert torch.equal(out, torch.cat(outs, dim=1))
    for a, b in zip(together, alone, strict=True):
        assert torch.equal(a, b)


def test_bad_inputs_name_the_value(seed):
    q_pe, kv_nope, k_pe, weight = _inputs(2)
    freqs = _freqs(2, 4)
    caches = _caches(4)
    with pytest.raises(ValueError, match=r"rows 3\.\.4 do not fit a cache of 4 rows"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *caches, 3)
    with pytest.raises(ValueError, match=r"rows must be a \[T\] = \[2\] int64 tensor"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *caches, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"norm_weight must be \[R\] = \[24\]"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight[:5], 1e-6, freqs, *caches, 0)
    with pytest.raises(ValueError, match=r"freqs_cis must be \[T, rope/2\] = \[2, 4\]"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, _freqs(3, 4), *caches, 0)
    with pytest.raises(TypeError, match="freqs_cis must be complex64"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs.real, *caches, 0)
    with pytest.raises(ValueError, match=r"caches must be \[S, R\] = \[S, 24\]"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, caches[1], caches[1], 0)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        sk.mla_prologue(q_pe, kv_nope, k_pe, weight, -1.0, freqs, *caches, 0)


def _absorb_inputs(T: int, H: int = 3, nope: int = 8, R: int = 24, dtype=torch.float16):
    """q_nope as a strided view of a query projection, W_UK as a view of kv_b_proj's weight
    (``[H * (nope + v), R]``, v = 5)."""
    q = (2 * torch.randn(T, H, nope + 8)).to(dtype)
    kv_b = (0.3 * torch.randn(H * (nope + 5), R)).to(dtype)
    return q[..., :nope], kv_b.view(H, nope + 5, R)[:, :nope]


@pytest.mark.parametrize("T", [1, 5])
def test_the_absorption_in_the_launch_matches_the_reference(seed, backend, T):
    S = 12
    q_pe, kv_nope, k_pe, weight = _inputs(T)
    q_nope, w_uk = _absorb_inputs(T)
    freqs = _freqs(T, 4, offset=3)
    caches, plain_caches = _caches(S), _caches(S)
    out, q_lat = sk.mla_prologue_absorb(
        q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *caches, 5, q_nope, w_uk
    )
    plain = sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *plain_caches, 5)
    assert torch.equal(out, plain)  # the prologue's own bits
    for cache, want in zip(caches, plain_caches, strict=True):
        assert torch.equal(cache, want)
    expected = torch.einsum("thk,hkr->htr", q_nope.double(), w_uk.double())
    assert q_lat.shape == (3, T, 24)
    assert q_lat.is_contiguous()
    assert q_lat.dtype == torch.float16
    assert rel_err(q_lat, expected) < 2e-3
    ref = sk.mla_prologue_absorb_reference(
        q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *_caches(S), 5, q_nope, w_uk
    )[1]
    assert rel_err(q_lat, ref) < 2e-3


def test_absorbed_rows_are_batch_invariant(seed, triton_backend):
    T, S = 5, 8
    q_pe, kv_nope, k_pe, weight = _inputs(T)
    q_nope, w_uk = _absorb_inputs(T)
    freqs = _freqs(T, 4)
    _, together = sk.mla_prologue_absorb(
        q_pe, kv_nope, k_pe, weight, 1e-6, freqs, *_caches(S), 2, q_nope, w_uk
    )
    for i in range(T):
        _, alone = sk.mla_prologue_absorb(
            q_pe[i : i + 1], kv_nope[i : i + 1], k_pe[i : i + 1], weight, 1e-6,
            freqs[:, i : i + 1], *_caches(S), 2 + i, q_nope[i : i + 1], w_uk,
        )  # fmt: skip
        assert torch.equal(alone[:, 0], together[:, i])


def test_bad_absorption_inputs_name_the_value(seed):
    q_pe, kv_nope, k_pe, weight = _inputs(2)
    q_nope, w_uk = _absorb_inputs(2)
    args = (q_pe, kv_nope, k_pe, weight, 1e-6, _freqs(2, 4), *_caches(4), 0)
    with pytest.raises(ValueError, match=r"q_nope must be \[T, H, nope\] = \[2, 3, nope\]"):
        sk.mla_prologue_absorb(*args, q_nope[:1], w_uk)
    with pytest.raises(ValueError, match=r"w_uk must be W_UK \[H, nope, R\] = \[3, 8, 24\]"):
        sk.mla_prologue_absorb(*args, q_nope, w_uk[:, :4])
    with pytest.raises(ValueError, match="unit stride along R"):
        sk.mla_prologue_absorb(*args, q_nope, w_uk.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(TypeError, match="w_uk must be a tensor of q_pe's dtype"):
        sk.mla_prologue_absorb(*args, q_nope, w_uk.float())

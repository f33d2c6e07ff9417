"""Absorbed MLA attention: the absorption is transformers' expanded attention in exact
arithmetic, the kernel matches its reference under every mask form, writes every output,
and a row's bits do not depend on the other rows, on a longer window or on row chunking."""

import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk
import specter_kernels.attention.mla_attention_triton as mla_triton
from kernel_helpers import rel_err

H, R, P, NOPE, V = 3, 32, 16, 24, 20


def _problem(T, L, dtype=torch.float16):
    q_lat = torch.randn(H, T, R).to(dtype)
    q_pe = torch.randn(H, T, P).to(dtype)
    c_kv = torch.randn(L, R).to(dtype)
    k_pe = torch.randn(L, P).to(dtype)
    return q_lat, q_pe, c_kv, k_pe


def _causal(T, L, positions=None):
    positions = torch.arange(L - T, L) if positions is None else positions
    return torch.arange(L)[None, :] <= positions[:, None]


def test_absorption_is_the_expanded_attention(seed):
    # transformers' DeepSeek-V2 attention: keys and values expanded from the latents by
    # kv_b_proj, SDPA over [k_nope | k_pe]; the absorbed form must give the same output.
    T, L = 4, 9
    w_kv_b = torch.randn(H, NOPE + V, R, dtype=torch.float64)
    w_uk, w_uv = w_kv_b[:, :NOPE], w_kv_b[:, NOPE:]
    q_nope = torch.randn(H, T, NOPE, dtype=torch.float64)
    q_pe = torch.randn(H, T, P, dtype=torch.float64)
    c_kv = torch.randn(L, R, dtype=torch.float64)
    k_pe = torch.randn(L, P, dtype=torch.float64)
    scale = 0.37
    mask = _causal(T, L)
    k_nope = torch.einsum("lr,hdr->hld", c_kv, w_uk)
    values = torch.einsum("lr,hvr->hlv", c_kv, w_uv)
    keys = torch.cat([k_nope, k_pe.expand(H, L, P)], dim=-1)
    queries = torch.cat([q_nope, q_pe], dim=-1)
    expected = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    q_lat = q_nope @ w_uk  # [H, T, R]
    o_lat = sk.mla_attention_reference(q_lat, q_pe, c_kv, k_pe, scale, mask)
    got = o_lat @ w_uv.transpose(1, 2)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize(("T", "L"), [(1, 150), (4, 70), (5, 5)])
def test_kernel_matches_reference(seed, poisoned, mask_kind, T, L):
    q_lat, q_pe, c_kv, k_pe = _problem(T, L)
    mask = None
    if mask_kind == "bool":
        mask = _causal(T, L) & (torch.rand(T, L) > 0.3)
        mask[:, 0] = True
    elif mask_kind == "additive":
        mask = torch.randn(T, L).half()
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.2, mask)
    ref = sk.mla_attention_reference(
        *(t.double() for t in (q_lat, q_pe, c_kv, k_pe)),
        0.2,
        None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
    )
    assert out.shape == (H, T, R)
    assert out.dtype == torch.float16
    assert rel_err(out, ref) < 5e-3


def test_a_row_without_visible_keys_gets_zeros(seed, poisoned):
    q_lat, q_pe, c_kv, k_pe = _problem(2, 40)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1] = False
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, mask)
    assert torch.equal(out[:, 1], torch.zeros(H, R, dtype=torch.float16))
    assert torch.isfinite(out).all()


CHUNK_BLOCKS = [8, 2]
"""The shipped merge block, and 2-chunk blocks (a 128-key window at 16-key chunks is then 4
blocks, a row's own window 2 or 3)."""


@pytest.mark.parametrize("split", [16, 32, 64])
@pytest.mark.parametrize("chunk_block", CHUNK_BLOCKS)
def test_rows_are_batch_invariant_across_windows(
    seed, triton_backend, monkeypatch, split, chunk_block
):
    # Five verified rows at positions 60..64 in a 128-key window, against each row alone
    # in the window plain decoding would use (just past its own position): the same bits,
    # at every key chunk and merge block.
    monkeypatch.setattr(mla_triton, "SPLIT", split)
    monkeypatch.setattr(mla_triton, "CHUNK_BLOCK", chunk_block)
    T, W = 5, 128
    q_lat, q_pe, c_kv, k_pe = _problem(T, W)
    positions = torch.arange(60, 65)
    together = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.25, _causal(T, W, positions))
    for i in range(T):
        window = int(positions[i]) + 1 + i  # a shorter window, not chunk-aligned
        alone = sk.mla_attention(
            q_lat[:, i : i + 1],
            q_pe[:, i : i + 1],
            c_kv[:window],
            k_pe[:window],
            0.25,
            _causal(1, window, positions[i : i + 1]),
        )
        assert torch.equal(alone[:, 0], together[:, i])


def test_row_chunks_do_not_change_bits(seed, triton_backend, monkeypatch):
    T, L = 6, 100
    q_lat, q_pe, c_kv, k_pe = _problem(T, L)
    whole = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3)
    monkeypatch.setattr(mla_triton, "PARTIAL_BYTES", 1)  # one row per launch
    assert torch.equal(sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3), whole)


@pytest.mark.parametrize("split", [16, 128])
@pytest.mark.parametrize("chunk_block", CHUNK_BLOCKS)
def test_every_key_chunk_matches_the_reference(
    seed, triton_backend, monkeypatch, split, chunk_block
):
    monkeypatch.setattr(mla_triton, "SPLIT", split)
    monkeypatch.setattr(mla_triton, "CHUNK_BLOCK", chunk_block)
    q_lat, q_pe, c_kv, k_pe = _problem(2, 150)
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.2)
    ref = sk.mla_attention_reference(*(t.double() for t in (q_lat, q_pe, c_kv, k_pe)), 0.2)
    assert rel_err(out, ref) < 5e-3


def test_strided_queries_and_broadcast_mask(seed, triton_backend):
    T, L = 3, 40
    q_lat, q_pe, c_kv, k_pe = _problem(T, L)
    mask = _causal(T, L)
    strided = torch.randn(T, H, R + 8).half()
    strided[..., :R] = q_lat.transpose(0, 1)
    view = strided[..., :R].transpose(0, 1)  # [H, T, R], not contiguous
    broadcast = mask[None, None].expand(1, 2, T, L)[0, 1]
    got = sk.mla_attention(view, q_pe, c_kv, k_pe, 0.3, broadcast)
    assert torch.equal(got, sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, mask))


def _w_uv(dtype=torch.float16):
    return (torch.randn(H, V, R) / R**0.5).to(dtype)


@pytest.mark.parametrize("mask_kind", ["none", "bool"])
@pytest.mark.parametrize(("T", "L"), [(1, 150), (11, 70), (5, 5)])
def test_value_projection_matches_the_reference(seed, poisoned, mask_kind, T, L):
    q_lat, q_pe, c_kv, k_pe = _problem(T, L)
    mask = None if mask_kind == "none" else _causal(T, L) & (torch.rand(T, L) > 0.3)
    if mask is not None:
        mask[:, 0] = True
    w_uv = _w_uv()
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.2, mask, w_uv=w_uv)
    ref = sk.mla_attention_reference(
        *(t.double() for t in (q_lat, q_pe, c_kv, k_pe)), 0.2, mask, w_uv=w_uv.double()
    )
    assert out.shape == (T, H, V)
    assert out.dtype == torch.float16
    assert rel_err(out, ref) < 5e-3


def test_the_reference_projection_is_the_rounded_output_times_w_uv(seed):
    q_lat, q_pe, c_kv, k_pe = _problem(4, 30)
    w_uv = _w_uv()
    o_lat = sk.mla_attention_reference(q_lat, q_pe, c_kv, k_pe, 0.3)
    out = sk.mla_attention_reference(q_lat, q_pe, c_kv, k_pe, 0.3, w_uv=w_uv)
    expected = (o_lat.float() @ w_uv.float().transpose(1, 2)).half().transpose(0, 1)
    assert torch.equal(out, expected)


def test_the_projection_is_close_to_a_separate_bmm(seed, triton_backend):
    # The fused projection against the kernel's own o_lat times W_UV in the invariant GEMM:
    # one rounding of the same products, summed in another order.
    q_lat, q_pe, c_kv, k_pe = _problem(3, 90)
    w_uv = _w_uv()
    o_lat = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3)
    apart = sk.invariant_bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1)
    fused = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, w_uv=w_uv)
    assert rel_err(fused, apart) < 2e-3


@pytest.mark.parametrize("split", [16, 64])
@pytest.mark.parametrize("chunk_block", CHUNK_BLOCKS)
def test_projected_rows_are_batch_invariant(seed, triton_backend, monkeypatch, split, chunk_block):
    monkeypatch.setattr(mla_triton, "SPLIT", split)
    monkeypatch.setattr(mla_triton, "CHUNK_BLOCK", chunk_block)
    monkeypatch.setattr(mla_triton, "PARALLEL_ROWS", 4)  # 9 rows: groups of PROJECT_ROWS
    T, W = 9, 128
    q_lat, q_pe, c_kv, k_pe = _problem(T, W)
    w_uv = _w_uv()
    positions = torch.arange(60, 60 + T)
    together = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.25, _causal(T, W, positions), w_uv)
    for i in (0, 7, 8):
        window = int(positions[i]) + 1 + i
        alone = sk.mla_attention(
            q_lat[:, i : i + 1], q_pe[:, i : i + 1], c_kv[:window], k_pe[:window], 0.25,
            _causal(1, window, positions[i : i + 1]), w_uv,
        )  # fmt: skip
        assert torch.equal(alone[0], together[i])


def test_projected_row_chunks_and_row_groups_do_not_change_bits(seed, triton_backend, monkeypatch):
    T, L = 6, 100
    q_lat, q_pe, c_kv, k_pe = _problem(T, L)
    w_uv = torch.randn(H, 2 * V, R).half()[:, ::2]  # strided along V
    whole = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, w_uv=w_uv)
    monkeypatch.setattr(mla_triton, "PARTIAL_BYTES", 1)  # one row per launch
    assert torch.equal(sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, w_uv=w_uv), whole)
    monkeypatch.setattr(mla_triton, "PARALLEL_ROWS", 2)  # rows in groups of PROJECT_ROWS
    monkeypatch.setattr(mla_triton, "PROJECT_ROWS", 4)
    monkeypatch.setattr(mla_triton, "BLOCK_V", 8)
    assert torch.equal(sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.3, w_uv=w_uv), whole)


@pytest.mark.parametrize(
    ("w_uv", "error", "match"),
    [
        (torch.randn(H, V, R + 1), ValueError, r"W_UV \[H, V, R\]"),
        (torch.randn(H + 1, V, R), ValueError, r"W_UV \[H, V, R\]"),
        (torch.randn(H, V, R).double(), TypeError, "w_uv must have q_lat's dtype"),
        ("weights", TypeError, "w_uv must be None or a tensor"),
    ],
)
def test_bad_value_projections(w_uv, error, match):
    q_lat, q_pe, c_kv, k_pe = _problem(2, 8, torch.float32)
    with pytest.raises(error, match=match):
        sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 1.0, w_uv=w_uv)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"q_pe": torch.randn(H, 2, P + 1)}, ValueError, "shapes do not fit"),
        ({"c_kv": torch.randn(9, R)}, ValueError, "shapes do not fit"),
        ({"q_lat": torch.randn(2, R)}, ValueError, r"q_lat \[H, T, R\]"),
        ({"k_pe": torch.randn(8, P).double()}, TypeError, "one floating dtype"),
        ({"mask": torch.ones(3, 8, dtype=torch.bool)}, ValueError, r"\[T, L\] = \[2, 8\]"),
        ({"c_kv": "latents"}, TypeError, "c_kv must be a tensor"),
    ],
)
def test_bad_arguments(change, error, match):
    args = {
        "q_lat": torch.randn(H, 2, R),
        "q_pe": torch.randn(H, 2, P),
        "c_kv": torch.randn(8, R),
        "k_pe": torch.randn(8, P),
        "mask": None,
    }
    args.update(change)
    with pytest.raises(error, match=match):
        sk.mla_attention(args["q_lat"], args["q_pe"], args["c_kv"], args["k_pe"], 1.0, args["mask"])

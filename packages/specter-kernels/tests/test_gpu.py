"""On a CUDA device: the Triton kernels at real expert shapes against the references.

Skipped without a GPU (CPU runs cover the same code through the interpreter).
"""

import pytest
import torch

import specter_kernels as sk

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize(("H", "I", "E", "k"), [(2048, 1408, 64, 6), (4096, 6400, 16, 2)])
@pytest.mark.parametrize("T", [1, 5, 33, 300])
def test_fused_w4a16_on_the_gpu(seed, monkeypatch, H, I, E, k, T):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    x = torch.randn(T, H, device="cuda").half()
    ids = torch.topk(torch.randn(T, E, device="cuda"), k).indices
    weights = torch.rand(T, k, device="cuda")
    w13 = sk.quantize_int4(torch.randn(E, 2 * I, H, device="cuda") * 0.02, 128)
    w2 = sk.quantize_int4(torch.randn(E, H, I, device="cuda") * 0.02, 128)
    ref = sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)
    for path in ("gemv", "tile"):
        assert _rel_err(sk.fused_moe_w4a16(x, ids, weights, w13, w2, path=path), ref) < 2e-3


@pytest.mark.parametrize("T", [1, 5, 300])
def test_fused_w4a16_skips_pairs_on_the_gpu(seed, monkeypatch, T):
    # A hot-set draft: pairs of pinned experts are -1 and must add nothing, on both paths.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    H, I, E, k = 2048, 1408, 64, 6
    x = torch.randn(T, H, device="cuda").half()
    ids = torch.topk(torch.randn(T, E, device="cuda"), k).indices
    weights = torch.rand(T, k, device="cuda")
    w13 = sk.quantize_int4(torch.randn(E, 2 * I, H, device="cuda") * 0.02, 128)
    w2 = sk.quantize_int4(torch.randn(E, H, I, device="cuda") * 0.02, 128)
    skipped = torch.where(torch.rand(T, k, device="cuda") < 0.5, -1, ids)
    skipped[-1, 0] = ids[-1, 0]  # some pair is computed (a zero reference has no rel. error)
    if T > 1:
        skipped[0] = -1  # a token with every pair skipped gets a row of zeros
    ref = sk.fused_moe_w4a16_reference(x, ids, weights * (skipped >= 0), w13, w2)
    for path in ("gemv", "tile"):
        out = sk.fused_moe_w4a16(x, skipped, weights, w13, w2, path=path)
        assert _rel_err(out, ref) < 2e-3
        if T > 1:
            assert torch.equal(out[0], torch.zeros_like(out[0]))


@pytest.mark.parametrize("T", [1, 17])
def test_grouped_fp16_waves_on_the_gpu(seed, T):
    H, I, E, k, S = 2048, 1408, 64, 6, 64
    x = torch.randn(T, H, device="cuda").half()
    ids = torch.topk(torch.randn(T, E, device="cuda"), k).indices
    weights = torch.rand(T, k, device="cuda")
    w13 = (torch.randn(S, 2 * I, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(S, H, I, device="cuda") * 0.02).half()
    slot_of = torch.randperm(S, device="cuda").int()
    resident = torch.rand(E, device="cuda") < 0.5
    out = torch.zeros(T, H, device="cuda")
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, resident, out)
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, ~resident, out)
    everything = torch.ones(E, dtype=torch.bool, device="cuda")
    ref = sk.grouped_moe_fp16_reference(
        x, ids, weights, w13, w2, slot_of, everything, torch.zeros(T, H, device="cuda")
    )
    assert _rel_err(out, ref) < 2e-3


@pytest.mark.parametrize("S", [1, 5, 300])
def test_rotary_complex_on_the_gpu(seed, monkeypatch, S):
    # DeepSeek-V2-Lite's shapes: 16 heads, a 64-wide rope slice of a 192-wide query head.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    q = torch.randn(1, S, 16, 192, device="cuda").half().transpose(1, 2)
    q_pe = q[..., 128:]
    angles = torch.rand(1, S, 32, device="cuda") * 100
    freqs = torch.polar(torch.ones_like(angles), angles)
    out = sk.rotary_complex(q_pe, freqs)
    ref = sk.rotary_complex_reference(q_pe, freqs)
    assert out.shape == ref.shape
    assert _rel_err(out, ref) < 1e-3
    assert (out.float() - ref.float()).abs().max() <= 2e-3 * ref.float().abs().max()


@pytest.mark.parametrize("S", [1, 5, 300])
def test_rotary_half_on_the_gpu_equals_torch(seed, monkeypatch, S):
    # Qwen1.5-MoE's shapes: 16 heads of 128; torch's roundings, so the same bits.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    q = torch.randn(1, S, 16, 128, device="cuda").half().transpose(1, 2)
    angles = torch.rand(1, S, 64, device="cuda") * 100
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().half(), emb.sin().half()
    assert torch.equal(sk.rotary_half(q, cos, sin), sk.rotary_half_reference(q, cos, sin))

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


@pytest.mark.parametrize("pair_blocks", [None, True])
@pytest.mark.parametrize("T", [1, 17])
def test_grouped_fp16_waves_on_the_gpu(seed, T, pair_blocks):
    H, I, E, k, S = 2048, 1408, 64, 6, 64
    x = torch.randn(T, H, device="cuda").half()
    ids = torch.topk(torch.randn(T, E, device="cuda"), k).indices
    weights = torch.rand(T, k, device="cuda")
    w13 = (torch.randn(S, 2 * I, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(S, H, I, device="cuda") * 0.02).half()
    slot_of = torch.randperm(S, device="cuda").int()
    resident = torch.rand(E, device="cuda") < 0.5
    out = torch.zeros(T, H, device="cuda")
    pairs = {}
    for blocks in (False, True):
        pairs[blocks] = torch.zeros(T, k, H, device="cuda")
        for mask in (resident, ~resident):
            sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask, out, pair_blocks)
            sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask, pairs[blocks], blocks)
    assert torch.equal(pairs[True], pairs[False])  # per pair, the same bits either way
    everything = torch.ones(E, dtype=torch.bool, device="cuda")
    ref = sk.grouped_moe_fp16_reference(
        x, ids, weights, w13, w2, slot_of, everything, torch.zeros(T, H, device="cuda")
    )
    assert _rel_err(out / 2, ref) < 2e-3  # each mask ran twice into out


def _streamed_problem(T):
    """DeepSeek-V2-Lite-sized routing of T rows over 16 experts kept in pinned host memory:
    ``(x, ids, weights, w13, w2, streamed)``."""
    H, I, E, k = 2048, 1408, 16, 6
    x = torch.randn(T, H, device="cuda").half()
    ids = torch.topk(torch.randn(T, E, device="cuda"), k).indices
    weights = torch.rand(T, k, device="cuda")
    w13 = (torch.randn(E, 2 * I, H) * 0.02).half().pin_memory()
    w2 = (torch.randn(E, H, I) * 0.02).half().pin_memory()
    streamed = sk.StreamedExperts.from_tensors(list(w13), list(w2), "cuda")
    return x, ids, weights, w13, w2, streamed


@pytest.mark.parametrize("pair_blocks", [None, True])
@pytest.mark.parametrize("T", [1, 6])
def test_streamed_experts_from_pinned_memory_on_the_gpu(seed, T, pair_blocks):
    # Missing experts read in place from pinned host memory: the bits of slots, flagged.
    x, ids, weights, w13, w2, streamed = _streamed_problem(T)
    E, H, k = w13.shape[0], x.shape[1], ids.shape[1]
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    all_slots = torch.arange(E, device="cuda", dtype=torch.int32)
    expected = torch.zeros(T, k, H, device="cuda")
    sk.grouped_moe_fp16(
        x, ids, weights, w13.cuda(), w2.cuda(), all_slots, every, expected, pair_blocks
    )  # fmt: skip
    resident = torch.arange(E) % 3 == 0
    slot_of = torch.where(resident, torch.arange(E) // 3, -1).int().cuda()
    slots13 = w13[resident].cuda()
    slots2 = w2[resident].cuda()
    flags = torch.zeros(2, E, dtype=torch.uint8, device="cuda")
    out = torch.zeros(T, k, H, device="cuda")
    sk.grouped_moe_fp16(
        x, ids, weights, slots13, slots2, slot_of, every, out, pair_blocks, streamed, flags
    )  # fmt: skip
    assert torch.equal(out, expected)
    routed = torch.zeros(E, dtype=torch.bool, device="cuda")
    routed[ids.reshape(-1)] = True
    missing = routed & (slot_of < 0)
    assert torch.equal(flags.bool(), missing.expand(2, E))


@pytest.mark.parametrize("T", [1, 6, 40])
def test_streamed_fills_on_the_gpu(seed, T):
    # Streamed experts also written into spare slots: whole, same output bits, graphable.
    x, ids, weights, w13, w2, streamed = _streamed_problem(T)
    E, H, k, I = w13.shape[0], x.shape[1], ids.shape[1], w2.shape[2]
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    resident = torch.arange(E) % 4 == 0
    slot_of = torch.where(resident, torch.arange(E) // 4, -1).int().cuda()
    spares = 6
    slots13 = torch.cat([w13[resident], torch.full((spares, 2 * I, H), float("nan")).half()])
    slots2 = torch.cat([w2[resident], torch.full((spares, H, I), float("nan")).half()])
    slots13, slots2 = slots13.cuda(), slots2.cuda()
    spare_ids = torch.arange(4, 4 + spares, dtype=torch.int32, device="cuda")
    holders = torch.full((spares,), -1, dtype=torch.int32, device="cuda")
    plain = torch.zeros(T, k, H, device="cuda")
    sk.grouped_moe_fp16(x, ids, weights, slots13, slots2, slot_of, every, plain, None, streamed)
    fill = torch.empty(E, dtype=torch.int32, device="cuda")
    out = torch.zeros(T, k, H, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sk.assign_fill_slots(ids, slot_of, spare_ids, holders, slot_of.clone(), fill)
        sk.grouped_moe_fp16(
            x, ids, weights, slots13, slots2, slot_of, every, out, None, streamed, None, fill
        )  # fmt: skip
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)
    expected_fill = sk.assign_fill_slots_reference(
        ids, slot_of, spare_ids, holders, slot_of.clone()
    )
    assert torch.equal(fill, expected_fill)
    filled = [(e, s) for e, s in enumerate(fill.tolist()) if s >= 0]
    assert filled
    for e, s in filled:
        assert torch.equal(slots13[s].cpu(), w13[e])
        assert torch.equal(slots2[s].cpu(), w2[e])


@pytest.mark.parametrize(("T", "num_slots"), [(1, 2), (7, 4), (7, 16)])
def test_staged_streaming_on_the_gpu(seed, T, num_slots):
    # Missing experts staged from pinned memory into a device buffer, in one graph with the
    # GEMM: the staged ones hold their experts whole, the output has the bits of slots and
    # every missing expert is flagged.
    x, ids, weights, w13, w2, streamed = _streamed_problem(T)
    E, H, k, I = w13.shape[0], x.shape[1], ids.shape[1], w2.shape[2]
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    resident = torch.arange(E) % 4 == 0
    slot_of = torch.where(resident, torch.arange(E) // 4, -1).int().cuda()
    slots13, slots2 = w13[resident].cuda(), w2[resident].cuda()
    plain = torch.zeros(T, k, H, device="cuda")
    sk.grouped_moe_fp16(x, ids, weights, slots13, slots2, slot_of, every, plain, None, streamed)
    staging = sk.StagingBuffer.allocate(num_slots, E, H, I, "cuda")
    staging.weights.fill_(float("nan"))
    flags = torch.zeros(2, E, dtype=torch.uint8, device="cuda")
    out = torch.zeros(T, k, H, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        view = sk.stage_streamed(ids, slot_of, every, streamed, staging)
        sk.grouped_moe_fp16(
            x, ids, weights, slots13, slots2, slot_of, every, out, None, view, flags
        )  # fmt: skip
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)
    routed = torch.zeros(E, dtype=torch.bool, device="cuda")
    routed[ids.reshape(-1)] = True
    missing = (routed & (slot_of < 0)).nonzero().flatten().tolist()
    assert torch.equal(
        flags.bool().cpu(), torch.isin(torch.arange(E), torch.tensor(missing)).expand(2, E)
    )
    want = (missing + [-1] * num_slots)[:num_slots]
    assert staging.staged_experts.tolist() == want
    for slot, expert in enumerate(want):
        if expert >= 0:
            gate_up, down = staging.slot_weights(slot)
            assert torch.equal(gate_up.cpu(), w13[expert])
            assert torch.equal(down.cpu(), w2[expert])


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


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 300])
def test_sum_routed_pairs_on_the_gpu_equals_torch(seed, monkeypatch, dtype, T):
    # DeepSeek-V2-Lite's per-pair output [T, 6, 2048], magnitudes spread so that another
    # add order or a second rounding would change bits.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    scale = torch.logspace(-3, 3, 6, device="cuda")[None, :, None]
    out = torch.randn(T, 6, 2048, device="cuda") * scale
    assert torch.equal(sk.sum_routed_pairs(out, dtype), sk.sum_routed_pairs_reference(out, dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 300])
def test_residual_add_routed_pairs_on_the_gpu_equals_torch(seed, monkeypatch, dtype, T):
    # DeepSeek-V2-Lite's join: pairs [T, 6, 2048], a residual stream and a shared output.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    pairs = (
        torch.randn(T, 6, 2048, device="cuda")
        * torch.logspace(-3, 3, 6, device="cuda")[None, :, None]
    )
    residual = (torch.randn(T, 2048, device="cuda") * 30).to(dtype)
    shared = (torch.randn(T, 2048, device="cuda") * 0.01).to(dtype)
    got = sk.residual_add_routed_pairs(residual, pairs, shared)
    assert torch.equal(got, sk.residual_add_routed_pairs_reference(residual, pairs, shared))
    assert torch.equal(got, sk.residual_add(residual, sk.sum_routed_pairs(pairs, dtype), shared))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_silu_and_mul_on_the_gpu_equals_torch(seed, monkeypatch, dtype):
    # DeepSeek-V2-Lite's gate_up output at five rows ([5, 2 * 1408]), then every 16-bit
    # gate (half dtypes) or 2^20 random ones: CUDA's expf and IEEE division, torch's bits.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    x = (3 * torch.randn(5, 2 * 1408, device="cuda")).to(dtype)
    assert torch.equal(sk.silu_and_mul(x), sk.silu_and_mul_reference(x))
    if dtype == torch.float32:
        gate = 20 * torch.randn(1024, 1024, device="cuda")
    else:
        bits = torch.arange(-(2**15), 2**15, device="cuda", dtype=torch.int32).to(torch.int16)
        gate = bits.view(dtype).reshape(64, 1024)
        gate = torch.where(gate.isnan(), torch.zeros_like(gate), gate)
    x = torch.cat([gate, (3 * torch.randn_like(gate.float())).to(dtype)], dim=-1)
    out, expected = sk.silu_and_mul(x), sk.silu_and_mul_reference(x)
    as_int = torch.int32 if dtype == torch.float32 else torch.int16
    same = (out.view(as_int) == expected.view(as_int)) | (out.isnan() & expected.isnan())
    assert bool(same.all()), (x[..., :1024][~same][:8], out[~same][:8], expected[~same][:8])


@pytest.mark.parametrize(
    ("E", "H", "k", "logits_dtype"),
    [(64, 2048, 6, torch.float32), (60, 2048, 4, torch.float16), (160, 5120, 6, torch.float32)],
)
@pytest.mark.parametrize("T", [1, 5, 300])
def test_router_topk_on_the_gpu(seed, monkeypatch, E, H, k, logits_dtype, T):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    x = torch.randn(T, H, device="cuda").half()
    weight = (0.02 * torch.randn(E, H, device="cuda")).half()
    logits, weights, ids = sk.router_topk(x, weight, k, logits_dtype=logits_dtype, scaling=1.5)
    ref_logits, ref_weights, ref_ids = sk.router_topk_reference(
        x.double(), weight.double(), k, logits_dtype=torch.float64, scaling=1.5,
        weights_dtype=torch.float64,
    )  # fmt: skip
    tol = 1e-2 if logits_dtype == torch.float16 else 1e-4
    torch.testing.assert_close(logits.double(), ref_logits, atol=tol, rtol=tol)
    # Rows whose k-th and (k+1)-th probabilities nearly tie may pick either expert.
    probs = ref_logits.softmax(-1).sort(-1, descending=True).values
    clear = (probs[:, k - 1] - probs[:, k]) > 1e-3 * probs[:, k - 1]
    assert clear.float().mean() > 0.5
    assert torch.equal(ids[clear].sort(-1).values, ref_ids[clear].sort(-1).values)
    torch.testing.assert_close(
        weights.double()[clear].sort(-1).values,
        ref_weights[clear].sort(-1).values,
        atol=tol,
        rtol=tol,
    )
    alone = sk.router_topk(x[-1:], weight, k, logits_dtype=logits_dtype, scaling=1.5)
    assert torch.equal(alone[2][0], ids[-1])  # batch-invariant rows
    assert torch.equal(alone[1][0], weights[-1])


@pytest.mark.parametrize(("E", "k", "renormalize"), [(64, 6, False), (60, 4, True)])
def test_router_in_one_launch_on_the_gpu(seed, monkeypatch, E, k, renormalize):
    # DeepSeek-V2-Lite's and Qwen1.5-MoE's routers: the selection in the logits launch gives
    # the reference's ids, 200 launches and 20 graph replays give the same bits, and the row
    # counters stay zero.
    from specter_kernels.invariant import matmul_triton as invariant_matmul_triton

    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    x = torch.randn(5, 2048, device="cuda").half()
    weight = (0.02 * torch.randn(E, 2048, device="cuda")).half()
    kwargs = {"renormalize": renormalize, "scaling": 1.5}
    one = sk.router_topk(x, weight, k, **kwargs)
    ref = sk.router_topk_reference(x, weight, k, **kwargs)
    assert torch.equal(one[2], ref[2])
    torch.testing.assert_close(one[1], ref[1], rtol=1e-3, atol=1e-3)
    for _ in range(200):
        again = sk.router_topk(x, weight, k, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(again, one, strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sk.router_topk(x, weight, k, **kwargs)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, one, strict=True))
    counters = invariant_matmul_triton.tile_counters(x.device, 5)
    assert int(counters.count_nonzero()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("R", "V"), [(1, 102400), (5, 151936), (3, 32064), (2, 300)])
def test_argmax_on_the_gpu_equals_torch(seed, monkeypatch, dtype, R, V):
    # The three models' vocabularies and a one-program row: torch.argmax's index, ties to the
    # first (peaks planted in several programs' stretches), NaN the largest; 50 launches
    # and 10 graph replays the same, the counters left zero.
    from specter_kernels.invariant import matmul_triton as invariant_matmul_triton

    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    x = torch.randn(R, V, device="cuda").to(dtype)
    assert torch.equal(sk.argmax_last_dim(x), x.argmax(dim=-1))
    x[0, [V // 3, V // 2, V - 1]] = 1000.0
    if R > 1:
        x[1, [V - 5, 7]] = float("nan")
    want = x.argmax(dim=-1)
    assert want[0] == V // 3
    for _ in range(50):
        assert torch.equal(sk.argmax_last_dim(x), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sk.argmax_last_dim(x)
    for _ in range(10):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want)
    assert int(invariant_matmul_triton.tile_counters(x.device, R).count_nonzero()) == 0


def _mla_problem(T: int, L: int):
    """DeepSeek-V2-Lite's MLA at ``T`` rows over ``L`` keys (16 heads, kv_lora_rank 512, rope
    dim 64): ``(q_lat, q_pe, c_kv, k_pe, causal mask [T, L])`` on the GPU."""
    q_lat = torch.randn(16, T, 512, device="cuda").half()
    q_pe = torch.randn(16, T, 64, device="cuda").half()
    c_kv = torch.randn(L, 512, device="cuda").half()
    k_pe = torch.randn(L, 64, device="cuda").half()
    positions = torch.arange(L - T, L, device="cuda")
    mask = torch.arange(L, device="cuda")[None, :] <= positions[:, None]
    return q_lat, q_pe, c_kv, k_pe, mask


@pytest.mark.parametrize(("T", "L"), [(1, 768), (5, 512), (300, 300)])
def test_mla_attention_on_the_gpu(seed, monkeypatch, T, L):
    # DeepSeek-V2-Lite: 16 heads, kv_lora_rank 512, rope dim 64.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    q_lat, q_pe, c_kv, k_pe, mask = _mla_problem(T, L)
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.05, mask)
    ref = sk.mla_attention_reference(
        q_lat.double(), q_pe.double(), c_kv.double(), k_pe.double(), 0.05, mask
    )
    assert _rel_err(out, ref) < 5e-3
    last = L - T + 1  # the first row alone, in the shortest window that holds it
    alone = sk.mla_attention(
        q_lat[:, :1], q_pe[:, :1], c_kv[:last], k_pe[:last], 0.05, mask[:1, :last]
    )
    assert torch.equal(alone[:, 0], out[:, 0])


@pytest.mark.parametrize(("T", "L"), [(1, 768), (5, 512), (300, 300)])
def test_mla_value_projection_on_the_gpu(seed, monkeypatch, T, L):
    # DeepSeek-V2-Lite's W_UV [16, 128, 512], a view of kv_b_proj's weight: the fused
    # projection is close to the reference and to a separate invariant bmm, and a row's bits
    # do not depend on the rows beside it or on the window.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    q_lat, q_pe, c_kv, k_pe, mask = _mla_problem(T, L)
    w_uv = (0.03 * torch.randn(16, 256, 512, device="cuda")).half()[:, 128:]
    out = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.05, mask, w_uv)
    ref = sk.mla_attention_reference(
        q_lat.double(), q_pe.double(), c_kv.double(), k_pe.double(), 0.05, mask, w_uv.double()
    )
    assert out.shape == (T, 16, 128)
    assert _rel_err(out, ref) < 5e-3
    o_lat = sk.mla_attention(q_lat, q_pe, c_kv, k_pe, 0.05, mask)
    apart = sk.invariant_bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1)
    assert _rel_err(out, apart) < 2e-3
    last = L - T + 1
    alone = sk.mla_attention(
        q_lat[:, :1], q_pe[:, :1], c_kv[:last], k_pe[:last], 0.05, mask[:1, :last], w_uv
    )
    assert torch.equal(alone[0], out[0])


def test_split_launches_on_two_streams_use_their_own_counters(seed, monkeypatch):
    # The shared experts run on a side stream beside the routed ones: split-K launches of
    # the two streams must not draw tickets from one counter (a tile would finish with
    # another stream's partials, or never): the side stream's take their own.
    from specter_kernels.invariant import matmul_triton as kernel
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    config = MatmulConfig(BLOCK_M, 32, 128, split_k=4)
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    main_counters = kernel.tile_counters(device, 1)
    side_counters = kernel.split_counters(device)
    with kernel.counters_in(side_counters):
        assert kernel.tile_counters(device, 1) is side_counters
    a = [torch.randn(1, 4, 2048, device="cuda").half() for _ in range(2)]
    b = [torch.randn(1, 2048, 3072, device="cuda").half() * 0.02 for _ in range(2)]
    alone = [
        kernel.launch_invariant_bmm(
            x, w, torch.empty(1, 4, 3072, device="cuda").half(), None, config
        )
        for x, w in zip(a, b, strict=True)
    ]
    for _ in range(20):  # both streams' launches in flight together
        side.wait_stream(torch.cuda.current_stream())
        outs = [None, None]
        with torch.cuda.stream(side), kernel.counters_in(side_counters):
            outs[1] = kernel.launch_invariant_bmm(
                a[1], b[1], torch.empty(1, 4, 3072, device="cuda").half(), None, config
            )
        outs[0] = kernel.launch_invariant_bmm(
            a[0], b[0], torch.empty(1, 4, 3072, device="cuda").half(), None, config
        )
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(outs[0], alone[0])
        assert torch.equal(outs[1], alone[1])
    assert int(main_counters.count_nonzero()) == 0
    assert int(side_counters.count_nonzero()) == 0


@pytest.mark.parametrize("T", [1, 5, 200])
@pytest.mark.parametrize("positions", [False, True])
def test_mla_prologue_gives_the_bits_of_its_parts_on_the_gpu(seed, monkeypatch, T, positions):
    """DeepSeek-V2-Lite's sizes: the one-launch prologue writes the bits ``rms_norm``,
    ``rotary_complex`` and two cache copies write, and returns the same rotated queries."""
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    H, nope, rope, R, S = 16, 128, 64, 512, 512
    fused = (2 * torch.randn(T, H * (nope + rope) + R + rope, device="cuda")).half()
    q = fused[:, : H * (nope + rope)].view(T, H, nope + rope)
    q_pe, kv_nope, k_pe = q[..., nope:], fused[:, -R - rope : -rope], fused[:, -rope:]
    weight = (1 + 0.1 * torch.randn(R, device="cuda")).half()
    angles = torch.arange(40, 40 + T, device="cuda")[:, None] * torch.rand(rope // 2, device="cuda")
    freqs = torch.polar(torch.ones_like(angles), angles)[None]
    rows = torch.randperm(S, device="cuda")[:T] if positions else 100
    index = rows if positions else torch.arange(100, 100 + T, device="cuda")
    latent, key = (
        torch.zeros(S, R, device="cuda").half(),
        torch.zeros(S, rope, device="cuda").half(),
    )
    out = sk.mla_prologue(q_pe, kv_nope, k_pe, weight, 1e-6, freqs, latent, key, rows)
    parts = {
        "queries": (out, sk.rotary_complex(q_pe.transpose(0, 1)[None], freqs)[0]),
        "latents": (latent[index], sk.rms_norm(kv_nope, weight, 1e-6)),
        "keys": (key[index], sk.rotary_complex(k_pe[None, None], freqs)[0, 0]),
    }
    differ = {name: int((a != b).sum()) for name, (a, b) in parts.items()}
    assert differ == {"queries": 0, "latents": 0, "keys": 0}
    assert int((latent.abs().sum(1) != 0).sum()) == T  # no other row written


@pytest.mark.parametrize("T", [1, 5, 200])
def test_fused_residual_adds_give_the_bits_of_their_parts_on_the_gpu(seed, monkeypatch, T):
    """DeepSeek-V2-Lite's hidden size: ``add_rms_norm`` gives the bits of torch's add and
    ``rms_norm``, ``residual_add`` those of the two torch adds, rows alone as together."""
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    N = 2048
    x, residual, shared = ((4 * torch.randn(1, T, N, device="cuda")).half() for _ in range(3))
    weight = (1 + 0.1 * torch.randn(N, device="cuda")).half()
    summed, normed = sk.add_rms_norm(x, residual, weight, 1e-6)
    assert int((summed != residual + x).sum()) == 0
    assert int((normed != sk.rms_norm(residual + x, weight, 1e-6)).sum()) == 0
    assert int((sk.residual_add(residual, x, shared) != residual + (x + shared)).sum()) == 0
    alone = torch.cat([sk.add_rms_norm(x[:, i : i + 1], residual[:, i : i + 1], weight, 1e-6)[1]
                       for i in range(T)], dim=1)  # fmt: skip
    assert torch.equal(alone, normed)


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.parametrize("k", [6, 4])
def test_join_and_next_norm_give_the_bits_of_their_parts_on_the_gpu(seed, monkeypatch, T, k):
    """DeepSeek-V2-Lite's and Qwen1.5-MoE's hidden size and top-k: the MoE join with the next
    RMSNorm gives the bits of the join and of ``rms_norm`` on its sum (pairs and tensor),
    rows alone as together."""
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    N = 2048
    residual, routed, shared = ((4 * torch.randn(T, N, device="cuda")).half() for _ in range(3))
    pairs = torch.randn(T, k, N, device="cuda")
    weight = (1 + 0.1 * torch.randn(N, device="cuda")).half()
    summed, normed = sk.residual_add_routed_pairs_rms_norm(residual, pairs, shared, weight, 1e-6)
    assert torch.equal(summed, sk.residual_add_routed_pairs(residual, pairs, shared))
    assert torch.equal(normed, sk.rms_norm(summed, weight, 1e-6))
    summed, normed = sk.residual_add_rms_norm(residual, routed, shared, weight, 1e-6)
    assert torch.equal(summed, sk.residual_add(residual, routed, shared))
    assert torch.equal(normed, sk.rms_norm(summed, weight, 1e-6))
    alone = torch.cat([sk.residual_add_routed_pairs_rms_norm(
        residual[i : i + 1], pairs[i : i + 1], shared[i : i + 1], weight, 1e-6)[1]
        for i in range(T)])  # fmt: skip
    assert torch.equal(alone, sk.residual_add_routed_pairs_rms_norm(
        residual, pairs, shared, weight, 1e-6)[1])  # fmt: skip


@pytest.mark.parametrize("n", [6, 12, 2094])
def test_observe_and_publish_on_the_gpu_writes_the_pinned_row_inside_a_graph(n):
    # The count equals index_add_'s, the stamped row reaches pinned host memory through its
    # address, and a captured graph does both on each replay.
    counts = torch.randint(0, 4, (64,), dtype=torch.int32, device="cuda")
    host = torch.zeros(64, dtype=torch.int32, pin_memory=True)
    address = torch.tensor(host.data_ptr(), dtype=torch.int64, device="cuda")
    stamp = torch.tensor(5 << 20, dtype=torch.int32, device="cuda")
    ids = torch.randint(0, 64, (n,), device="cuda")
    expected = counts.clone().index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    sk.observe_and_publish(counts, ids, stamp, address, host)
    torch.cuda.synchronize()
    assert torch.equal(counts, expected)
    assert torch.equal(host, (expected + stamp).cpu())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sk.observe_and_publish(counts, ids, stamp, address, host)
    stamp.fill_(6 << 20)
    graph.replay()
    torch.cuda.synchronize()
    twice = expected.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    assert torch.equal(counts, twice)
    assert torch.equal(host, (twice + (6 << 20)).cpu())

"""On a CUDA device: bitwise batch invariance of the invariant kernels and mode at real shapes.

A 512-row prefill is computed once; its first m rows must equal, bit for bit,
the same call on m rows for every m in 1..33 (verification sizes). Skipped
without a GPU.
"""

import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PREFILL = 512
ROW_COUNTS = range(1, 34)


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")


def _rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


def _assert_prefix_invariant(fn, x, dim=0):
    full = fn(x)
    for m in ROW_COUNTS:
        part = fn(x.narrow(dim, 0, m))
        assert torch.equal(full.narrow(dim, 0, m), part), f"rows differ at m={m}"
    return full


@pytest.mark.parametrize(("N", "K"), [(2048, 2048), (3072, 2048), (102400, 2048), (64, 2048)])
def test_linear_fp16_is_invariant_and_close_to_cublas(seed, N, K):
    x = torch.randn(PREFILL, K, device="cuda").half()
    w = (torch.randn(N, K, device="cuda") * 0.02).half()
    full = _assert_prefix_invariant(lambda rows: sk.invariant_linear(rows, w), x)
    assert _rel_err(full, F.linear(x.float(), w.float())) < 2e-3


@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize(
    ("N", "K", "dtype"), [(576, 2048, torch.float16), (64, 2048, torch.float32)]
)
def test_split_k_linear_is_invariant_and_close_to_torch(seed, N, K, dtype, split):
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig
    from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

    config = MatmulConfig(BLOCK_M, 16, 64 if dtype == torch.float32 else 256, split_k=split)
    x = torch.randn(PREFILL, K, device="cuda").to(dtype)
    w = (torch.randn(N, K, device="cuda") * 0.02).to(dtype)
    bias = torch.randn(N, device="cuda").to(dtype)

    def linear(rows):
        out = torch.empty(1, rows.shape[0], N, device="cuda", dtype=dtype)
        return launch_invariant_bmm(rows[None], w.T[None], out, bias, config)[0]

    full = _assert_prefix_invariant(linear, x)
    expected = x.double() @ w.double().T + bias.double()
    assert _rel_err(full, expected) < (2e-3 if dtype == torch.float16 else 1e-6)


@pytest.mark.parametrize(
    ("N", "K", "dtype", "block_n", "warps", "rows"),
    [
        (3648, 2048, torch.float16, 2, 4, 1),
        (2048, 2816, torch.float16, 8, 8, 3),  # K not a power of two, 3-row passes
        (1024, 4096, torch.float16, 2, 8, 2),
        (64, 2048, torch.float32, 1, 8, 1),
    ],
)
def test_gemv_linear_is_invariant_and_close_to_torch(seed, N, K, dtype, block_n, warps, rows):
    from specter_kernels.invariant.gemv_config import InvariantGemvConfig
    from specter_kernels.invariant.gemv_triton import launch_invariant_gemv

    config = InvariantGemvConfig(block_n, warps, rows)
    x = torch.randn(PREFILL, K, device="cuda").to(dtype)
    w = (torch.randn(N, K, device="cuda") * 0.02).to(dtype)
    bias = torch.randn(N, device="cuda").to(dtype)

    def linear(r):
        out = torch.empty(r.shape[0], N, device="cuda", dtype=dtype)
        return launch_invariant_gemv(r, w, out, bias, config)

    full = _assert_prefix_invariant(linear, x)
    expected = x.double() @ w.double().T + bias.double()
    assert _rel_err(full, expected) < (2e-3 if dtype == torch.float16 else 1e-6)


def test_the_tuned_gemv_tiles_are_the_ones_invariant_linear_runs(seed):
    from specter_kernels.invariant.gemv_config import gemv_config

    name = torch.cuda.get_device_name()
    # DeepSeek-V2-Lite's fused q/kv_a projection: in an H200's tuned file as a GEMV.
    config = gemv_config(3648, 2048, torch.float16, name)
    if name == "NVIDIA H200":
        assert config is not None
        assert config.rows == 1
    x = torch.randn(5, 2048, device="cuda").half()
    w = (torch.randn(3648, 2048, device="cuda") * 0.02).half()
    assert torch.equal(sk.invariant_linear(x, w)[:1], sk.invariant_linear(x[:1], w))


def test_fp32_router_linear_is_ieee_and_invariant(seed):
    x = torch.randn(PREFILL, 2048, device="cuda")
    w = torch.randn(64, 2048, device="cuda") * 0.02
    full = _assert_prefix_invariant(lambda rows: sk.invariant_linear(rows, w), x)
    assert _rel_err(full, (x.double() @ w.double().T)) < 1e-6  # TF32 would give ~1e-4


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax", "log_softmax", "mean"])
@pytest.mark.parametrize("N", [2048, 102400])
def test_row_ops_fp16_are_invariant(seed, op, N):
    x = torch.randn(PREFILL, N, device="cuda").half()
    weight = torch.randn(N, device="cuda").half()
    fn = {
        "rms_norm": lambda r: sk.invariant_rms_norm(r, (N,), weight, 1e-6),
        "layer_norm": lambda r: sk.invariant_layer_norm(r, (N,), weight, weight),
        "softmax": lambda r: sk.invariant_softmax(r, dtype=torch.float32),
        "log_softmax": lambda r: sk.invariant_log_softmax(r, dtype=torch.float32),
        "mean": lambda r: sk.invariant_mean(r, keepdim=True),
    }[op]
    full = _assert_prefix_invariant(fn, x)
    reference = {
        "rms_norm": lambda r: F.rms_norm(r.float(), (N,), weight.float(), 1e-6),
        "layer_norm": lambda r: F.layer_norm(r.float(), (N,), weight.float(), weight.float()),
        "softmax": lambda r: torch.softmax(r.float(), -1),
        "log_softmax": lambda r: torch.log_softmax(r.float(), -1),
        "mean": lambda r: r.float().mean(-1, keepdim=True),
    }[op]
    assert _rel_err(full, reference(x)) < 2e-3


def test_sdpa_under_the_mode_with_a_static_cache_mask(seed):
    # DeepSeek-V2-Lite-like heads: 16 heads, qk dim 192, v dim 128, a 1024-slot cache.
    B, H, L, D, Dv = 1, 16, 1024, 192, 128
    q = torch.randn(B, H, PREFILL, D, device="cuda").half()
    k = torch.randn(B, H, L, D, device="cuda").half()
    v = torch.randn(B, H, L, Dv, device="cuda").half()
    start = 100  # queries at cache positions start..start+T-1
    positions = torch.arange(start, start + PREFILL, device="cuda")
    visible = torch.arange(L, device="cuda")[None, :] <= positions[:, None]  # [T, L]

    def attend(queries):
        mask = visible[: queries.shape[2]][None, None]
        with sk.batch_invariant():
            return F.scaled_dot_product_attention(queries, k, v, attn_mask=mask)

    full = _assert_prefix_invariant(attend, q, dim=2)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None, None])
    assert _rel_err(full, expected) < 3e-3


def test_mode_on_cuda_routes_linear_and_matmul(seed):
    x = torch.randn(PREFILL, 2048, device="cuda").half()
    w = (torch.randn(1408, 2048, device="cuda") * 0.02).half()

    def forward(rows):
        with sk.batch_invariant():
            return F.silu(rows @ w.T).sum(-1, keepdim=True) + F.linear(rows, w).mean(-1, True)

    full = _assert_prefix_invariant(forward, x)
    assert torch.equal(full[:3], forward(x[:3]))


def test_grouped_fp16_per_pair_mode_is_invariant(seed):
    H, I, E, k, S = 2048, 1408, 64, 6, 64
    x = torch.randn(PREFILL, H, device="cuda").half()
    ids = torch.topk(torch.randn(PREFILL, E, device="cuda"), k).indices
    weights = torch.rand(PREFILL, k, device="cuda")
    w13 = (torch.randn(S, 2 * I, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(S, H, I, device="cuda") * 0.02).half()
    slot_of = torch.randperm(S, device="cuda").int()
    resident = torch.rand(E, device="cuda") < 0.5

    def routed(m):
        out = torch.zeros(m, k, H, device="cuda")
        args = (x[:m], ids[:m], weights[:m], w13, w2, slot_of)
        sk.grouped_moe_fp16(*args, resident, out)
        sk.grouped_moe_fp16(*args, ~resident, out)
        return sk.sum_routed_pairs(out)

    full = routed(PREFILL)
    for m in ROW_COUNTS:
        assert torch.equal(full[:m], routed(m)), f"rows differ at m={m}"
    everything = torch.ones(E, dtype=torch.bool, device="cuda")
    ref = sk.grouped_moe_fp16_reference(
        x, ids, weights, w13, w2, slot_of, everything, torch.zeros(PREFILL, H, device="cuda")
    )
    assert _rel_err(full, ref) < 2e-3


@pytest.mark.parametrize("split", [4, 8])
def test_split_k_is_deterministic_and_replays_in_a_cuda_graph(seed, split):
    # On the GPU any split may arrive last; the sum must still be in split order (the same
    # bits every launch), and counters must be zero after each replay of a captured launch.
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig
    from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

    config = MatmulConfig(BLOCK_M, 16, 128, split_k=split)
    N, K = 2048, 2816
    w = (torch.randn(N, K, device="cuda") * 0.02).half()
    x = torch.randn(5, K, device="cuda").half()
    out = torch.full((1, 5, N), float("nan"), device="cuda", dtype=torch.float16)
    first = launch_invariant_bmm(x[None], w.T[None], out, None, config)[0].clone()
    assert _rel_err(first, x.double() @ w.double().T) < 2e-3
    for _ in range(200):
        assert torch.equal(launch_invariant_bmm(x[None], w.T[None], out, None, config)[0], first)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_invariant_bmm(static_x[None], w.T[None], out, None, config)
    for _ in range(20):
        out.fill_(float("nan"))
        fresh = torch.randn_like(x)
        static_x.copy_(fresh)
        graph.replay()
        eager = torch.empty_like(out)
        launch_invariant_bmm(fresh[None], w.T[None], eager, None, config)
        assert torch.equal(out, eager)

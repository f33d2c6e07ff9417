"""Fused router: transformers' routers' arithmetic in one launch, descending ids with ties to
the lower id, batch-invariant rows, every output written, clear errors."""

import pytest
import torch
from transformers import DeepseekV2Config, Qwen2MoeConfig
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

import specter_kernels as sk


def _problem(T, E, H, dtype):
    x = torch.randn(T, H).to(dtype)
    weight = (0.2 * torch.randn(E, H)).to(dtype)
    return x, weight


def _as_sets(ids):
    return [sorted(row) for row in ids.tolist()]


def test_reference_is_deepseek_greedy_router(seed):
    config = DeepseekV2Config(
        hidden_size=48, n_routed_experts=12, num_experts_per_tok=3, topk_method="greedy",
        routed_scaling_factor=1.7, n_group=1, topk_group=1, num_attention_heads=4,
        num_key_value_heads=4,
    )  # fmt: skip
    router = DeepseekV2TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(0.3 * torch.randn(12, 48))
    x = torch.randn(5, 48)
    logits, weights, ids = router(x)
    ref_logits, ref_weights, ref_ids = sk.router_topk_reference(
        x, router.weight.detach(), 3, scaling=1.7
    )
    assert torch.equal(ref_logits, logits)
    assert _as_sets(ref_ids) == _as_sets(ids)
    order = torch.argsort(ids, dim=-1)
    ref_order = torch.argsort(ref_ids, dim=-1)
    assert torch.equal(ref_weights.gather(1, ref_order), weights.gather(1, order))


@pytest.mark.parametrize("renormalize", [False, True])
def test_reference_is_qwen2_moe_router(seed, renormalize):
    config = Qwen2MoeConfig(
        hidden_size=32, num_experts=10, num_experts_per_tok=4, norm_topk_prob=renormalize
    )
    router = Qwen2MoeTopKRouter(config).half()
    with torch.no_grad():
        router.weight.copy_(0.3 * torch.randn(10, 32))
    x = torch.randn(4, 32).half()
    logits, weights, ids = router(x)
    ref_logits, ref_weights, ref_ids = sk.router_topk_reference(
        x, router.weight.detach(), 4, logits_dtype=torch.float16, renormalize=renormalize,
        weights_dtype=torch.float16,
    )  # fmt: skip
    assert torch.equal(ref_logits, logits)
    # Qwen sorts its top-k, so the weights come in the same (descending) order; only ids of
    # equal fp16 weights may trade places (torch.topk orders ties as it likes, the reference
    # puts the lower id first).
    assert torch.equal(ref_weights, weights)
    assert _as_sets(ref_ids) == _as_sets(ids)
    order, ref_order = torch.argsort(ids, dim=-1), torch.argsort(ref_ids, dim=-1)
    assert torch.equal(ref_weights.gather(1, ref_order), weights.gather(1, order))
    swapped = ref_ids != ids
    tied = (weights[:, :, None] == weights[:, None, :]).sum(-1) > 1
    assert torch.all(tied[swapped])


@pytest.mark.parametrize(
    ("T", "E", "H", "k", "dtype", "logits_dtype", "renormalize"),
    [
        (3, 64, 200, 6, torch.float16, torch.float32, False),  # DeepSeek-V2-Lite's router
        (2, 60, 96, 4, torch.float16, torch.float16, True),  # Qwen's, padded expert lanes
        (4, 7, 40, 7, torch.float32, torch.float32, False),  # every expert chosen
        (1, 5, 16, 1, torch.bfloat16, torch.bfloat16, False),
    ],
)
def test_kernel_matches_reference(seed, poisoned, T, E, H, k, dtype, logits_dtype, renormalize):
    x, weight = _problem(T, E, H, dtype)
    kwargs = {"logits_dtype": logits_dtype, "renormalize": renormalize, "scaling": 1.3}
    logits, weights, ids = sk.router_topk(x, weight, k, weights_dtype=torch.float32, **kwargs)
    ref_logits, ref_weights, ref_ids = sk.router_topk_reference(
        x.double(), weight.double(), k, weights_dtype=torch.float64,
        **{**kwargs, "logits_dtype": torch.float64},
    )  # fmt: skip
    assert logits.dtype == logits_dtype
    assert logits.shape == (T, E)
    assert ids.dtype == torch.int64
    assert ids.shape == weights.shape == (T, k)
    tol = 2e-2 if logits_dtype != torch.float32 else 1e-4
    torch.testing.assert_close(logits.double(), ref_logits, atol=tol, rtol=tol)
    # The kernel ranks its own logits (in logits_dtype, as transformers' routers do):
    # descending, ties to the lower id, no unchosen expert above the last chosen one.
    chosen = logits.double().gather(1, ids)
    assert (chosen[:, :-1] >= chosen[:, 1:]).all()
    tied = chosen[:, :-1] == chosen[:, 1:]
    assert (ids[:, :-1] < ids[:, 1:])[tied].all()
    others = logits.double().scatter(1, ids, float("-inf"))
    assert (others.max(dim=1).values <= chosen[:, -1]).all()
    # Against the float64 reference: its experts, in its order, except where rounding the
    # logits to logits_dtype made a near tie (then the swapped experts' exact logits agree
    # within the logits' tolerance).
    torch.testing.assert_close(
        ref_logits.gather(1, ids), ref_logits.gather(1, ref_ids), atol=tol, rtol=tol
    )
    if logits_dtype == torch.float32:
        assert torch.equal(ids, ref_ids)
    swapped = ids != ref_ids
    torch.testing.assert_close(
        weights.double()[~swapped], ref_weights[~swapped], atol=tol, rtol=tol
    )
    probs = torch.softmax(logits.double(), -1).gather(1, ids)
    assert (probs[:, :-1] >= probs[:, 1:]).all()  # largest first


def test_ties_go_to_the_lower_expert(seed, triton_backend):
    H = 32
    weight = torch.zeros(8, H)
    weight[[1, 3, 6]] = 1.0  # three equal best experts, five equal others
    x = torch.ones(2, H)
    _, weights, ids = sk.router_topk(x, weight, 5)
    assert ids.tolist() == [[1, 3, 6, 0, 2]] * 2
    ref = sk.router_topk_reference(x, weight, 5)
    assert torch.equal(ids, ref[2])
    torch.testing.assert_close(weights, ref[1])


def test_rows_are_batch_invariant(seed, triton_backend):
    x, weight = _problem(6, 64, 300, torch.float16)
    together = sk.router_topk(x, weight, 6, scaling=2.0)
    for i in range(6):
        alone = sk.router_topk(x[i : i + 1], weight, 6, scaling=2.0)
        for a, b in zip(alone, together, strict=True):
            assert torch.equal(a[0], b[i])


def test_the_selection_runs_in_the_logits_launch(seed, triton_backend, monkeypatch):
    # The selection in the logits launch's last program per row: the reference's ids and
    # weights, and the row counters left at zero for the next launch.
    from specter_kernels.invariant import matmul_triton as invariant_matmul_triton
    from specter_kernels.moe import router_topk_triton

    x, weight = _problem(5, 64, 300, torch.float16)
    ref = sk.router_topk_reference(x, weight, 6, renormalize=True, scaling=2.5)
    calls = []
    real = router_topk_triton._router_one_launch_kernel
    monkeypatch.setattr(
        router_topk_triton, "_router_one_launch_kernel",
        type("Spy", (), {"__getitem__": lambda self, grid: calls.append(grid) or real[grid]})(),
    )  # fmt: skip
    one = sk.router_topk(x, weight, 6, renormalize=True, scaling=2.5)
    assert calls == [(5, 64 // router_topk_triton.BLOCK_E)]  # one program per (row, expert block)
    assert torch.equal(one[2], ref[2])
    torch.testing.assert_close(one[1], ref[1], rtol=1e-3, atol=1e-3)
    counters = invariant_matmul_triton.tile_counters(x.device, 5)
    assert int(counters.count_nonzero()) == 0
    again = sk.router_topk(x, weight, 6, renormalize=True, scaling=2.5)  # counters reused
    assert all(torch.equal(a, b) for a, b in zip(again, one, strict=True))


def test_strided_rows_are_read_in_place(seed, backend):
    x, weight = _problem(4, 16, 64, torch.float16)
    wide = torch.zeros(4, 100, dtype=torch.float16)
    wide[:, 10:74] = x
    strided = sk.router_topk(wide[:, 10:74], weight, 2)
    plain = sk.router_topk(x, weight, 2)
    for a, b in zip(strided, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.randn(2, 8), torch.randn(4, 8), 0), {}, ValueError, r"top_k must be .* \[1, 4\]"),
        ((torch.randn(2, 8), torch.randn(4, 8), 5), {}, ValueError, r"got 5"),
        ((torch.randn(2, 8), torch.randn(4, 6), 1), {}, ValueError, r"x \[T, H\]"),
        ((torch.randn(2, 8), torch.randn(4, 8), 2.0), {}, ValueError, r"top_k"),
        ((torch.randn(2, 8).long(), torch.randn(4, 8), 1), {}, TypeError, r"torch.int64"),
        ((torch.randn(8), torch.randn(4, 8), 1), {}, ValueError, r"x \[T, H\]"),
        (
            (torch.randn(2, 8), torch.randn(4, 8), 1),
            {"weights_dtype": torch.int32},
            TypeError,
            r"weights_dtype",
        ),
        (([1.0], torch.randn(4, 8), 1), {}, TypeError, r"x must be a tensor"),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        sk.router_topk(*args, **kwargs)

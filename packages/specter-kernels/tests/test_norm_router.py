"""The residual add, RMSNorm and router in one launch: the bits of ``add_rms_norm`` and of
``router_topk`` on its normed rows, rows independent of each other, counters left at zero,
the two calls where the launch does not apply, clear errors."""

import pytest
import torch

import specter_kernels as sk

DEEPSEEK = {"logits_dtype": torch.float32, "renormalize": False, "scaling": 1.0,
            "weights_dtype": torch.float32}  # fmt: skip
QWEN = {"logits_dtype": torch.float16, "renormalize": True, "scaling": 1.0,
        "weights_dtype": torch.float16}  # fmt: skip


def _problem(T, H, E, dtype=torch.float16):
    x = torch.randn(T, H).to(dtype)
    residual = (3 * torch.randn(T, H)).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(H)).to(dtype)
    gate_weight = (0.2 * torch.randn(E, H)).to(dtype)
    return x, residual, norm_weight, gate_weight


def _two_calls(x, residual, norm_weight, eps, gate_weight, top_k, **router):
    summed, normed = sk.add_rms_norm(x, residual, norm_weight, eps)
    return summed, normed, sk.router_topk(normed, gate_weight, top_k, **router)


def _equal(a, b):
    (s1, n1, r1), (s2, n2, r2) = a, b
    return (
        torch.equal(s1, s2)
        and torch.equal(n1, n2)
        and all(torch.equal(u, v) for u, v in zip(r1, r2, strict=True))
    )


@pytest.mark.parametrize(
    ("T", "H", "E", "k", "router"),
    [
        (3, 64, 16, 6, DEEPSEEK),  # DeepSeek's settings (fp32 logits, scaled)
        (2, 48, 12, 4, QWEN),  # Qwen's (fp16 logits, renormalised), padded lanes
        (1, 32, 5, 5, {**DEEPSEEK, "scaling": 2.5}),  # every expert chosen
    ],
)
def test_one_launch_has_the_bits_of_the_two_calls(seed, poisoned, monkeypatch, T, H, E, k, router):
    from specter_kernels import norm_router_triton

    x, residual, norm_weight, gate_weight = _problem(T, H, E)
    launches = []
    real = norm_router_triton._add_norm_router_kernel
    monkeypatch.setattr(
        norm_router_triton, "_add_norm_router_kernel",
        type("Spy", (), {"__getitem__": lambda self, grid: launches.append(grid) or real[grid]})(),
    )  # fmt: skip
    fused = sk.add_rms_norm_router_topk(x, residual, norm_weight, 1e-6, gate_weight, k, **router)
    assert launches == [(T, E)]  # one program per (row, expert)
    apart = _two_calls(x, residual, norm_weight, 1e-6, gate_weight, k, **router)
    assert _equal(fused, apart)
    summed, normed, (logits, weights, ids) = fused
    assert summed.shape == normed.shape == (T, H)
    assert logits.dtype == router["logits_dtype"]
    assert weights.shape == ids.shape == (T, k)
    # Against float64 torch: the sum exactly, the rest within the dtypes' rounding.
    ref = sk.add_rms_norm_router_topk_reference(
        x.double(), residual.double(), norm_weight.double(), 1e-6, gate_weight.double(), k,
        **{**router, "logits_dtype": torch.float64, "weights_dtype": torch.float64},
    )  # fmt: skip
    assert torch.equal(summed, (x.float() + residual.float()).half())
    torch.testing.assert_close(normed.double(), ref[1], atol=2e-2, rtol=2e-2)
    counters = __import__(
        "specter_kernels.invariant_matmul_triton", fromlist=["tile_counters"]
    ).tile_counters(x.device, T)
    assert int(counters.count_nonzero()) == 0  # left zeroed for the next launch


def test_rows_alone_are_rows_together(seed, triton_backend):
    x, residual, norm_weight, gate_weight = _problem(5, 64, 16)
    together = sk.add_rms_norm_router_topk(x, residual, norm_weight, 1e-6, gate_weight, 6)
    for i in range(5):
        alone = sk.add_rms_norm_router_topk(
            x[i : i + 1], residual[i : i + 1], norm_weight, 1e-6, gate_weight, 6
        )
        assert torch.equal(alone[0][0], together[0][i])
        assert torch.equal(alone[1][0], together[1][i])
        for a, b in zip(alone[2], together[2], strict=True):
            assert torch.equal(a[0], b[i])


def test_strided_rows_are_read_in_place(seed, triton_backend):
    x, residual, norm_weight, gate_weight = _problem(3, 32, 8)
    wide = torch.zeros(3, 50, dtype=torch.float16)
    wide[:, 7:39] = x
    rest = (residual, norm_weight, 1e-5, gate_weight, 2)
    strided = sk.add_rms_norm_router_topk(wide[:, 7:39], *rest)
    plain = sk.add_rms_norm_router_topk(x, *rest)
    assert _equal(strided, plain)


def test_torch_backend_and_wide_rows_take_the_two_calls(seed, monkeypatch):
    from specter_kernels import norm_router_triton

    x, residual, norm_weight, gate_weight = _problem(2, 32, 8)
    launched = []
    monkeypatch.setattr(norm_router_triton, "launch_add_norm_router", launched.append)
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    got = sk.add_rms_norm_router_topk(x, residual, norm_weight, 1e-6, gate_weight, 3, **QWEN)
    ref = sk.add_rms_norm_router_topk_reference(
        x, residual, norm_weight, 1e-6, gate_weight, 3, **QWEN
    )
    assert _equal(got, ref)
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "triton")
    monkeypatch.setattr(norm_router_triton, "MAX_HIDDEN", 16)  # 32 lanes: too wide
    wide = sk.add_rms_norm_router_topk(x, residual, norm_weight, 1e-6, gate_weight, 3, **QWEN)
    assert _equal(wide, _two_calls(x, residual, norm_weight, 1e-6, gate_weight, 3, **QWEN))
    assert launched == []


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"top_k": 9}, ValueError, r"top_k must be an int in \[1, 8\]"),
        ({"eps": -1.0}, ValueError, r"eps"),
        ({"residual": torch.zeros(2, 30).half()}, ValueError, r"residual is \(2, 30\)"),
        ({"residual": torch.zeros(2, 32)}, TypeError, r"dtype"),
        ({"gate_weight": torch.zeros(8, 30, dtype=torch.float16)}, ValueError, r"x \[T, H\]"),
        ({"x": torch.zeros(32, dtype=torch.float16)}, ValueError, r"\[T, H\] rows"),
        ({"weights_dtype": torch.int32}, TypeError, r"weights_dtype"),
    ],
)
def test_bad_arguments_are_named(triton_backend, change, error, match):
    x, residual, norm_weight, gate_weight = _problem(2, 32, 8)
    args = {"x": x, "residual": residual, "norm_weight": norm_weight, "eps": 1e-6,
            "gate_weight": gate_weight, "top_k": 2}  # fmt: skip
    router = {k: change.pop(k) for k in list(change) if k.endswith("dtype")}
    args.update(change)
    with pytest.raises(error, match=match):
        sk.add_rms_norm_router_topk(**args, **router)

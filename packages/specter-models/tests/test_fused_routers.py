"""Fused router wiring: DeepSeek-V2's greedy and Qwen2-MoE's routers routed through
specter-kernels' router_topk with their own settings on CUDA, transformers' forward
elsewhere; PhiMoE's sparsemixer untouched."""

from __future__ import annotations

import pytest
import torch

import specter_models.fused_routers as fused_routers
from model_helpers import random_prompt
from specter_models.loader import load_model


def _routers(lm):
    return [m for m in lm.model.modules() if type(m).__name__.endswith("Router")]


@pytest.mark.parametrize(
    ("name", "fused"),
    [("tiny-deepseek-v2", True), ("tiny-qwen2-moe", True), ("tiny-phimoe", False)],
)
def test_every_supported_router_is_wrapped_once(checkpoints, name, fused):
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    routers = _routers(lm)
    assert routers
    assert all(getattr(m, "_specter_fused_router", False) == fused for m in routers)
    assert fused_routers.install_fused_routers(lm.model) == 0  # installed, or unsupported
    plain = load_model(checkpoints[name], device="cpu", dtype=torch.float32, fused_routers=False)
    assert not any(getattr(m, "_specter_fused_router", False) for m in _routers(plain))


def test_group_limited_routers_are_not_fused():
    class DeepseekV2TopkRouter(torch.nn.Module):  # the name and settings are what count
        top_k, routed_scaling_factor, topk_method = 2, 1.0, "group_limited_greedy"

    assert fused_routers.router_settings(DeepseekV2TopkRouter()) is None
    DeepseekV2TopkRouter.topk_method = "greedy"
    assert fused_routers.router_settings(DeepseekV2TopkRouter())["top_k"] == 2


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_the_fused_call_routes_as_transformers(checkpoints, name, monkeypatch):
    prompt = random_prompt(6, 96, seed=3)
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    routers = _routers(lm)
    for i, module in enumerate(routers):  # distinct settings: a swapped one would show
        if hasattr(module, "routed_scaling_factor"):
            module.routed_scaling_factor = 0.5 + i
        if hasattr(module, "norm_topk_prob"):
            module.norm_topk_prob = bool(i % 2)
    expected = lm.target.forward(prompt, 0)
    lm.reset()
    calls = []

    def applies(x, weight):
        calls.append(tuple(x.shape))
        return True  # the fused entry point on the CPU: its torch reference

    monkeypatch.setattr(fused_routers, "fused_applies", applies)
    got = lm.target.forward(prompt, 0)
    assert len(calls) == len(routers)
    # The same experts with the same weights, summed in another order at most.
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fused_router_outputs_match_the_module(checkpoints, monkeypatch):
    lm = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32)
    router = _routers(lm)[0]
    router.norm_topk_prob = True  # read at call time
    x = torch.randn(3, router.hidden_dim)
    expected = router(x)  # CPU: transformers' own forward
    monkeypatch.setattr(fused_routers, "fused_applies", lambda x, w: True)
    got = router(x)
    assert torch.equal(got[2], expected[2])  # Qwen sorts: the same ids in the same order
    torch.testing.assert_close(got[1], expected[1])
    assert torch.allclose(got[1].sum(-1), torch.ones(3))  # renormalised
    torch.testing.assert_close(got[0], expected[0])

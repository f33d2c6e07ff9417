"""Tiny transformers models under BatchInvariantMode: a prefix's logits do not depend on T."""

import pytest
import torch

import specter_kernels as sk

transformers = pytest.importorskip("transformers")


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config)


def _qwen2_moe():
    config = transformers.Qwen2MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    # The default experts path is torch._grouped_mm, which the mode does not
    # cover (Specter's experts run grouped_moe_fp16 in per-pair mode instead);
    # the eager loop is F.linear per expert.
    config._experts_implementation = "eager"
    return transformers.Qwen2MoeForCausalLM(config)


@pytest.mark.parametrize(
    ("build", "backend"), [(_llama, "torch"), (_llama, "triton"), (_qwen2_moe, "torch")]
)
def test_prefix_logits_are_bitwise_equal_under_the_mode(seed, monkeypatch, build, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", backend)
    model = build().float().eval()
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        normal = model(ids).logits
        with sk.batch_invariant():
            full = model(ids).logits
            prefixes = {m: model(ids[:, :m]).logits for m in (1, 5)}
    for m, logits in prefixes.items():
        assert torch.equal(full[:, :m], logits), f"first {m} rows differ"
    assert torch.allclose(full, normal, rtol=1e-4, atol=1e-4)
    assert not torch.equal(full, torch.zeros_like(full))

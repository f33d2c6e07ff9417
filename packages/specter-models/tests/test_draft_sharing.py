"""The INT4 draft shares every non-expert tensor with the target by identity and adds
nothing but its INT4 routed experts."""

from __future__ import annotations

import torch

from model_helpers import random_prompt, reference_from_checkpoint
from specter_kernels import dequantize_int4
from specter_models import plan_memory
from specter_models.loader import load_model


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_draft_adds_only_int4_experts(checkpoints, arch_name):
    folder = checkpoints[arch_name]
    lm = load_model(folder, device="cpu", dtype=torch.float32, slots_per_layer=3)
    target, draft = lm.state_tensors("target"), lm.state_tensors("draft")
    shared = set(target) & set(draft)
    assert shared == {name for name in target if name.startswith("param:")}
    assert all(target[name] is draft[name] for name in shared)  # one object, not a copy

    draft_only = [draft[name] for name in set(draft) - shared]
    assert all(name.startswith("int4:") for name in set(draft) - shared)
    assert {t.dtype for t in draft_only} <= {torch.int32, torch.float16}
    plan = lm.memory.plan
    assert _nbytes(draft_only) == plan.draft_int4_bytes > 0
    assert _nbytes(target[n] for n in shared) == plan.non_expert_bytes
    assert _nbytes(target[n] for n in set(target) - shared) == plan.slot_bytes

    # The model itself holds no routed expert: exactly the reference's other parameters.
    reference = reference_from_checkpoint(folder, torch.float32)
    routed = sum(p.numel() for n, p in reference.named_parameters() if ".mlp.experts." in n)
    assert sum(p.numel() for p in lm.model.parameters()) == (
        sum(p.numel() for p in reference.parameters()) - routed
    )


def test_draft_is_the_target_with_dequantized_routed_experts(checkpoints, arch_name):
    # transformers' model with its routed experts replaced by the dequantized INT4 ones
    # computes exactly the draft's logits: nothing else differs between draft and target.
    folder = checkpoints[arch_name]
    lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=2)
    reference = reference_from_checkpoint(folder)
    with torch.no_grad():
        for module in lm.experts:
            d = reference.model.layers[_decoder_layer(lm, module.layer)].mlp.experts
            d.gate_up_proj.copy_(dequantize_int4(module.draft_gate_up, torch.float64))
            d.down_proj.copy_(dequantize_int4(module.draft_down, torch.float64))
        ids = random_prompt(8, lm.config.vocab_size, seed=9)
        expected = reference(ids).logits
    torch.testing.assert_close(lm.draft.forward(ids, 0), expected, rtol=0, atol=1e-10)
    lm.reset()
    torch.testing.assert_close(
        torch.cat([lm.draft.forward(ids[:, :5], 0), lm.draft.forward(ids[:, 5:], 5)], dim=1),
        expected,
        rtol=1e-5,
        atol=1e-7,
    )


def _decoder_layer(lm, moe_index: int) -> int:
    from specter_models.architecture import find_moe_layers

    return find_moe_layers(lm.model)[moe_index].decoder_layer


def test_draft_routing_feeds_the_counters_and_target_routing_does_not(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, slots_per_layer=4
    )
    top_k = lm.config.num_experts_per_tok
    lm.target.forward(torch.tensor([[1, 2, 3]]), 0)
    assert int(lm.counter.counts.sum()) == 0
    lm.draft.forward(torch.tensor([[4, 5]]), 3)
    counts = lm.counter.counts
    assert counts.shape == (2, 8)
    assert counts.sum(dim=1).tolist() == [2 * top_k] * 2


def test_target_only_engine_has_no_draft_and_more_slots(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    with_draft = load_model(folder, device="cpu", dtype=torch.float32, slots_per_layer=2)
    plan = plan_memory(with_draft.config, dtype=torch.float32, max_seq_len=64)
    budget = plan.fixed_bytes + plan.num_moe_layers * plan.expert_bytes * 2 + 1
    a = load_model(
        folder, device="cpu", dtype=torch.float32, gpu_memory_gb=budget / 1e9, max_seq_len=64
    )
    b = load_model(
        folder,
        device="cpu",
        dtype=torch.float32,
        gpu_memory_gb=budget / 1e9,
        max_seq_len=64,
        draft=None,
    )
    assert b.draft is None
    assert b.memory.plan.draft_int4_bytes == 0
    assert b.memory.plan.slots_per_layer > a.memory.plan.slots_per_layer == 2
    assert all(not m.draft_tensors() for m in b.experts)

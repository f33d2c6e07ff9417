"""Routing hooks: the same routing on transformers' model and on Specter's target and draft."""

import pytest
import torch

from specter_models import build_reference_model
from specter_models.loader import load_model
from specter_models.routing_recorder import (
    RoutingRecorder,
    experts_modules,
    teacher_forced_pass,
    teacher_forced_routing,
)
from specter_spec import SpecController


@pytest.mark.parametrize("arch", ["tiny-deepseek-v2", "tiny-phimoe"])
def test_teacher_forced_routing_matches_decode_and_transformers(arch):
    loaded = load_model(
        arch, slots_per_layer=8, device="cpu", dtype=torch.float64, seed=1, max_seq_len=64,
        policy="predictive",
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, loaded.config.vocab_size, (6,), generator=g).tolist()
    # Decode token by token, recording the target's needed experts per layer and step.
    loaded.runtime.record_routing(True)
    controller = SpecController(loaded.draft, loaded.target, cache=loaded.prefetcher, depth=0)
    run = controller.generate(prompt, 10)
    decode_trace = loaded.runtime.routing_trace
    loaded.runtime.record_routing(False)

    sequence = prompt + run.tokens[:-1]
    recorder = RoutingRecorder(loaded.model)
    target, target_next = teacher_forced_routing(
        recorder, loaded.target, sequence, len(prompt) - 1, loaded.reset
    )
    L = loaded.cache.num_layers
    k = loaded.config.num_experts_per_tok
    assert target.shape == (10, L, k)
    # The model predicts the generated tokens from the same positions.
    assert target_next.tolist() == run.tokens
    # The decode's trace: the prefill step first, then one step per generated token.
    for layer in range(L):
        steps = decode_trace[layer][-10:]
        assert [sorted(s) for s in steps] == [sorted(set(r)) for r in target[:, layer].tolist()]

    reference = build_reference_model(arch, seed=1, device="cpu", dtype=torch.float64)
    hf_recorder = RoutingRecorder(reference)
    assert hf_recorder.layers == recorder.layers
    with hf_recorder.recording():
        reference(torch.tensor([sequence]))
    assert torch.equal(
        hf_recorder.routing()[len(prompt) - 1 :].sort(-1).values, target.sort(-1).values
    )

    draft, _ = teacher_forced_routing(
        recorder, loaded.draft, sequence, len(prompt) - 1, loaded.reset
    )
    assert draft.shape == target.shape
    # The pass behind it keeps the kept positions' logits on the device, for acceptance.
    forced = teacher_forced_pass(recorder, loaded.draft, sequence, len(prompt) - 1, loaded.reset)
    assert torch.equal(forced.routing, draft)
    assert forced.logits.shape == (10, loaded.config.vocab_size)
    assert forced.logits.device == loaded.draft.device
    assert torch.equal(forced.greedy(), forced.logits.argmax(-1))
    target_pass = teacher_forced_pass(
        recorder, loaded.target, sequence, len(prompt) - 1, loaded.reset
    )
    assert target_pass.greedy().tolist() == run.tokens
    with pytest.raises(ValueError, match="outside the sequence"):
        teacher_forced_pass(recorder, loaded.target, sequence, len(sequence), loaded.reset)
    assert loaded.target.kv_length == 0  # nothing survives the diagnostic passes
    recorder.remove()
    with recorder.recording():
        loaded.target.forward(torch.tensor([sequence]), 0)
    with pytest.raises(RuntimeError, match="no routing recorded"):
        recorder.routing()


def test_recorder_needs_moe_layers():
    with pytest.raises(ValueError, match=r"no `layers\.<i>\.mlp\.experts` modules"):
        experts_modules(torch.nn.Linear(2, 2))

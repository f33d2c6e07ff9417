"""The shared experts on a side stream: the patched MoE blocks compute transformers' forward
bit for bit, and fork only where it is safe (CUDA, no routed-expert split)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specter_models import ExpertsMode, SharedExpertOverlap
from specter_models.architecture import find_moe_layers
from specter_models.loader import load_model
from specter_models.shared_overlap import install_shared_expert_overlap, shared_branches

# DeepSeek-V2: the MoE layers' shared experts (2 of 3 layers, the first dense); Qwen2-MoE: each
# layer's gated shared expert (2 layers); PhiMoE: no shared experts.
EXPECTED_BLOCKS = {"tiny-deepseek-v2": 2, "tiny-qwen2-moe": 2, "tiny-phimoe": 0}


def _load(checkpoints, name: str, **kwargs):
    return load_model(checkpoints[name], device="cpu", dtype=torch.float32, **kwargs)


@pytest.mark.parametrize("name", list(EXPECTED_BLOCKS))
def test_each_block_with_shared_experts_is_patched_once(checkpoints, name):
    lm = _load(checkpoints, name)
    overlap = lm.shared_overlap
    assert isinstance(overlap, SharedExpertOverlap)
    assert overlap.patched == EXPECTED_BLOCKS[name]
    blocks = [layer.block for layer in find_moe_layers(lm.model)]
    patched = [getattr(b, "_specter_shared_overlap", False) for b in blocks]
    assert sum(patched) == EXPECTED_BLOCKS[name]
    assert install_shared_expert_overlap(lm.model, lm.runtime).patched == 0  # already


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
@pytest.mark.parametrize("mode", [ExpertsMode.TARGET, ExpertsMode.DRAFT])
def test_patched_blocks_compute_transformers_forward_bit_for_bit(checkpoints, name, mode):
    lm = _load(checkpoints, name)
    generator = torch.Generator().manual_seed(3)
    for layer in find_moe_layers(lm.model):
        block = layer.block
        x = torch.randn(1, 5, layer.hidden_size, generator=generator)
        with torch.no_grad(), lm.runtime.running(mode):
            patched = block(x)
            plain = type(block).forward(block, x)  # transformers' own forward
        assert patched.shape == plain.shape == x.shape
        assert torch.equal(patched, plain)
        routed, shared = shared_branches(block)
        with torch.no_grad(), lm.runtime.running(mode):
            assert torch.equal(routed(x) + shared(x), plain)
            assert not torch.equal(routed(x), plain)  # the shared branch adds something
    assert lm.shared_overlap.forks == 0  # the CPU runs both branches in order


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_decoding_with_the_overlap_switched_off_gives_the_same_logits(checkpoints, name):
    on = _load(checkpoints, name)
    off = _load(checkpoints, name, shared_overlap=False)
    assert off.shared_overlap.enabled is False
    assert on.shared_overlap.enabled is True
    ids = torch.randint(0, on.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(on.target.forward(ids, 0), off.target.forward(ids, 0))
    assert torch.equal(on.draft.forward(ids[:, -1:], 9), off.draft.forward(ids[:, -1:], 9))


def test_a_block_without_shared_experts_has_no_branches(checkpoints):
    lm = _load(checkpoints, "tiny-phimoe")
    assert all(shared_branches(layer.block) is None for layer in find_moe_layers(lm.model))
    assert shared_branches(torch.nn.Linear(2, 2)) is None


def test_the_fork_needs_a_graph_capture_on_cuda_and_no_expert_split():
    runtime = SimpleNamespace(expert_split=None)
    overlap = SharedExpertOverlap(runtime)  # type: ignore[arg-type]
    device = torch.device("cuda", 0)
    on_gpu = SimpleNamespace(is_cuda=True, device=device)  # a stand-in for a CUDA tensor
    assert overlap.side_stream(torch.zeros(2)) is None  # CPU tensors run in order
    assert overlap.side_stream(on_gpu) is None  # no stream prepared for the device
    stream = object()
    overlap._streams[device] = stream  # what prepare() makes on a GPU
    overlap.capturing = lambda: False  # an eager forward (the prefill): in order
    assert overlap.side_stream(on_gpu) is None
    overlap.capturing = lambda: True  # a whole-forward graph capture
    assert overlap.side_stream(on_gpu) is stream
    runtime.expert_split = lambda *args: None  # a piecewise capture cuts at the routed call
    assert overlap.side_stream(on_gpu) is None
    runtime.expert_split = None
    overlap.enabled = False
    assert overlap.side_stream(on_gpu) is None
    overlap.prepare("cpu")  # nothing to make off CUDA
    assert list(overlap._streams) == [device]


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_join_sums_the_routed_pairs_with_the_bits_of_the_separate_sum(
    checkpoints, name, dtype, monkeypatch
):
    from specter_models import shared_overlap

    lm = load_model(checkpoints[name], device="cpu", dtype=dtype, batch_invariant=True)
    generator = torch.Generator().manual_seed(5)
    for layer in find_moe_layers(lm.model):
        block = layer.block
        x = torch.randn(1, 4, layer.hidden_size, generator=generator).to(dtype)
        residual = (torch.randn(1, 4, layer.hidden_size, generator=generator) * 8).to(dtype)
        routed, shared = shared_branches(block)
        with torch.no_grad(), lm.runtime.running(ExpertsMode.TARGET):
            kept = routed(x, True)
            summed = routed(x)
            shared_out = shared(x)
            fused = block(x, residual=residual)
        # The target's batch-invariant accumulator: one fp32 row per routed pair.
        assert isinstance(kept, shared_overlap.RoutedPairs)
        assert kept.pairs.dtype == torch.float32
        assert kept.pairs.shape == (4, lm.config.num_experts_per_tok, layer.hidden_size)
        assert summed.shape == x.shape
        assert fused.dtype == dtype
        assert torch.equal(fused, residual + (summed + shared_out))
        with torch.no_grad(), lm.runtime.running(ExpertsMode.DRAFT):
            assert routed(x, True).shape == x.shape  # the draft sums its own pairs

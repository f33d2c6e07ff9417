"""Batched target and draft over the KV slots: a sequence's rows in a packed forward are the
bits of its rows alone, each slot keeps its own KV, and a packed verification's working set
is the union of the sequences' sets.

The bitwise checks run in a child process with scalar ATen kernels (see
``model_helpers.in_scalar_aten``); the GPU test checks the same on CUDA in fp16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_helpers import in_scalar_aten, random_prompt
from specter_models import ExpertsMode
from specter_models.batch_adapters import BatchedDraft, BatchedSlots, BatchedTarget
from specter_models.kv_cache import KVCacheFullError
from specter_models.loader import load_model
from specter_spec import BatchedSpecController, SlotRows, SpecController

PROMPT_LENGTHS = (3, 11, 6)
ROWS = (1, 4, 3)


def _sequences(vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prompt [P], verified rows [T]) per sequence, of different lengths."""
    return [
        (random_prompt(p, vocab, seed=20 + i)[0], random_prompt(t, vocab, seed=40 + i)[0])
        for i, (p, t) in enumerate(zip(PROMPT_LENGTHS, ROWS, strict=True))
    ]


def _alone(lm, sequences) -> list[torch.Tensor]:
    """Each sequence's rows verified alone after its prompt (the single-sequence target)."""
    out = []
    for prompt, rows in sequences:
        lm.reset()
        lm.target.prefill(prompt.unsqueeze(0), 0)
        out.append(lm.target.forward(rows.unsqueeze(0), prompt.shape[0])[0])
    return out


def _together(lm, target, sequences) -> list[torch.Tensor]:
    """The same rows of every sequence in one packed forward, each after its prompt in its
    own slot."""
    lm.reset()
    for slot, (prompt, _) in enumerate(sequences):
        target.prefill(slot, prompt.unsqueeze(0), 0)
    rows = [SlotRows(s, r, p.shape[0]) for s, (p, r) in enumerate(sequences)]
    logits = target.forward_batch(rows)
    return list(logits.split([r.shape[0] for _, r in sequences]))


def test_packed_rows_are_the_bits_of_each_sequence_alone(checkpoints):
    # One child process for every architecture and budget: its start costs most of the time.
    folders = [str(checkpoints[name]) for name in sorted(checkpoints)]
    in_scalar_aten(Path(__file__).stem, "check_every_model", folders)


def check_every_model(folders: list[str]) -> None:
    torch.set_num_threads(1)
    for folder in folders:
        for slots in (2, None):
            check_packed_rows_bit_identical(folder, slots)


def check_packed_rows_bit_identical(checkpoint: str, slots: int | None) -> None:
    lm = load_model(
        checkpoint, device="cpu", dtype=torch.float32, slots_per_layer=slots,
        batch_invariant=True, max_batch=3, max_seq_len=64,
    )  # fmt: skip
    # Window mode run eagerly, with windows of 8 rows: the windows of the sequences differ.
    lm.enable_step_graphs(capture=False, window_step=8)
    sequences = _sequences(lm.config.vocab_size)
    alone = _alone(lm, sequences)
    target = BatchedTarget(BatchedSlots(lm))
    together = _together(lm, target, sequences)
    for one, packed in zip(alone, together, strict=True):
        assert torch.equal(one, packed), (checkpoint, slots)
    # And greedy decoding of the three together is each one's greedy decoding alone.
    prompts = [prompt.tolist() for prompt, _ in sequences]
    expected = []
    for prompt in prompts:
        lm.reset()
        expected.append(SpecController(None, lm.target, depth=0).generate(prompt, 10).tokens)
    lm.reset()
    slots_ = BatchedSlots(lm)
    controller = BatchedSpecController(
        BatchedDraft(slots_), BatchedTarget(slots_), cache=lm.prefetcher, depth=3
    )
    ids = [controller.add(prompt, 10) for prompt in prompts]
    while controller.active:
        controller.step()
    assert [controller.sequence(i).tokens for i in ids] == expected, (checkpoint, slots)


def test_each_slot_keeps_its_own_kv(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float64, max_batch=3,
        max_seq_len=64,
    )  # fmt: skip
    sequences = _sequences(lm.config.vocab_size)
    slots = BatchedSlots(lm)
    target, draft = BatchedTarget(slots), BatchedDraft(slots)
    together = _together(lm, target, sequences)
    lengths = [p + t for p, t in zip(PROMPT_LENGTHS, ROWS, strict=True)]
    assert [target.kv_length(s) for s in range(3)] == lengths
    # The draft appends scratch to slot 1 only; the target drops it, the others untouched.
    start = target.kv_length(1)
    draft.forward_batch([SlotRows(1, torch.tensor([5, 6]), start)])
    assert draft.kv_length(1) == start + 2
    assert target.kv_length(1) == start
    assert draft.kv_length(0) == target.kv_length(0)
    target.truncate(1, PROMPT_LENGTHS[1])  # roll slot 1 back and verify its rows again
    again = target.forward_batch([SlotRows(1, sequences[1][1], PROMPT_LENGTHS[1])])
    torch.testing.assert_close(again, together[1], rtol=0, atol=1e-12)
    # Slot 0 is single-sequence decoding's: the model's own target sees its length.
    assert lm.target.kv_length == target.kv_length(0)


def test_a_packed_verification_needs_the_union_of_the_sequences_experts(checkpoints):
    lm = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float64, slots_per_layer=3,
        max_batch=3, max_seq_len=64,
    )  # fmt: skip
    sequences = _sequences(lm.config.vocab_size)
    slots = BatchedSlots(lm)
    target = BatchedTarget(slots)
    _together(lm, target, sequences)
    union = slots.working_set.last[ExpertsMode.TARGET]
    alone = []
    for slot, (prompt, rows) in enumerate(sequences):
        target.truncate(slot, prompt.shape[0])
        target.forward_batch([SlotRows(slot, rows, prompt.shape[0])])
        alone.append(slots.working_set.last[ExpertsMode.TARGET])
    assert torch.equal(union, alone[0] | alone[1] | alone[2])
    sizes = [mark.sum(dim=1) for mark in alone]
    assert all(bool((union.sum(dim=1) >= size).all()) for size in sizes)
    assert bool((union.sum(dim=1) > max(s.max() for s in sizes)).any())  # some layer grew
    counts = slots.working_set.as_dict()["target"]
    assert counts["forwards"] == 4
    assert len(counts["per_layer"]) == lm.cache.num_layers


def test_bad_rows_fail_clearly(checkpoints):
    lm = load_model(
        checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float64, max_batch=2,
        max_seq_len=16,
    )  # fmt: skip
    slots = BatchedSlots(lm)
    target, draft = BatchedTarget(slots), BatchedDraft(slots)
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="at least one sequence"):
        target.forward_batch([])
    with pytest.raises(ValueError, match="slot 2 is not one of the 2 slots"):
        target.forward_batch([SlotRows(2, ids, 0)])
    with pytest.raises(ValueError, match="appears twice"):
        target.forward_batch([SlotRows(0, ids, 0), SlotRows(0, ids, 0)])
    with pytest.raises(ValueError, match="target start=3 but its committed KV holds 0"):
        target.forward_batch([SlotRows(1, ids, 3)])
    with pytest.raises(ValueError, match="must be a \\[T\\] tensor"):
        target.forward_batch([SlotRows(0, ids.unsqueeze(0), 0)])
    with pytest.raises(KVCacheFullError, match="do not fit max_seq_len=16"):
        target.forward_batch([SlotRows(0, torch.arange(17), 0)])
    target.forward_batch([SlotRows(0, ids, 0)])
    with pytest.raises(ValueError, match="draft start=1 must lie between"):
        draft.forward_batch([SlotRows(0, ids, 1)])
    with pytest.raises(ValueError, match="belongs to the target"):
        draft.truncate(0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("slots", [2, None])
@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_cuda_packed_rows_are_the_bits_of_each_sequence_alone(name, slots):
    lm = load_model(
        name, device="cuda", dtype=torch.float16, slots_per_layer=slots, seed=5, max_batch=3,
        max_seq_len=320,
    )  # fmt: skip
    assert lm.batch_invariant
    assert lm.cuda_graphs
    sequences = [(p.cuda(), r.cuda()) for p, r in _sequences(lm.config.vocab_size)]
    # Prompts of 3, 11 and 300 tokens: windows of 256 and 512 keys side by side.
    long_prompt = random_prompt(300, lm.config.vocab_size, seed=7)[0].cuda()
    sequences[2] = (long_prompt, sequences[2][1])
    alone = _alone(lm, sequences)
    target = BatchedTarget(BatchedSlots(lm))
    together = _together(lm, target, sequences)
    for one, packed in zip(alone, together, strict=True):
        assert torch.equal(one, packed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_cuda_packed_forwards_have_no_host_sync_with_every_expert_resident(name):
    lm = load_model(name, device="cuda", dtype=torch.float16, seed=5, max_batch=3)
    slots = BatchedSlots(lm)
    target, draft = BatchedTarget(slots), BatchedDraft(slots)
    sequences = [(p.cuda(), r.cuda()) for p, r in _sequences(lm.config.vocab_size)]
    _together(lm, target, sequences)  # prefills, and the kernels' first use
    for checked in (False, True):  # each shape is captured at its first pass, replayed at the next
        drafted = [SlotRows(s, r[:1], target.kv_length(s)) for s, (_, r) in enumerate(sequences)]
        verified = [SlotRows(s, r, target.kv_length(s)) for s, (_, r) in enumerate(sequences)]
        torch.cuda.synchronize()
        if checked:
            torch.cuda.set_sync_debug_mode("error")
        try:
            draft.forward_batch(drafted)
            target.forward_batch(verified)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    stats = slots.packed.graphs.stats  # both rounds' shapes were captured by the first
    assert stats.disabled_reason is None
    assert stats.captures == 2, stats
    assert stats.replays >= 2, stats


def test_packed_forwards_on_the_cpu_run_eagerly():
    lm = load_model("tiny-qwen2-moe", device="cpu", dtype=torch.float64, seed=5, max_batch=2)
    assert BatchedSlots(lm).packed.graphs is None  # no CUDA graphs on the CPU

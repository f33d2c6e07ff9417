"""Staged streaming: a layer's missing experts copied into a device buffer before the GEMM."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import all_in_slots
from kernel_helpers import streamed_problem as problem
from specter_kernels.streaming import staging_triton as streamed_staging_triton


@pytest.fixture
def small_copies(monkeypatch):
    """Copy programs of 16 x 3 elements: a tiny expert takes many, and one straddles the
    gate_up / down boundary."""
    monkeypatch.setattr(streamed_staging_triton, "COPY_BLOCK", 16)
    monkeypatch.setattr(streamed_staging_triton, "COPY_STEPS", 3)


def expected_staging(ids, slot_of, mask, num_slots):
    """The rule, written out: the missing routed experts in id order, the first ``num_slots``."""
    E = slot_of.numel()
    routed = sorted({e for e in ids.reshape(-1).tolist() if 0 <= e < E})
    missing = [e for e in routed if slot_of[e] < 0 and mask[e]]
    staged = missing[:num_slots]
    return staged + [-1] * (num_slots - len(staged)), missing


@pytest.mark.parametrize(
    ("T", "resident", "num_slots"), [(1, 3, 2), (6, 2, 3), (9, 0, 4), (4, 8, 2), (5, 1, 1)]
)
def test_staging_copies_the_first_missing_experts_in_id_order(
    seed, backend, small_copies, T, resident, num_slots
):
    H, I, E, k = 32, 16, 8, 3
    _, ids, _, w13, w2, _, _, slot_of, streamed = problem(T, H, I, E, k, resident)
    ids[0, -1] = -1  # a padding pair routes nowhere
    mask = torch.ones(E, dtype=torch.bool)
    mask[int(ids[-1, 0])] = False  # an expert outside the call is never staged
    staging = sk.StagingBuffer.allocate(num_slots, E, H, I, "cpu")
    staging.weights.fill_(float("nan"))
    want, _ = expected_staging(ids, slot_of, mask, num_slots)
    view = sk.stage_streamed(ids, slot_of, mask, streamed, staging)
    assert staging.staged_experts.tolist() == want
    for slot, expert in enumerate(want):
        gate_up, down = staging.slot_weights(slot)
        if expert < 0:
            continue
        assert torch.equal(gate_up, w13[expert])
        assert torch.equal(down, w2[expert])
        assert int(view.w13_addresses[expert]) == gate_up.data_ptr()
        assert int(view.w2_addresses[expert]) == down.data_ptr()
    others = [e for e in range(E) if e not in want]
    assert torch.equal(view.w13_addresses[others], streamed.w13_addresses[others])
    assert torch.equal(view.w2_addresses[others], streamed.w2_addresses[others])
    assert view.w13 is streamed.w13
    assert view.w2 is streamed.w2


def test_kernel_matches_the_reference(seed, triton_backend, small_copies):
    H, I, E, k, S = 32, 16, 8, 2, 3
    _, ids, _, _, _, _, _, slot_of, streamed = problem(7, H, I, E, k, 2)
    mask = torch.rand(E) < 0.8
    buffers = []
    for run in (sk.stage_streamed, sk.stage_streamed_reference):
        staging = sk.StagingBuffer.allocate(S, E, H, I, "cpu")
        staging.weights.zero_()
        run(ids, slot_of, mask, streamed, staging)
        buffers.append(staging)
    kernel, reference = buffers
    assert torch.equal(kernel.staged_experts, reference.staged_experts)
    assert torch.equal(kernel.weights, reference.weights)


@pytest.mark.parametrize(("T", "resident", "num_slots"), [(1, 2, 2), (6, 3, 2), (6, 0, 8)])
@pytest.mark.parametrize("per_pair", [True, False])
def test_staged_experts_are_read_from_the_buffer_with_the_same_bits(
    seed, poisoned, small_copies, T, resident, num_slots, per_pair
):
    H, I, E, k = 64, 32, 8, 3
    x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed = problem(
        T, H, I, E, k, resident
    )
    shape = (T, k, H) if per_pair else (T, H)
    every = torch.ones(E, dtype=torch.bool)
    staging = sk.StagingBuffer.allocate(num_slots, E, H, I, "cpu")
    view = sk.stage_streamed(ids, slot_of, every, streamed, staging)
    staged, missing = expected_staging(ids, slot_of, every, num_slots)
    for expert in staged:
        if expert >= 0:  # the host copy is no longer read: poison it
            streamed.w13[expert].fill_(float("nan"))
            streamed.w2[expert].fill_(float("nan"))
    flags = torch.zeros(2, E, dtype=torch.uint8)
    out = torch.zeros(shape)
    sk.grouped_moe_fp16(
        x, ids, weights, w13_slots, w2_slots, slot_of, every, out, None, view, flags
    )  # fmt: skip
    expected = all_in_slots(x, ids, weights, w13, w2, torch.zeros(shape))
    if per_pair:
        assert torch.equal(out, expected)
    else:
        assert torch.allclose(out, expected, rtol=2e-3, atol=2e-3)
    flagged = torch.zeros(E, dtype=torch.bool)
    flagged[missing] = True
    assert torch.equal(flags[0].bool(), flagged)  # staged experts still count as streamed
    assert torch.equal(flags[1].bool(), flagged)


def test_nothing_missing_stages_nothing(backend):
    H, I, E, k = 32, 16, 6, 2
    _, ids, _, _, _, _, _, _, streamed = problem(3, H, I, E, k, 0)
    staging = sk.StagingBuffer.allocate(2, E, H, I, "cpu")
    staging.staged_experts.fill_(5)
    every = torch.arange(E, dtype=torch.int32)
    view = sk.stage_streamed(ids, every, torch.ones(E, dtype=torch.bool), streamed, staging)
    assert staging.staged_experts.tolist() == [-1, -1]
    assert torch.equal(view.w13_addresses, streamed.w13_addresses)
    assert torch.equal(view.w2_addresses, streamed.w2_addresses)


def test_bad_buffers_and_inputs_are_named(backend):
    H, I, E, k = 32, 16, 6, 2
    _, ids, _, _, _, _, _, slot_of, streamed = problem(3, H, I, E, k, 2)
    every = torch.ones(E, dtype=torch.bool)
    with pytest.raises(ValueError, match="num_slots to be an int of at least 1, got 0"):
        sk.StagingBuffer.allocate(0, E, H, I, "cpu")
    with pytest.raises(ValueError, match="allocate one for this model's layers"):
        sk.stage_streamed(
            ids, slot_of, every, streamed, sk.StagingBuffer.allocate(1, E, H, 2 * I, "cpu")
        )
    staging = sk.StagingBuffer.allocate(1, E, H, I, "cpu")
    with pytest.raises(TypeError, match="expert_to_slot must be int32"):
        sk.stage_streamed(ids, slot_of.long(), every, streamed, staging)
    with pytest.raises(TypeError, match="staging must be a StagingBuffer"):
        sk.stage_streamed(ids, slot_of, every, streamed, None)


def test_buffer_size_counts_the_slots():
    staging = sk.StagingBuffer.allocate(3, 8, 32, 16, "cpu")
    assert staging.num_slots == 3
    assert staging.num_experts == 8
    assert staging.nbytes == 3 * 3 * 32 * 16 * 2 + 8 * 8 * 2 + 3 * 4

"""The streamed miss path: experts without a slot read in place from StreamedExperts."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import STREAMED_TOLERANCE as TOLERANCE
from kernel_helpers import all_in_slots, random_routing, rel_err, streamed_problem


@pytest.mark.parametrize(("T", "resident"), [(1, 3), (6, 4), (6, 0), (17, 5)])
@pytest.mark.parametrize("per_pair", [True, False])
def test_streamed_experts_give_the_bits_of_slots(seed, poisoned, T, resident, per_pair):
    H, I, E, k = 64, 32, 8, 3
    x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed = streamed_problem(
        T, H, I, E, k, resident
    )
    shape = (T, k, H) if per_pair else (T, H)
    expected = all_in_slots(x, ids, weights, w13, w2, torch.zeros(shape))
    flags = torch.zeros(2, E, dtype=torch.uint8)
    every = torch.ones(E, dtype=torch.bool)
    out = torch.zeros(shape)
    sk.grouped_moe_fp16(
        x, ids, weights, w13_slots, w2_slots, slot_of, every, out, None, streamed, flags
    )  # fmt: skip
    if per_pair:
        assert torch.equal(out, expected)  # the memory a weight comes from changes no bit
    else:
        assert rel_err(out, expected) < TOLERANCE  # atomics add in any order
    routed = torch.zeros(E, dtype=torch.bool)
    routed[ids.reshape(-1)] = True
    missing = routed & (slot_of < 0)
    assert torch.equal(flags[0].bool(), missing)  # gate_up flags: exactly the streamed ones
    assert torch.equal(flags[1].bool(), missing)


@pytest.mark.parametrize("pair_blocks", [False, True])
def test_streamed_kernel_matches_the_reference(seed, poisoned, pair_blocks):
    T, H, I, E, k = 5, 64, 32, 8, 2
    x, ids, weights, _, _, w13_slots, w2_slots, slot_of, streamed = streamed_problem(
        T, H, I, E, k, 3
    )
    mask = torch.rand(E) < 0.7
    outs, flags = [], []
    for run in ("kernel", "reference"):
        out, flag = torch.zeros(T, k, H), torch.zeros(2, E, dtype=torch.uint8)
        args = (x, ids, weights, w13_slots, w2_slots, slot_of, mask, out)
        if run == "kernel":
            sk.grouped_moe_fp16(*args, pair_blocks, streamed, flag)
        else:
            sk.grouped_moe_fp16_reference(*args, streamed, flag)
        outs.append(out)
        flags.append(flag)
    assert rel_err(outs[0], outs[1]) < TOLERANCE
    assert torch.equal(flags[0], flags[1])
    routed_masked = torch.zeros(E, dtype=torch.bool)
    routed_masked[ids[mask[ids]]] = True
    assert torch.equal(flags[0][0].bool(), routed_masked & (slot_of < 0))  # masked off: no read


def test_reference_streams_on_the_torch_backend(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    T, H, I, E, k = 4, 32, 16, 6, 2
    x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed = streamed_problem(
        T, H, I, E, k, 2
    )
    expected = all_in_slots(x, ids, weights, w13, w2, torch.zeros(T, k, H))
    out = torch.zeros(T, k, H)
    every = torch.ones(E, dtype=torch.bool)
    sk.grouped_moe_fp16(x, ids, weights, w13_slots, w2_slots, slot_of, every, out, None, streamed)
    assert torch.equal(out, expected)


def test_bad_streamed_experts_are_refused():
    w13 = [torch.zeros(8, 4).half() for _ in range(3)]
    w2 = [torch.zeros(4, 4).half() for _ in range(3)]
    with pytest.raises(ValueError, match="one gate_up and one down tensor per expert"):
        sk.StreamedExperts.from_tensors(w13, w2[:2], "cpu")
    with pytest.raises(ValueError, match=r"down of expert 1 must be a contiguous float16 \[4, 4\]"):
        sk.StreamedExperts.from_tensors(w13, [w2[0], torch.zeros(4, 5).half(), w2[2]], "cpu")
    with pytest.raises(ValueError, match="not contiguous"):
        sk.StreamedExperts.from_tensors(w13, [w2[0], w2[1].T, w2[2]], "cpu")
    with pytest.raises(ValueError, match=r"gate_up tensors must be fp16 \[2I, H\]"):
        sk.StreamedExperts.from_tensors([torch.zeros(3, 4).half()] * 3, w2, "cpu")
    streamed = sk.StreamedExperts.from_tensors(w13, w2, "cpu")
    assert streamed.num_experts == 3
    assert streamed.w13_addresses.tolist() == [t.data_ptr() for t in w13]
    x = torch.zeros(2, 4).half()
    ids, weights = random_routing(2, 1, 3)
    slots13, slots2 = torch.zeros(2, 8, 4).half(), torch.zeros(2, 4, 4).half()
    slot_of = torch.tensor([0, 1, -1], dtype=torch.int32)
    every = torch.ones(3, dtype=torch.bool)
    out = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="streamed_flags is given without streamed experts"):
        sk.grouped_moe_fp16(
            x, ids, weights, slots13, slots2, slot_of, every, out, None, None,
            torch.zeros(2, 3, dtype=torch.uint8),
        )  # fmt: skip
    with pytest.raises(TypeError, match=r"streamed_flags must be a contiguous uint8 \[2, E=3\]"):
        sk.grouped_moe_fp16(
            x, ids, weights, slots13, slots2, slot_of, every, out, None, streamed,
            torch.zeros(2, 3, dtype=torch.int32),
        )  # fmt: skip
    with pytest.raises(ValueError, match="streamed holds 3 experts, the routing has 4"):
        sk.grouped_moe_fp16(
            x, ids, weights, slots13, slots2, torch.zeros(4, dtype=torch.int32),
            torch.ones(4, dtype=torch.bool), out, None, streamed,
        )  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pageable_memory_is_refused_for_a_cuda_kernel():
    w13 = [torch.zeros(8, 4).half() for _ in range(2)]
    w2 = [torch.zeros(4, 4).half() for _ in range(2)]
    with pytest.raises(ValueError, match="pageable host memory"):
        sk.StreamedExperts.from_tensors(w13, w2, "cuda")

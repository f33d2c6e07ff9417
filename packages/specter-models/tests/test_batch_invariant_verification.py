"""Batch-invariant verification and the all-resident fast path.

With ``batch_invariant=True`` a row's target logits must be the same bits whether the row is
verified alone or together with others (so speculative greedy output equals plain greedy
output exactly); with a slot per expert the target skips the cache's bookkeeping.

The bitwise checks run in a child process with ``ATEN_CPU_CAPABILITY=default``: torch's CPU
elementwise kernels (SiLU, exp) otherwise compute a tensor's SIMD-aligned body and its tail
with different instructions, so a row's bits would depend on the tensor's length for reasons
that have nothing to do with the mode (GPU elementwise kernels do not do this; the GPU tests
in test_cuda.py check the same property on CUDA without any such setting).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_helpers import in_scalar_aten, random_prompt, reference_from_checkpoint
from specter_kernels import BatchInvariantMode
from specter_kernels.invariant.mode import COVERED_CALLS
from specter_models.loader import load_model
from specter_spec import SpecController


def _rows_alone_and_together(lm, prompt: torch.Tensor, rows: torch.Tensor):
    """Logits of ``rows`` verified in one forward, and each verified alone, after ``prompt``."""
    start = prompt.shape[1]
    lm.reset()
    lm.target.forward(prompt, 0)
    together = lm.target.forward(rows, start)[0]
    lm.target.truncate(start)
    alone = [lm.target.forward(rows[:, i : i + 1], start + i)[0, 0] for i in range(rows.shape[1])]
    return together, torch.stack(alone)


@pytest.mark.parametrize("slots", [2, None])
def test_rows_are_bit_identical_whatever_the_row_count(checkpoints, arch_name, slots):
    in_scalar_aten(
        Path(__file__).stem, "check_rows_bit_identical", str(checkpoints[arch_name]), slots
    )


def check_rows_bit_identical(checkpoint: str, slots: int | None) -> None:
    torch.set_num_threads(1)
    lm = load_model(
        checkpoint,
        device="cpu",
        dtype=torch.float32,
        slots_per_layer=slots,
        batch_invariant=True,
    )
    assert lm.batch_invariant
    prompt = random_prompt(6, lm.config.vocab_size, seed=3)
    rows = random_prompt(5, lm.config.vocab_size, seed=4)
    together, alone = _rows_alone_and_together(lm, prompt, rows)
    assert torch.equal(together, alone)
    # And still transformers' model (float32 rounding apart).
    reference = reference_from_checkpoint(lm.source, dtype=torch.float32)
    with torch.no_grad():
        expected = reference(torch.cat([prompt, rows], dim=1)).logits[0, prompt.shape[1] :]
    torch.testing.assert_close(together, expected, rtol=1e-4, atol=1e-4)


def test_speculative_greedy_equals_plain_greedy_with_batch_invariance(checkpoints, arch_name):
    in_scalar_aten(Path(__file__).stem, "check_speculation_is_exact", str(checkpoints[arch_name]))


def check_speculation_is_exact(checkpoint: str) -> None:
    torch.set_num_threads(1)
    lm = load_model(
        checkpoint,
        device="cpu",
        dtype=torch.float32,
        slots_per_layer=3,
        batch_invariant=True,
    )
    prompt = random_prompt(5, lm.config.vocab_size, seed=9)[0].tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 20)
    for depth in (1, 3, 6):
        lm.reset()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth).generate(
            prompt, 20
        )
        assert spec.tokens == plain.tokens, depth
        assert spec.stats.num_iterations < 20  # some proposals were accepted


def test_batch_invariance_defaults_off_on_the_cpu_and_can_be_toggled(checkpoints):
    lm = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32)
    assert not lm.batch_invariant
    lm.batch_invariant = True
    assert lm.runtime.batch_invariant


def test_all_resident_layers_bypass_the_cache_bookkeeping(checkpoints, arch_name):
    lm = load_model(checkpoints[arch_name], device="cpu", dtype=torch.float64)  # no budget
    assert min(lm.cache.slots_per_layer) == lm.cache.num_experts
    ids = random_prompt(7, lm.config.vocab_size, seed=5)
    got = lm.target.forward(ids, 0)
    expected = reference_from_checkpoint(lm.source)(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert lm.cache.stats()["total"]["acquires"] == 0  # no acquisitions: the fast path
    assert all(module._fully_resident() for module in lm.experts)


def test_routing_trace_is_kept_on_the_fast_path(checkpoints):
    lm = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    lm.runtime.record_routing()
    lm.target.forward(torch.tensor([[1, 2, 3]]), 0)
    trace = lm.runtime.routing_trace
    assert all(len(steps) == 1 and steps[0] for steps in trace)


def test_a_budget_keeps_the_cache_path(checkpoints):
    lm = load_model(
        checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float64, slots_per_layer=2
    )
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=1), 0)
    assert lm.cache.stats()["total"]["acquires"] > 0
    assert not any(module._fully_resident() for module in lm.experts)


class _CoveredCallRecorder(torch.overrides.TorchFunctionMode):
    """Records row-count-sensitive torch calls on float tensors made outside the scopes."""

    def __init__(self, inside: list[int]):
        super().__init__()
        self.inside = inside
        self.outside: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in COVERED_CALLS and not self.inside[0] and _is_sensitive(func, args):
            self.outside.append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)


def _is_sensitive(func, args) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or not tensors[0].dtype.is_floating_point:
        return False
    matmuls = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm)
    # A reduction of length one (rotary frequencies) is exact whatever the row count.
    return not (func in matmuls and tensors[0].shape[-1] == 1)


def test_every_row_count_sensitive_call_of_a_target_forward_is_covered(
    checkpoints, arch_name, monkeypatch
):
    # Structural: whatever the CPU's own kernels do, no GEMM, last-dim reduction, softmax,
    # norm or attention call of a target forward may run outside the invariant wrappers.
    from specter_models import invariant_scopes, specter_experts

    inside = [0]

    def tracked(factory):
        class Tracked(factory):
            def __enter__(self):
                inside[0] += 1
                return super().__enter__()

            def __exit__(self, *exc):
                inside[0] -= 1
                return super().__exit__(*exc)

        return Tracked

    def kernel(function):
        # A specter-kernels entry point: its internals (the CPU references' row-at-a-time
        # products) are the kernel's business, invariant by construction.
        def call(*args, **kwargs):
            inside[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                inside[0] -= 1

        return call

    monkeypatch.setattr(invariant_scopes, "BatchInvariantMode", tracked(BatchInvariantMode))
    monkeypatch.setattr(specter_experts, "BatchInvariantMode", tracked(BatchInvariantMode))
    monkeypatch.setattr(
        invariant_scopes, "invariant_linear", kernel(invariant_scopes.invariant_linear)
    )
    monkeypatch.setattr(
        specter_experts, "grouped_moe_fp16", kernel(specter_experts.grouped_moe_fp16)
    )
    for dtype in (torch.float32, torch.float16):
        lm = load_model(
            checkpoints[arch_name],
            device="cpu",
            dtype=dtype,
            slots_per_layer=3,
            batch_invariant=True,
        )
        recorder = _CoveredCallRecorder(inside)
        with recorder:
            lm.target.forward(random_prompt(5, lm.config.vocab_size, seed=2), 0)
            lm.target.forward(random_prompt(3, lm.config.vocab_size, seed=3), 5)
        assert recorder.outside == [], (dtype, recorder.outside)
        assert inside[0] == 0
        # The draft (same modules) runs torch's own kernels: the wrappers are inert there.
        recorder = _CoveredCallRecorder(inside)
        with recorder:
            lm.draft.forward(random_prompt(1, lm.config.vocab_size, seed=4), 8)
        assert recorder.outside, "the draft's linears should be torch's own"


def test_wrappers_are_installed_once_and_are_inert_outside_target_forwards(checkpoints):
    from specter_models.invariant_scopes import install_batch_invariance, needs_scope

    lm = load_model(checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float32)
    routers = [m for m in lm.model.modules() if type(m).__name__.endswith("Router")]
    assert routers
    assert all(needs_scope(m) for m in routers)  # PhiMoE's router is a Linear subclass
    assert install_batch_invariance(lm.model, lm.runtime) == {"linear": 0, "scoped": 0}
    linear = lm.model.lm_head
    x = torch.randn(3, linear.in_features)
    assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))


def test_invariant_draft_linears_route_the_drafts_linears_through_the_kernel(
    checkpoints, monkeypatch
):
    from specter_models import invariant_scopes

    calls = []
    original = invariant_scopes.invariant_linear

    def counted(x, weight, bias=None, **kwargs):
        calls.append(tuple(weight.shape))
        # A model's weights are constants of the step: the GEMV may load them before its
        # PDL wait (the kernels' preload), and every linear of the models says so.
        assert kwargs == {"constant_weight": True}, kwargs
        return original(x, weight, bias, **kwargs)

    monkeypatch.setattr(invariant_scopes, "invariant_linear", counted)
    prompt = random_prompt(4, 64, seed=5)
    logits = {}
    for switch in (False, True):
        lm = load_model(
            checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32,
            slots_per_layer=3, batch_invariant=True, invariant_draft_linears=switch,
        )  # fmt: skip
        lm.target.forward(prompt, 0)
        calls.clear()
        logits[switch] = lm.draft.forward(prompt[:, -1:], 4)
        lm_head = tuple(lm.model.lm_head.weight.shape)
        assert (lm_head in calls) is switch, (switch, calls)
        assert lm.runtime.invariant_draft_linears is switch
    # The same draft up to summation order.
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)


def test_invariant_draft_linears_default_is_off_on_the_cpu(checkpoints):
    # The default follows the device: on CUDA with batch invariance (the GEMV beats cuBLAS
    # at one row), off on the CPU, where the invariant reference runs row by row.
    lm = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32,
        slots_per_layer=3, batch_invariant=True,
    )  # fmt: skip
    assert lm.runtime.invariant_draft_linears is False

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

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model_helpers import random_prompt, reference_from_checkpoint
from specter_models import load
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


def _in_scalar_aten(function: str, *args: object) -> None:
    """Run ``function(*args)`` of this module in a child process with scalar ATen kernels."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    here = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    call = f"import {Path(__file__).stem} as t; t.{function}(*{args!r})"
    done = subprocess.run(
        [sys.executable, "-c", call], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("slots", [2, None])
def test_rows_are_bit_identical_whatever_the_row_count(checkpoints, arch_name, slots):
    _in_scalar_aten("check_rows_bit_identical", str(checkpoints[arch_name]), slots)


def check_rows_bit_identical(checkpoint: str, slots: int | None) -> None:
    torch.set_num_threads(1)
    lm = load(
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
    _in_scalar_aten("check_speculation_is_exact", str(checkpoints[arch_name]))


def check_speculation_is_exact(checkpoint: str) -> None:
    torch.set_num_threads(1)
    lm = load(
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
    lm = load(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32)
    assert not lm.batch_invariant
    lm.batch_invariant = True
    assert lm.runtime.batch_invariant


def test_all_resident_layers_bypass_the_cache_bookkeeping(checkpoints, arch_name):
    lm = load(checkpoints[arch_name], device="cpu", dtype=torch.float64)  # no budget
    assert min(lm.cache.slots_per_layer) == lm.cache.num_experts
    ids = random_prompt(7, lm.config.vocab_size, seed=5)
    got = lm.target.forward(ids, 0)
    expected = reference_from_checkpoint(lm.source)(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert lm.cache.stats()["total"]["acquires"] == 0  # no acquisitions: the fast path
    assert all(module._fully_resident() for module in lm.experts)


def test_routing_trace_is_kept_on_the_fast_path(checkpoints):
    lm = load(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    lm.runtime.record_routing()
    lm.target.forward(torch.tensor([[1, 2, 3]]), 0)
    trace = lm.runtime.routing_trace
    assert all(len(steps) == 1 and steps[0] for steps in trace)


def test_a_budget_keeps_the_cache_path(checkpoints):
    lm = load(checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float64, slots_per_layer=2)
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=1), 0)
    assert lm.cache.stats()["total"]["acquires"] > 0
    assert not any(module._fully_resident() for module in lm.experts)

"""The CPU expert path: CPU-homed experts computed on the host, exactly and row-invariantly.

The bitwise checks run in a child process with scalar ATen kernels (``in_scalar_aten``), as
the batch-invariance tests do: torch's vectorised CPU kernels round a tensor's SIMD body and
tail differently, which has nothing to do with the CPU expert path.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model_helpers import (
    in_scalar_aten,
    random_prompt,
    reference_from_checkpoint,
    rows_alone,
    rows_together,
)
from specter_models import cpu_experts
from specter_models.cpu_experts import (
    CpuKernelUnavailableError,
    check_cpu_kernel,
    default_cpu_threads,
    expert_rows,
)
from specter_models.expert_math import expert_mlp
from specter_models.loader import load_model
from specter_spec import SamplingConfig, SpecController, sampling_probs


def _half_homed(lm) -> list[list[int]]:
    """Every odd expert of each layer that is not pinned."""
    cache = lm.cache
    return [
        [e for e in range(cache.num_experts) if e % 2 and e not in cache.pinned(layer)]
        for layer in range(cache.num_layers)
    ]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_each_row_has_the_same_bits_whatever_the_rows_beside_it(dtype):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 48, generator=generator).to(dtype)
    gate_up = (torch.randn(40, 48, generator=generator) / 6).to(dtype)
    down = (torch.randn(48, 20, generator=generator) / 4).to(dtype)
    weights = torch.rand(6, generator=generator)
    together = expert_rows(x, weights, gate_up, down)
    alone = torch.cat(
        [expert_rows(x[i : i + 1], weights[i : i + 1], gate_up, down) for i in range(6)]
    )
    assert torch.equal(together, alone)
    assert together.dtype == (torch.float32 if dtype == torch.float16 else dtype)
    want = expert_mlp(x.double(), gate_up.double(), down.double()) * weights.double()[:, None]
    tolerance = 2e-2 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(together.double(), want, rtol=tolerance, atol=tolerance)


def test_a_kernel_the_host_cannot_run_is_refused_with_the_way_out(monkeypatch):
    check_cpu_kernel(torch.float32)

    def unsupported(*args, **kwargs):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    monkeypatch.setattr(cpu_experts.F, "linear", unsupported)
    with pytest.raises(CpuKernelUnavailableError, match=r"cannot run here.*--cpu-experts off"):
        check_cpu_kernel(torch.float16)


def test_the_default_threads_leave_the_launching_thread_a_core():
    assert default_cpu_threads() == max(1, cpu_experts.usable_cpus() - 1)


@pytest.mark.parametrize("miss_path", ["load", "stream"])
def test_homed_experts_are_computed_on_the_host_and_never_loaded(checkpoints, arch_name, miss_path):
    folder = checkpoints[arch_name]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path=miss_path
    )
    homed = _half_homed(lm)
    executor = lm.set_cpu_experts(homed, threads=1)
    assert lm.cpu_experts is executor
    assert lm.cache.host_experts == tuple(frozenset(h) for h in homed)
    prompt = random_prompt(6, lm.config.vocab_size, seed=5)
    got = lm.target.forward(prompt, 0)
    expected = reference_from_checkpoint(folder)(prompt).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    lm.reset()
    SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=3).generate(
        prompt[0].tolist(), 12
    )
    stats = executor.stats
    assert stats.experts > 0
    assert stats.pairs >= stats.experts
    assert stats.layer_calls > 0
    assert stats.busy_s > 0
    total = lm.cache.stats()["total"]
    assert total["prefetch_loads"] > 0  # the draft's plan still loads the device's experts
    for layer, experts in enumerate(homed):
        assert not set(experts) & set(lm.cache.resident_experts(layer))
    # Back to the device for every expert: the same logits again.
    assert lm.set_cpu_experts(None) is None
    assert not any(lm.cache.host_experts)
    lm.reset()
    torch.testing.assert_close(lm.target.forward(prompt, 0), expected, rtol=0, atol=1e-10)


def test_a_prefill_longer_than_a_verification_keeps_every_expert_on_the_device(checkpoints):
    lm = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float64, slots_per_layer=3
    )
    executor = lm.set_cpu_experts(_half_homed(lm), threads=1)
    assert executor.max_rows == lm.max_verify_rows
    lm.target.forward(random_prompt(lm.max_verify_rows + 1, 96, seed=3), 0)
    assert executor.stats.layer_calls == 0
    lm.target.forward(random_prompt(1, 96, seed=4), lm.max_verify_rows + 1)
    assert executor.stats.layer_calls > 0


def test_pinned_experts_cannot_be_homed_and_bad_threads_are_refused(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, slots_per_layer=4,
        hot_experts=[[1], [1]],
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"experts \[1\] are pinned"):
        lm.set_cpu_experts([[1, 3], [5]], threads=1)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        lm.set_cpu_experts([[3], [5]], threads=0)


# ----------------------------------------------------------------------------- exactness
def test_speculative_greedy_equals_target_only_greedy_with_the_cpu_path(checkpoints, arch_name):
    in_scalar_aten(Path(__file__).stem, "check_cpu_path_is_exact", str(checkpoints[arch_name]))


def _rows_check(lm) -> bool:
    """Whether 5 rows verified together give the bits of each verified alone."""
    prompt = random_prompt(6, lm.config.vocab_size, seed=3)
    rows = random_prompt(5, lm.config.vocab_size, seed=4)
    return torch.equal(rows_together(lm, prompt, rows), rows_alone(lm, prompt.shape[1], rows))


def _cpu_model(checkpoint: str, miss_path: str):
    lm = load_model(
        checkpoint, device="cpu", dtype=torch.float32, slots_per_layer=3, batch_invariant=True,
        miss_path=miss_path,
    )  # fmt: skip
    return lm, lm.set_cpu_experts(_half_homed(lm), threads=1)


def check_cpu_path_is_exact(checkpoint: str) -> None:
    torch.set_num_threads(1)
    for miss_path in ("load", "stream"):
        lm, executor = _cpu_model(checkpoint, miss_path)
        assert _rows_check(lm), miss_path
        ids = random_prompt(5, lm.config.vocab_size, seed=9)[0].tolist()
        lm.reset()
        plain = SpecController(None, lm.target, depth=0).generate(ids, 20)
        for depth in (1, 3, 6):
            lm.reset()
            controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
            spec = controller.generate(ids, 20)
            assert spec.tokens == plain.tokens, (miss_path, depth)
            assert spec.stats.num_iterations < 20  # some proposals were accepted
            assert executor.stats.pairs > executor.stats.experts  # experts saw several rows


def test_a_row_count_dependent_cpu_kernel_is_caught(checkpoints):
    folders = [str(checkpoints[name]) for name in sorted(checkpoints)]
    in_scalar_aten(Path(__file__).stem, "check_batched_kernel_is_caught", *folders)


def _batched_expert_rows(x, weights, gate_up, down):
    """What a naive kernel does: every row of the expert in one GEMM (torch's CPU GEMM picks
    its blocking by the row count, so a row's bits depend on the rows beside it)."""
    I = down.shape[1]
    h = F.linear(x, gate_up)
    y = F.linear(F.silu(h[:, :I]) * h[:, I:], down)
    return y * weights[:, None].to(y.dtype)


def check_batched_kernel_is_caught(*checkpoints: str) -> None:
    torch.set_num_threads(1)
    row_kernel = cpu_experts.expert_rows
    for checkpoint in checkpoints:
        lm, _ = _cpu_model(checkpoint, "stream")
        assert _rows_check(lm), checkpoint
        cpu_experts.expert_rows = _batched_expert_rows
        try:
            caught = not _rows_check(lm)
        finally:
            cpu_experts.expert_rows = row_kernel
        assert caught, f"{checkpoint}: the row-count dependent kernel went unnoticed"


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs`` (cells of probability
    zero must be empty; the others must expect at least 5 hits)."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    possible = probs > 0
    assert counts[~possible].sum() == 0, "a token of probability zero was sampled"
    expected = probs[possible] / probs[possible].sum() * counts.sum()
    assert expected.min() >= 5, f"too few samples: smallest expected count {expected.min():.2f}"
    statistic = ((counts[possible] - expected) ** 2 / expected).sum()
    df = torch.tensor(float(possible.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, statistic / 2))


def test_sampled_tokens_follow_the_target_with_the_cpu_path(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream"
    )
    executor = lm.set_cpu_experts(_half_homed(lm), threads=1)
    config = SamplingConfig(temperature=1.0, top_k=3)
    prompt = random_prompt(5, lm.config.vocab_size, seed=21)[0].tolist()
    vocab = lm.config.vocab_size

    def probs_after(tokens: list[int]) -> torch.Tensor:
        lm.reset()
        logits = lm.target.forward(torch.tensor([tokens]), 0)[0, -1]
        return sampling_probs(logits, config).double()

    law = torch.zeros(vocab, vocab, dtype=torch.float64)  # target-only law of two tokens
    first = probs_after(prompt)
    for a in torch.nonzero(first).flatten().tolist():
        law[a] = first[a] * probs_after([*prompt, a])
    controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=2, sampling=config)
    generator = torch.Generator().manual_seed(7)
    trials = max(300, int(5.5 / float(law[law > 0].min())) + 1)
    counts = torch.zeros_like(law)
    accepted = proposed = 0
    for _ in range(trials):
        result = controller.generate(prompt, 2, generator=generator)
        counts[tuple(result.tokens)] += 1
        accepted += result.stats.accepted
        proposed += result.stats.proposed
    assert 0 < accepted < proposed  # proposals were both accepted and rejected
    assert executor.stats.pairs > 0
    assert _chi_square_p_value(counts, law) > 0.001


# --------------------------------------------------------------------------------- CUDA
def _cuda(test):
    needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(needs(test))


@_cuda
@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_cuda_cpu_experts_overlap_the_device_and_keep_greedy_tokens(name, monkeypatch):
    from specter_models import specter_experts

    lm = load_model(
        name, device="cuda", dtype=torch.float16, slots_per_layer=2, seed=9, max_seq_len=320,
        miss_path="stream",
    )  # fmt: skip
    assert lm.batch_invariant
    assert lm.cuda_graphs
    generator = torch.Generator("cuda").manual_seed(3)
    ids = torch.randint(0, lm.config.vocab_size, (1, 12), device="cuda", generator=generator)
    device_only = lm.target.forward(ids, 0).float()
    lm.reset()
    executor = lm.set_cpu_experts(_half_homed(lm), threads=2)
    # Each layer launches the device's kernel on its other pairs before the host waits.
    order: list[str] = []
    kernel, finish = specter_experts.grouped_moe_fp16, executor.finish
    monkeypatch.setattr(
        specter_experts,
        "grouped_moe_fp16",
        lambda *a, **k: order.append("device") or kernel(*a, **k),
    )
    monkeypatch.setattr(executor, "finish", lambda *a: order.append("host") or finish(*a))
    mixed = lm.target.forward(ids, 0).float()
    assert order
    assert order[0] == "device"
    assert all(a == "device" for a, b in itertools.pairwise(order) if b == "host")
    monkeypatch.undo()
    # The host's FP16 GEMM sums in another order than the device's kernel: close, not equal.
    error = (mixed - device_only).abs().amax(dim=-1)[0]
    assert int((error >= 0.02 * device_only.abs().max()).sum()) <= 1, error
    stats = executor.stats
    assert stats.d2h_bytes > 0
    assert stats.h2d_bytes > 0
    assert stats.pairs > 0
    assert stats.layer_calls > 0
    # Rows verified together give the bits of rows decoded one by one, and speculation
    # decodes target-only greedy decoding's tokens, through the piecewise graphs.
    rows = ids[:, 6:11]
    assert torch.equal(rows_together(lm, ids[:, :6], rows), rows_alone(lm, 6, rows))
    prompt = ids[0, :6].tolist()
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 24)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(prompt, 24)
    assert spec.tokens == plain.tokens
    assert lm.graph_stats()["target"]["piecewise_graphs"] > 0
    for layer, homed in enumerate(executor.homed):
        assert not set(homed) & set(lm.cache.resident_experts(layer))


def test_each_layer_launches_its_device_pairs_before_the_host_computes(checkpoints, monkeypatch):
    # The same order on the CPU machine, where the device's pairs are plain torch.
    from specter_models import specter_experts

    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, slots_per_layer=3,
        batch_invariant=True, miss_path="stream",
    )  # fmt: skip
    executor = lm.set_cpu_experts(_half_homed(lm), threads=1)
    order: list[str] = []
    write, finish = specter_experts.write_expert_pairs, executor.finish
    monkeypatch.setattr(
        specter_experts, "write_expert_pairs", lambda *a: order.append("device") or write(*a)
    )
    monkeypatch.setattr(executor, "finish", lambda *a: order.append("host") or finish(*a))
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=2), 0)
    assert order == ["device", "host"] * lm.cache.num_layers

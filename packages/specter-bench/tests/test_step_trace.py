"""The step trace's pure parts on synthetic profiler events, and its argument checks."""

from types import SimpleNamespace

import pytest
import torch

from specter_bench.cli import main
from specter_bench.step_trace import (
    KernelStep,
    format_step_trace,
    kernel_sequence,
    profile_totals,
    summarize,
    union_ms,
)


def _event(name, start, end, cuda=True, own=0.0):
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return SimpleNamespace(
        name=name, device_type=kind, time_range=SimpleNamespace(start=start, end=end),
        self_cpu_time_total=own,
    )  # fmt: skip


def _tokens(count, start=0.0):
    """``count`` tokens of kernels a (10 us), b (20 us, 5 us after a), c (30 us, 2 us after b),
    each token 100 us after the last; returns the events."""
    events = []
    for t in range(count):
        base = start + 100.0 * t
        events += [
            _event("a", base, base + 10),
            _event("b", base + 15, base + 35),
            _event("c", base + 37, base + 67),
        ]
    return events


def test_union_counts_overlapping_intervals_once():
    assert union_ms([(0, 1000), (500, 1500), (3000, 4000)]) == pytest.approx(2.5)
    assert union_ms([]) == 0.0


def test_sequence_is_one_tokens_kernels_with_durations_and_gaps():
    totals = profile_totals(_tokens(9))
    calls = {"a": 1.0, "b": 1.0, "c": 1.0}
    sequence = kernel_sequence(totals["spans"], calls)
    # Cut at a; each token with the kernel before it (the previous c) first.
    assert sequence == [
        KernelStep("a", 10.0, 33.0),
        KernelStep("b", 20.0, 5.0),
        KernelStep("c", 30.0, 2.0),
    ]
    assert kernel_sequence(totals["spans"], {"a": 2.0}) == []


@pytest.mark.parametrize("tokens", [4, 5, 6])
def test_sequence_of_a_short_profile_uses_the_tokens_it_has(tokens):
    # Fewer than 7 tokens profiled (--profiled 4): the whole tokens before the last two.
    totals = profile_totals(_tokens(tokens))
    sequence = kernel_sequence(totals["spans"], {"a": 1.0, "b": 1.0, "c": 1.0})
    assert [step.name for step in sequence] == ["a", "b", "c"]
    assert sequence[1] == KernelStep("b", 20.0, 5.0)
    # Three tokens hold no whole token with the kernel before it.
    assert kernel_sequence(profile_totals(_tokens(3))["spans"], {"a": 1.0}) == []


def test_totals_split_kernels_copies_memsets_and_runtime_calls():
    events = [
        _event("k", 0, 10),
        _event("Memcpy HtoD (Pinned -> Device)", 5, 25),
        _event("Memset (Device)", 30, 31),
        _event("cudaStreamSynchronize", 0, 40, cuda=False),
        _event("aten::add", 0, 3, cuda=False, own=2000.0),
        _event("aten::add", 4, 6, cuda=False, own=500.0),
    ]
    totals = profile_totals(events)
    assert totals["kernels"] == 2  # the memset runs on the device, outside the sequence
    assert [s[2] for s in totals["spans"]] == ["k"]
    assert totals["kernel_busy_ms"] == pytest.approx(0.011)
    assert totals["copy_busy_ms"] == pytest.approx(0.020)
    assert totals["runtime_calls"] == {"cudaStreamSynchronize": 1}
    assert totals["host_calls"] == {"aten::add": 2}
    assert totals["host_ms"]["aten::add"] == pytest.approx(2.5)  # their own time, not spans


def test_summary_is_the_difference_per_token_and_the_report_lists_it():
    base = {**profile_totals(_tokens(1)), "wall_ms": 1.0}
    full = {**profile_totals(_tokens(9)), "wall_ms": 3.0}
    summary = summarize(full, base, 8, top=2)
    assert summary["profiled_wall_ms_per_token"] == pytest.approx(0.25)
    assert summary["kernels_per_token"] == 3
    assert summary["top_kernel_calls_per_token"] == {"a": 1.0, "b": 1.0}
    assert summary["top_kernels_ms_per_token"] == {"c": 0.03, "b": 0.02}
    assert [s[0] for s in summary["sequence"]] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="profiled tokens must be >= 1"):
        summarize(full, base, 0, top=2)
    result = {"model": "m", "budget_gb": 14.0, "tpot_ms": 12.5, **summary}
    text = format_step_trace(result)
    assert text.startswith("m at 14 GB: TPOT 12.50 ms; per profiled token: wall 0.250 ms")
    assert "| 2 | b | 20.00 | 5.00 |" in text
    assert "sequence: 3 kernels, 60.0 us running, 40.0 us idle between them" in text
    assert "none recorded" in format_step_trace({**result, "budget_gb": None, "sequence": []})
    assert format_step_trace({**result, "batch": 4}).startswith(
        "m at 14 GB, 4 sequences a step: TPOT 12.50 ms"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profiled", "0"], "expected an int >= 1"),
        (["--gpu-memory-gb", "-3"], "GPU memory budget must be"),
        (["--device", "cpu"], "profiles CUDA kernels"),
        (["--batch", "0"], "expected an int >= 1"),
        (["--batch", "4", "--device", "cpu"], "profiles CUDA kernels"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(capsys, argv, message):
    assert main(["step-trace", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_batch_flag_reaches_the_config():
    from specter_bench.cli import build_parser
    from specter_bench.commands.step_trace import config_from_args

    parser = build_parser()
    assert config_from_args(parser.parse_args(["step-trace", "--batch", "8"])).batch == 8
    assert config_from_args(parser.parse_args(["step-trace"])).batch == 0

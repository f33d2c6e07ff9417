"""How a batched decode is timed from the host: per-sequence TPOT and batch throughput."""

import pytest

from specter_bench.batch_run import BatchRun, SequenceClock, json_values


def test_the_clock_times_each_sequence_after_its_first_tokens():
    clock = SequenceClock(2, started=10.0)
    clock.stamp(0, [1, 2, 3], at=11.0)  # a speculative first step commits three
    clock.stamp(1, [4], at=11.0)
    clock.stamp(1, [], at=11.5)  # nothing committed: no stamp
    clock.stamp(0, [5], at=12.0)
    clock.stamp(1, [6, 7], at=12.0)
    clock.stamp(1, [8], at=13.0)
    assert clock.tokens == [[1, 2, 3, 5], [4, 6, 7, 8]]
    assert clock.tpot_s() == [pytest.approx(1.0), pytest.approx(2.0 / 3)]
    assert clock.window() == (pytest.approx(1.0), pytest.approx(2.0), 4)


def test_a_sequence_without_later_tokens_has_no_tpot():
    clock = SequenceClock(2, started=0.0)
    clock.stamp(0, [1], at=1.0)
    assert clock.tpot_s() == [None, None]
    prefill, decode, later = clock.window()
    assert (prefill, decode, later) == (1.0, 0.0, 0)


def test_batch_run_figures():
    run = BatchRun("offload", [[1, 2, 3], [4, 5, 6]], prefill_s=1.0, decode_s=2.0,
                   decode_tokens=4, tpot_s=[1.0, 0.5])  # fmt: skip
    assert run.batch_size == 2
    assert run.mean_tpot_s == pytest.approx(0.75)
    assert run.throughput == pytest.approx(2.0)
    assert run.end_to_end_throughput == pytest.approx(2.0)
    idle = BatchRun("offload", [[1]], prefill_s=1.0, decode_s=0.0, decode_tokens=0,
                    tpot_s=[None])  # fmt: skip
    assert idle.mean_tpot_s is None
    assert idle.throughput is None


def test_json_values_keep_plain_values_only():
    stats = {"a": 1, "b": [1.5, object(), "x"], "c": {"d": None, "e": object()}, 3: True}
    assert json_values(stats) == {"a": 1, "b": [1.5, "x"], "c": {"d": None}, "3": True}

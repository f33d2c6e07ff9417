"""What users feel: time to first token per prompt length, load time, memory against the
budget."""

import pytest

from specter_bench.bench_record import ExperimentRecord
from specter_bench.user_tables import load_table, memory_use_table, ttft_table


def _ttft(system, length, ttft_ms, run_index, matches=None):
    data = {
        "system": system, "prompt_tokens": length, "run_index": run_index, "ttft_ms": ttft_ms,
        "prefill_ms": ttft_ms - 1.0, "tpot_ms": 2.0, "new_tokens": 8,
        "driver_peak_gpu_memory_gb": None, "matches_reference": matches,
        "speculation": "on (depth auto)" if system == "specter" else "off",
    }  # fmt: skip
    return ExperimentRecord("ttft", "deepseek-v2-lite", 24.0, data).as_dict()


def test_ttft_rows_hold_the_median_and_range_of_the_runs_per_length():
    records = [
        _ttft("offload", 512, t, i, matches=True) for i, t in enumerate((30.0, 10.0, 20.0))
    ] + [_ttft("specter", 512, 40.0, 0), _ttft("specter", 8192, 400.0, 0)]
    lines = ttft_table(records).splitlines()
    assert "| TTFT ms | TTFT range | runs |" in lines[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [(r[2], r[3]) for r in rows] == [("offload", "512"), ("specter", "512"),
                                             ("specter", "8192")]  # fmt: skip
    assert rows[0][4:8] == ["20.00", "10.0-30.0", "3", "19.00"]
    assert rows[0][-2:] == ["3/3", "off"]
    assert rows[1][5] == "-"  # one run: no range


def _memory(budget, **data):
    base = {"with_draft": True, "systems": ["specter"], "measured_peak_gb": 23.1}
    identity = {"weights": "checkpoint /ckpt/dsv2"}
    return ExperimentRecord("memory", "deepseek-v2-lite", budget, {**base, **data},
                            identity).as_dict()  # fmt: skip


def test_memory_against_the_budget_and_load_time_from_the_process_start():
    gpu = _memory(
        24.0, driver_peak_gb=24.9, driver_before_load_gb=0.5, device_total_gb=80.0,
        host_peak_rss_gb=40.2, host_pinned_gb=29.5, load_s=21.0, process_to_loaded_s=30.5,
        process_to_first_token_s=33.0, first_load_in_process=True,
    )  # fmt: skip
    cpu = _memory(None, driver_peak_gb=None, host_peak_rss_gb=0.8, host_pinned_gb=0.0)
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in memory_use_table([cpu, gpu]).splitlines()[2:]
    ]
    assert rows[0][:7] == ["deepseek-v2-lite", "24 GB", "specter", "23.10", "24.90", "0.90",
                           "0.50"]  # fmt: skip
    assert rows[1][3:6] == ["23.10", "-", "-"]  # no driver view on a CPU
    load = load_table([cpu, gpu]).splitlines()
    assert len(load) == 3  # the CPU load recorded no time from the process start
    cells = [c.strip() for c in load[2].strip("|").split("|")]
    assert cells[3:] == ["checkpoint /ckpt/dsv2", "21.00", "30.50", "33.00", "yes"]
    assert float(cells[5]) <= float(cells[6])


@pytest.mark.parametrize("table", [ttft_table, memory_use_table, load_table])
def test_no_records_give_a_header_only(table):
    assert table([]).count("\n") == 2

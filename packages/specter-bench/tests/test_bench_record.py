"""JSON-lines records: round trip, checks on read, non-finite numbers."""

import json
import math

import pytest

from specter_bench.bench_record import (
    ExperimentRecord,
    TpotRecord,
    append_records,
    budget_label,
    read_records,
)


def _tpot(**kw):
    base = {
        "system": "specter",
        "model": "tiny-dsv2",
        "budget_gb": 24.0,
        "prompt_source": "humaneval",
        "prompt_id": "HumanEval/0",
        "prompt_tokens": 31,
        "new_tokens": 16,
        "tpot_ms": 3.5,
        "tokens_per_s": 285.7,
        "prefill_ms": 12.0,
        "decode_ms": 56.0,
        "identity": {"git_commit": "abc", "weights": "random (seed 0)"},
    }
    base.update(kw)
    return TpotRecord(**base)


def test_records_round_trip_and_append(tmp_path):
    path = tmp_path / "sub" / "results.jsonl"
    first = _tpot(acceptance_rate=0.9, slots_per_layer=[4, 4], extra={"per_layer": [1, 2]})
    exp = ExperimentRecord("working_set", "tiny-dsv2", None, {"curve": [{"depth": 1, "mean": 6.0}]})
    assert append_records(path, [first, exp]) == 2
    assert append_records(path, [_tpot(system="lru", tpot_ms=float("nan"))]) == 1
    records = read_records(path)
    assert [r["kind"] for r in records] == ["tpot", "working_set", "tpot"]
    assert records[0] == json.loads(json.dumps(first.as_dict()))
    assert records[0]["schema"] == 1
    assert records[1]["data"]["curve"][0]["mean"] == 6.0
    assert records[2]["tpot_ms"] is None  # NaN is not JSON: written as null
    assert read_records([path, path]) == records + records


def test_read_records_names_bad_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps(_tpot().as_dict())
    path.write_text(good + "\n" + json.dumps({"kind": "tpot", "system": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"line 2: a 'tpot' record lacks \['model'"):
        read_records(path)
    path.write_text(json.dumps({"kind": "mystery"}) + "\n")
    with pytest.raises(ValueError, match="line 1: unknown record kind 'mystery'"):
        read_records(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        read_records(path)
    with pytest.raises(FileNotFoundError, match=r"nothing\.jsonl"):
        read_records(tmp_path / "nothing.jsonl")


def test_experiment_kinds_are_checked_and_budgets_labelled():
    with pytest.raises(ValueError, match="unknown experiment record kind 'tpot'"):
        ExperimentRecord("tpot", "m", None, {})
    with pytest.raises(TypeError, match="cannot write a int"):
        append_records("/dev/null", [3])
    assert budget_label(None) == "unlimited"
    assert budget_label(24.0) == "24 GB"
    assert budget_label(14.5) == "14.5 GB"
    assert math.isnan(float("nan"))

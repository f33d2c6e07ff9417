"""The timing client's arithmetic and its load run against a fake engine."""

from __future__ import annotations

import pytest

from serve.conftest import MODEL
from serve.fake_engine import FakeEngine
from specter_bench.serve.client import percentile, run_load, stream_completion


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


def test_stream_completion_times_a_stream(start_server):
    server = start_server(FakeEngine("abcdef", step_s=0.01))
    body = {"model": MODEL, "prompt": "p", "max_tokens": 5}
    timing = stream_completion(server.url, body)
    assert timing.status == 200
    assert timing.text == "abcde"
    assert timing.tokens == 5
    assert 0 < timing.ttft_s <= timing.total_s
    assert timing.tpot_s > 0
    assert timing.stats["stop_reason"] == "max_new_tokens"
    assert stream_completion(server.url, {**body, "model": "other"}).status == 404


def test_run_load_answers_every_request(start_server):
    server = start_server(FakeEngine("xy", step_s=0.002))
    report = run_load(server.url, MODEL, ["a", "b"], clients=3, requests_per_client=2, max_tokens=4)
    assert report.answered == 6
    assert report.refused == []
    assert report.tokens_per_s > 0
    assert report.latency_s["p50"] <= report.latency_s["p99"]
    assert "6 answered" in report.describe()

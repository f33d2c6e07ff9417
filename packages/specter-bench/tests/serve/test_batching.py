"""Continuous batching (``max_batch`` > 1) over the fake engine's batch session: requests
join the running batch at step boundaries up to the maximum, leave when done or cancelled,
and the queue, timeouts and metrics behave as in one-at-a-time serving."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve.conftest import MODEL
from serve.fake_engine import BatchFullError, FakeEngine


def _post(server, body: dict, **kw) -> httpx.Response:
    kw.setdefault("timeout", 30)
    return httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body}, **kw)


def _concurrently(server, bodies: list[dict]) -> list[httpx.Response]:
    out: list[httpx.Response | None] = [None] * len(bodies)

    def send(i: int) -> None:
        out[i] = _post(server, bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def _metric(server, name: str) -> str:
    text = httpx.get(server.url + "/metrics").text
    return next(line for line in text.splitlines() if line.startswith(name + " "))


def test_concurrent_requests_share_the_batch_up_to_its_maximum(start_server):
    engine = FakeEngine("abcdefgh", step_s=0.02, max_batch=3)
    server = start_server(engine, max_batch=3)
    bodies = [{"prompt": "p", "max_tokens": n} for n in (5, 8, 3, 6, 7)]
    answers = _concurrently(server, bodies)
    assert [r.status_code for r in answers] == [200] * 5
    assert [r.json()["choices"][0]["text"] for r in answers] == [
        "abcde", "abcdefgh", "abc", "abcdef", "abcdefg",
    ]  # fmt: skip
    assert [r.json()["usage"]["completion_tokens"] for r in answers] == [5, 8, 3, 6, 7]
    assert all(r.json()["specter"]["acceptance_rate"] == 0.5 for r in answers)
    session = engine.sessions[-1]
    assert session.peak == 3  # three ran at once, never more
    # Five requests of 29 tokens in all take fewer steps together than one after another.
    assert session.steps < 29
    assert not engine.generations  # nothing went through one-at-a-time generate
    assert _metric(server, "specter_batch_size") == "specter_batch_size 0.0"
    assert _metric(server, "specter_requests_running") == "specter_requests_running 0.0"


def test_a_request_joins_the_running_batch_at_a_step_boundary(start_server):
    engine = FakeEngine("x", step_s=0.02, max_batch=2)
    server = start_server(engine, max_batch=2)
    long = threading.Thread(target=_post, args=(server, {"prompt": "p", "max_tokens": 100}))
    long.start()
    time.sleep(0.3)  # the long generation runs alone
    started = time.monotonic()
    short = _post(server, {"prompt": "p", "max_tokens": 3})
    assert short.json()["choices"][0]["text"] == "xxx"
    assert time.monotonic() - started < 1.0  # not behind the long one's two seconds
    long.join(30)
    assert engine.sessions[-1].peak == 2


def test_a_disconnect_frees_its_place_in_the_batch(start_server):
    engine = FakeEngine("y", step_s=0.02, max_batch=2)
    server = start_server(engine, max_batch=2, max_queue=0)
    other = threading.Thread(target=_post, args=(server, {"prompt": "p", "max_tokens": 60}))
    other.start()
    body = {"model": MODEL, "prompt": "p", "max_tokens": 240, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk read, then the client goes away
    session = engine.sessions[-1]
    deadline = time.monotonic() + 5
    while not session.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(session.cancelled) == 1
    # The freed place takes a new request while the other one still runs (the queue holds
    # none: without the place it would get 429).
    r = _post(server, {"prompt": "p", "max_tokens": 2})
    assert r.status_code == 200
    other.join(30)
    assert 'reason="disconnect"} 1.0' in httpx.get(server.url + "/metrics").text


def test_a_full_batch_and_queue_answer_429(start_server):
    engine = FakeEngine(step_s=0.05, max_batch=2)
    server = start_server(engine, max_batch=2, max_queue=1)
    body = {"prompt": "p", "max_tokens": 30}
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(_post(server, body).status_code))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
        time.sleep(0.15)  # two run, the third waits
    r = _post(server, body)
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert "while 2 generate" in r.json()["error"]["message"]
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]


def test_stop_tokens_strings_and_timeouts_end_sequences_of_the_batch(start_server):
    engine = FakeEngine("abcdefgh", step_s=0.05, eos_at=6, max_batch=3)
    server = start_server(engine, max_batch=3, request_timeout_s=1.0)
    eos, stop, timeout = _concurrently(
        server,
        [
            {"prompt": "p", "max_tokens": 10},
            {"prompt": "p", "max_tokens": 10, "stop": ["b"]},
            {"prompt": "p", "max_tokens": 240, "ignore_eos": True},
        ],
    )
    assert eos.json()["choices"][0]["text"] == "abcdef"
    assert eos.json()["specter"]["stop_reason"] == "stop_token"
    assert stop.json()["choices"][0]["text"] == "a"
    assert stop.json()["specter"]["stop_reason"] == "stop_string"
    assert timeout.json()["specter"]["stop_reason"] == "timeout"
    assert 0 < timeout.json()["usage"]["completion_tokens"] < 240


def test_streamed_batched_chunks_join_to_the_text(start_server):
    engine = FakeEngine("the quick brown fox", tokens_per_step=3, step_s=0.01, max_batch=2)
    server = start_server(engine, max_batch=2)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 11, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    assert "".join(e["choices"][0]["text"] for e in events) == "the quick b"
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_engine_errors_reach_the_request_and_the_server_lives_on(start_server):
    engine = FakeEngine(step_s=0.01, max_batch=2)
    server = start_server(engine, max_batch=2)
    engine.fail_with = ValueError("the prompt is too long for the batch")
    r = _post(server, {"prompt": "p", "max_tokens": 4})
    assert r.status_code == 400
    assert "too long" in r.json()["error"]["message"]
    engine.fail_with = None
    engine.fail_step = RuntimeError("device lost")
    r = _post(server, {"prompt": "p", "max_tokens": 4})
    assert r.status_code == 500
    assert "device lost" in r.json()["error"]["message"]
    engine.fail_step = None
    assert _post(server, {"prompt": "p", "max_tokens": 4}).status_code == 200
    assert len(engine.sessions) == 2  # a new session after the failed step


def test_depth_is_refused_when_batching(start_server):
    server = start_server(FakeEngine(max_batch=2), max_batch=2)
    r = _post(server, {"prompt": "p", "max_tokens": 2, "depth": 3})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "depth"
    assert "--max-batch 2" in r.json()["error"]["message"]


def test_an_engine_that_cannot_batch_is_a_load_error(start_server):
    engine = FakeEngine()
    engine.batch_session = None  # an engine without batching
    server = start_server(engine, max_batch=2, wait=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health")
        if health.json()["status"] == "error":
            break
        time.sleep(0.05)
    assert health.status_code == 503
    assert "serve it with --max-batch 1" in health.json()["message"]


def test_max_batch_must_be_positive():
    from specter_bench.serve.config import ServeConfig

    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        ServeConfig(model_name=MODEL, max_batch=0)


def test_the_fake_session_refuses_more_than_its_maximum():
    session = FakeEngine(max_batch=1).batch_session()
    session.add([1], max_new_tokens=2)
    with pytest.raises(BatchFullError):
        session.add([1], max_new_tokens=2)

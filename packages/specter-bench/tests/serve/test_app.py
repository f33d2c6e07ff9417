"""The HTTP application over a fake engine: endpoints, parameters, errors, queue, cancel."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve.conftest import MODEL
from serve.fake_engine import FakeEngine

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def _post(server, path: str, body: dict, **kw) -> httpx.Response:
    kw.setdefault("timeout", 30)
    return httpx.post(server.url + path, json=body, **kw)


def _events(response: httpx.Response) -> list[dict | str]:
    out: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_completion_non_streamed_has_text_usage_and_statistics(start_server):
    server = start_server(FakeEngine("abcdef"))
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "xyz", "max_tokens": 4})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "abcd"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert body["specter"]["acceptance_rate"] == 0.75
    assert body["specter"]["stop_reason"] == "max_new_tokens"


def test_streamed_chunks_join_to_the_non_streamed_text(start_server):
    server = start_server(FakeEngine("the quick brown fox", tokens_per_step=3))
    body = {"model": MODEL, "prompt": "p", "max_tokens": 11}
    plain = _post(server, "/v1/completions", body).json()["choices"][0]["text"]
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=30,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain == "the quick b"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["specter"]["mean_depth"] == 4.0
    assert events[-2]["usage"]["completion_tokens"] == 11


def test_every_decode_step_reaches_a_streaming_client_even_without_text(start_server):
    # "one t" is held back while it may still become the stop string "one tx": those steps'
    # chunks go out without text, so a client times every step as it happens.
    engine = FakeEngine("one two", tokens_per_step=1)
    server = start_server(engine)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 7, "stop": ["one tx"], "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        events = _events(r)
    steps = [e for e in events[:-1] if e["choices"][0]["finish_reason"] is None]
    # Seven steps (the last "o" held back as a possible start of the stop string), then the
    # held-back tail flushed when the generation ends.
    assert [e["choices"][0]["text"] for e in steps] == ["", "", "", "", "", "one tw", "", "o"]


def test_eos_ends_the_answer_without_its_text(start_server):
    server = start_server(FakeEngine("abcdef", eos_at=3))
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 10})
    choice = r.json()["choices"][0]
    assert choice["text"] == "abc"
    assert choice["finish_reason"] == "stop"
    assert r.json()["specter"]["stop_reason"] == "stop_token"


def test_ignore_eos_generates_past_it(start_server):
    engine = FakeEngine("abcdef", eos_at=3)
    server = start_server(engine)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 5, "ignore_eos": True}
    r = _post(server, "/v1/completions", body)
    assert engine.generations[-1].kwargs["stop"] == []
    assert r.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("tokens_per_step", [1, 2, 5])
def test_stop_strings_cut_exactly_across_chunks(start_server, tokens_per_step):
    engine = FakeEngine("one two; three four", tokens_per_step=tokens_per_step, step_s=0.02)
    server = start_server(engine)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 19, "stop": ["o; t", "zzz"]}
    r = _post(server, "/v1/completions", body)
    assert r.json()["choices"][0]["text"] == "one tw"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert r.json()["specter"]["stop_reason"] == "stop_string"
    assert engine.generations[-1].stop_reason == "cancelled"  # the engine was stopped early
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}) as s:
        text = "".join(e["choices"][0]["text"] for e in _events(s)[:-1])
    assert text == "one tw"


def test_chat_uses_the_template_and_streams_deltas(start_server):
    server = start_server(FakeEngine("hi there", chat_template=TEMPLATE))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "yo"}], "max_tokens": 5}
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "hi th"}
    assert r.json()["usage"]["prompt_tokens"] == len("<user>yo<assistant>")
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={**body, "stream": True}
    ) as s:
        events = _events(s)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "hi th"
    assert events[-2]["object"] == "chat.completion.chunk"


def test_chat_without_a_template_is_a_clear_400(start_server):
    server = start_server(FakeEngine())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "yo"}]}
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400
    assert "no chat template" in _error(r)["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"n": 2}, "n", "n=1"),
        ({"logprobs": 2}, "logprobs", "logprobs"),
        ({"max_tokens": "5"}, "max_tokens", "valid integer"),
        ({"temperature": -1}, "temperature", "greater than or equal"),
        ({"top_p": 0.5}, "temperature", "temperature > 0"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt"),
        ({"max_tokens": 300}, "max_tokens", "maximum context length is 256"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ],
)
def test_bad_parameters_get_400_naming_the_field(start_server, body, param, words):
    server = start_server(FakeEngine())
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", **body})
    assert r.status_code == 400
    error = _error(r)
    assert error["param"] == param
    assert words in error["message"]


def test_context_limit_message_says_the_limit(start_server):
    server = start_server(FakeEngine(max_positions=64))
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "x" * 50, "max_tokens": 20})
    message = _error(r)["message"]
    assert r.status_code == 400
    for words in ("64 tokens", "50 tokens", "at most 10"):
        assert words in message


def test_unknown_model_malformed_json_and_unknown_route(start_server):
    server = start_server(FakeEngine())
    r = _post(server, "/v1/completions", {"model": "gpt-9", "prompt": "p"})
    assert r.status_code == 404
    assert _error(r)["code"] == "model_not_found"
    r = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert "not valid JSON" in _error(r)["message"]
    r = httpx.get(server.url + "/v2/nothing")
    assert r.status_code == 404
    assert _error(r)["code"] == "not_found"


def test_type_errors_name_the_field_and_the_types_it_takes(start_server):
    server = start_server(FakeEngine())
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": 5})
    assert r.status_code == 400
    assert _error(r)["param"] == "prompt"
    assert "expected one of: str, list[int], list[str]" in _error(r)["message"]
    r = _post(server, "/v1/completions", [])
    assert "must be a JSON object" in _error(r)["message"]
    r = httpx.post(server.url + "/v1/completions", content=b'{"model": "fake-model"}')
    assert r.status_code == 400
    assert "Content-Type: application/json" in _error(r)["message"]


def test_models_lists_the_served_model(start_server):
    server = start_server(FakeEngine())
    data = httpx.get(server.url + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == [MODEL]
    assert data[0]["max_model_len"] == 256
    assert httpx.get(server.url + f"/v1/models/{MODEL}").status_code == 200


def test_depth_extra_field_reaches_the_engine_or_is_refused(start_server):
    engine = FakeEngine()
    server = start_server(engine)
    _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 2, "depth": 3})
    assert engine.generations[-1].kwargs["depth"] == 3
    other = start_server(FakeEngine(depth=False))
    r = _post(other, "/v1/completions", {"model": MODEL, "prompt": "p", "depth": 3})
    assert r.status_code == 400
    assert _error(r)["param"] == "depth"


def test_sampling_parameters_reach_the_engine(start_server):
    engine = FakeEngine()
    server = start_server(engine)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 2, "temperature": 0.7}
    _post(server, "/v1/completions", {**body, "top_p": 0.9, "top_k": 5, "seed": 11})
    sampling = engine.generations[-1].kwargs["sampling"]
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (
        0.7,
        0.9,
        5,
        11,
    )
    assert engine.generations[-1].kwargs["stop"] == [1]  # the tokenizer's EOS


def test_health_is_503_while_loading_then_200(start_server):
    release = threading.Event()
    engine = FakeEngine()

    def load():
        release.wait(10)
        return engine

    server = start_server(load=load, wait=False)
    deadline = time.monotonic() + 10
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert httpx.get(server.url + "/health").status_code == 503
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p"})
    assert r.status_code == 503
    assert _error(r)["code"] == "model_loading"
    release.set()
    server.wait_ready(10)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_api_key_is_required_everywhere_but_health(start_server):
    server = start_server(FakeEngine(), api_key="s3cret")
    assert httpx.get(server.url + "/health").status_code == 200
    for path in ("/v1/models", "/metrics"):
        r = httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert _error(r)["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    ok = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_oversized_bodies_get_413(start_server):
    server = start_server(FakeEngine(), max_body_bytes=200)
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "x" * 500})
    assert r.status_code == 413
    assert "200 bytes" in _error(r)["message"]

    def chunks():  # no Content-Length: the body is counted as it arrives
        yield b'{"model": "fake-model", "prompt": "'
        yield b"x" * 500
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks())
    assert r.status_code == 413


def test_engine_errors_are_500_objects_and_the_server_lives_on(start_server):
    engine = FakeEngine("abc")
    server = start_server(engine)
    engine.fail_with = RuntimeError("boom")
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p"})
    assert r.status_code == 500
    assert "boom" in _error(r)["message"]
    engine.fail_with = None
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 2})
    assert r.json()["choices"][0]["text"] == "ab"


def test_full_queue_answers_429_with_retry_after(start_server):
    engine = FakeEngine(step_s=0.05)
    server = start_server(engine, max_queue=1)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 16}
    results: list[int] = []

    def send() -> None:
        results.append(_post(server, "/v1/completions", body).status_code)

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)  # the first runs, the second waits
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    assert _error(r)["type"] == "rate_limit_error"
    for t in threads:
        t.join()
    assert results == [200, 200]


def test_the_engine_is_free_when_the_answer_arrives(start_server):
    server = start_server(FakeEngine(), max_queue=0)  # a request while one runs gets 429
    body = {"model": MODEL, "prompt": "p", "max_tokens": 2}
    with httpx.Client(base_url=server.url) as client:
        statuses = [client.post("/v1/completions", json=body).status_code for _ in range(30)]
    assert statuses == [200] * 30


def test_a_request_waiting_past_the_queue_timeout_gets_503(start_server):
    engine = FakeEngine(step_s=0.02)
    server = start_server(engine, queue_timeout_s=0.3)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 60}
    running = threading.Thread(target=_post, args=(server, "/v1/completions", body))
    running.start()
    time.sleep(0.2)
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 503
    assert _error(r)["code"] == "queue_timeout"
    assert "Retry-After" in r.headers
    running.join()
    assert len(engine.generations) == 1  # the timed-out request never reached the engine


def test_a_disconnect_cancels_the_generation_and_frees_the_engine(start_server):
    engine = FakeEngine(step_s=0.02)
    server = start_server(engine)
    body = {"model": MODEL, "prompt": "p", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk read, then the connection closes
    first = engine.generations[-1]
    assert first.finished.wait(5)
    assert first.stop_reason == "cancelled"
    assert len(first.token_ids) < 200
    started = time.monotonic()
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 2})
    assert r.status_code == 200
    assert time.monotonic() - started < 2.0  # not behind the 4 s the first would have taken
    metrics = httpx.get(server.url + "/metrics").text
    assert 'specter_generations_cancelled_total{reason="disconnect"} 1.0' in metrics


def test_a_non_streamed_disconnect_cancels_too(start_server):
    engine = FakeEngine(step_s=0.02)
    server = start_server(engine)
    with pytest.raises(httpx.ReadTimeout):
        _post(
            server,
            "/v1/completions",
            {"model": MODEL, "prompt": "p", "max_tokens": 200},
            timeout=0.3,
        )
    assert engine.generations[-1].finished.wait(5)
    assert engine.generations[-1].stop_reason == "cancelled"


def test_request_timeout_answers_what_was_generated(start_server):
    engine = FakeEngine(step_s=0.02)
    server = start_server(engine, request_timeout_s=0.2)
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 200})
    body = r.json()
    assert r.status_code == 200
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["specter"]["stop_reason"] == "timeout"
    assert 0 < body["usage"]["completion_tokens"] < 200


def test_fifty_bad_requests_leave_the_server_healthy(start_server):
    server = start_server(FakeEngine("ok"))
    bad = [b"", b"{", b"[]", b'{"model": 1}', b'{"model": "fake-model", "prompt": 5}', b"\xff\xfe"]
    with httpx.Client(base_url=server.url) as client:
        for i in range(50):
            r = client.post(
                "/v1/completions",
                content=bad[i % len(bad)],
                headers={"content-type": "application/json"},
            )
            assert 400 <= r.status_code < 500
            _error(r)
        assert client.get("/health").status_code == 200
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 2})
        assert r.json()["choices"][0]["text"] == "ok"


def test_metrics_count_requests_tokens_and_decoding_figures(start_server):
    server = start_server(FakeEngine())
    _post(server, "/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 5})
    _post(server, "/v1/completions", {"model": "nope", "prompt": "abc"})
    r = httpx.get(server.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        'specter_requests_total{endpoint="/v1/completions",status="200"} 1.0',
        'specter_requests_total{endpoint="/v1/completions",status="404"} 1.0',
        "specter_prompt_tokens_total 3.0",
        "specter_generation_tokens_total 5.0",
        "specter_draft_proposed_tokens_total 4.0",
        "specter_draft_accepted_tokens_total 3.0",
        "specter_host_to_device_bytes_total 1000.0",
        "specter_acceptance_rate_sum 0.75",
        "specter_expert_cache_hit_rate_sum 0.5",
        "specter_prefetch_precision_sum 0.9",
        "specter_prefetch_recall_sum 0.8",
        "specter_speculation_depth_sum 4.0",
        "specter_time_to_first_token_seconds_count 1.0",
        "specter_time_per_output_token_seconds_count 1.0",
        "specter_queue_depth 0.0",
    ):
        assert line in text, line

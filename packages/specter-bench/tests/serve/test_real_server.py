"""``specter serve`` as a subprocess on the built-in demo model (CPU), driven by the
official ``openai`` client and by raw HTTP.

One server serves the whole module (``--max-queue 7``: eight requests in flight at most,
one generating), with an API key and a chat template, since the demo's tokenizer has none.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from serve.serve_subprocess import serve_subprocess
from specter_bench.cli import main
from specter_bench.serve.client import run_load

MODEL = "specter-code-tiny"
KEY = "test-key"
PROMPT = 'def is_even(n):\n    """Return True when n is even."""\n'
TEMPLATE = "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}# answer:\n"


class RunningServer:
    def __init__(self, process: subprocess.Popen, url: str, log: list[str]) -> None:
        self.process = process
        self.url = url
        self.log = log

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=300)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    template = tmp_path_factory.mktemp("serve") / "chat.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    options = ["--api-key", KEY, "--max-queue", "7", "--chat-template", str(template)]
    with serve_subprocess(options) as (process, url, log):
        yield RunningServer(process, url, log)


def _greedy(server: RunningServer, prompt: str, max_tokens: int, **extra) -> str:
    response = server.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **extra
    )
    return response.choices[0].text


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert [m.id for m in server.client().models.list().data] == [MODEL]


def test_greedy_output_equals_specter_generate(server, capsys):
    tokens = 12
    served = _greedy(server, PROMPT, tokens)
    status = main(
        ["generate", PROMPT, "--device", "cpu", "--max-new-tokens", str(tokens), "--no-stream"]
    )
    assert status == 0
    out = capsys.readouterr().out
    assert out.startswith(PROMPT)
    generated = out[len(PROMPT) :].split("\n" + "-" * 40)[0]
    generated = generated.split("<|endoftext|>")[0]  # the server leaves EOS's text out
    assert served == generated
    assert len(served) > 0


def test_streamed_text_equals_non_streamed_text_for_the_same_seed(server):
    client = server.client()
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 7, "max_tokens": 10}
    plain = client.completions.create(model=MODEL, prompt=PROMPT, **sampled)
    stream = client.completions.create(model=MODEL, prompt=PROMPT, stream=True, **sampled)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert plain.usage.prompt_tokens > 0
    assert plain.usage.completion_tokens <= 10

    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, **sampled)
    chat_stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, **sampled
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chat_stream if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant"


def test_final_chunk_carries_the_statistics(server):
    stream = server.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True
    )
    last = list(stream)[-1]
    stats = last.model_extra["specter"]
    assert stats["new_tokens"] == 6
    assert stats["stop_reason"] == "max_new_tokens"
    assert 0 <= stats["acceptance_rate"] <= 1


def test_stop_strings_cut_exactly_across_token_boundaries(server):
    client = server.client()
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True
        )
    ]
    full = "".join(pieces)
    # A stop string straddling a boundary between two streamed pieces.
    stop = None
    at = 0
    for piece in pieces[:-1]:
        at += len(piece)
        candidate = full[at - 1 : at + 2]
        if at >= 2 and len(candidate) == 3 and full.find(candidate) == at - 1:
            stop = candidate
            break
    assert stop is not None, pieces
    cut = _greedy(server, PROMPT, 16, stop=[stop])
    assert cut == full[: at - 1]
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_disconnect_frees_the_engine(server):
    cancelled = server.metric('specter_generations_cancelled_total{reason="disconnect"}')
    tokens_before = server.metric("specter_generation_tokens_total")
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=300
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # the first chunk, then the client goes away
    started = time.monotonic()
    assert _greedy(server, "x = ", 2) is not None
    waited = time.monotonic() - started
    assert server.metric('specter_generations_cancelled_total{reason="disconnect"}') == (
        cancelled + 1
    )
    generated = server.metric("specter_generation_tokens_total") - tokens_before
    assert generated < 900  # the long generation stopped early, so the next one ran
    print(f"the next request finished {waited:.2f} s after the disconnect")


def test_a_full_queue_answers_429_with_retry_after(server):
    # One long generation runs; nine long requests arrive behind it for seven queue places.
    # Each holds its place for hundreds of steps, so however fast the machine, at least one
    # of the nine finds the queue full; once it has, every client leaves (a disconnect
    # cancels its generation at its first step).
    headers = {"Authorization": f"Bearer {KEY}"}
    long_body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 900, "stream": True}
    long_body["ignore_eos"] = True  # it runs until the client goes away
    refusals: list[httpx.Response] = []
    statuses: list[int] = []
    leave = threading.Event()

    def arrive() -> None:
        with (
            httpx.Client(base_url=server.url, headers=headers, timeout=300) as own,
            own.stream("POST", "/v1/completions", json=long_body) as response,
        ):
            statuses.append(response.status_code)
            if response.status_code == 429:
                response.read()
                refusals.append(response)
                leave.set()
            leave.wait(300)

    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=300) as http,
        http.stream("POST", "/v1/completions", json=long_body) as running,
    ):
        for line in running.iter_lines():
            if line.startswith("data: "):
                break  # generating now
        arrivals = [threading.Thread(target=arrive) for _ in range(9)]
        for thread in arrivals:
            thread.start()
        assert leave.wait(120), "no request was refused with seven queue places taken"
    for thread in arrivals:
        thread.join(300)
    assert statuses.count(429) >= 1
    assert set(statuses) <= {200, 429}
    refused = refusals[0]
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert server.metric("specter_queue_depth") == 0


def test_a_bad_api_key_gets_401(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200


def test_over_the_context_length_is_a_400_naming_the_limit(server):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
        server.client().completions.create(model=MODEL, prompt="x" * 3000, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="n=1"):
        server.client().completions.create(model=MODEL, prompt="x", max_tokens=4, n=2)


def test_fifty_bad_requests_leave_the_server_healthy(server):
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    bad = [
        b"{",
        b"[]",
        b'{"model": "nope", "prompt": "x"}',
        b'{"model": "specter-code-tiny", "prompt": "x", "max_tokens": "many"}',
        b'{"model": "specter-code-tiny", "prompt": "x", "temperature": 9}',
        b'{"model": "specter-code-tiny", "messages": "hi"}',
    ]
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        for i in range(50):
            path = "/v1/chat/completions" if i % 6 == 5 else "/v1/completions"
            r = http.post(path, content=bad[i % len(bad)])
            assert 400 <= r.status_code < 500, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert "Traceback" not in r.text
        assert http.get("/health").status_code == 200
    assert _greedy(server, "z = ", 2) is not None


def test_metrics_report_the_decoding(server):
    _greedy(server, PROMPT, 4)
    assert server.metric("specter_time_to_first_token_seconds_count") >= 1
    assert server.metric("specter_time_per_output_token_seconds_count") >= 1
    assert server.metric("specter_acceptance_rate_count") >= 1
    assert server.metric("specter_draft_proposed_tokens_total") > 0
    assert server.metric("specter_host_to_device_bytes_total") > 0
    assert server.metric("specter_expert_cache_hit_rate_count") >= 1


def test_load_of_eight_clients_is_answered_completely(server):
    prompts = [PROMPT, "import os\n", "class Stack:\n", "def main():\n"]
    report = run_load(
        server.url, MODEL, prompts, clients=8, requests_per_client=5, max_tokens=4, api_key=KEY
    )
    print("\n" + report.describe())
    assert report.answered == 40
    assert report.refused == []

"""``specter serve --max-batch 3`` as a subprocess on the built-in demo model (CPU):
continuous batching on the real engine, driven by raw HTTP.

One server serves the module: concurrent clients get the greedy text sequential requests
get (and ``specter generate`` decodes), a client that disconnects mid-stream frees its
place in the batch, and a load of eight clients is answered completely.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from serve.serve_subprocess import serve_subprocess
from specter_bench.cli import main
from specter_bench.serve.client import run_load

MODEL = "specter-code-tiny"
PROMPTS = [
    'def is_even(n):\n    """Return True when n is even."""\n',
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
]


class BatchingServer:
    def __init__(self, process: subprocess.Popen, url: str, log: list[str]) -> None:
        self.process = process
        self.url = url
        self.log = log

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def complete(self, prompt: str, max_tokens: int) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        r = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def stream(self, prompt: str, max_tokens: int, **extra) -> tuple[str, float, float]:
        """The streamed text, and the times of its first and last chunks."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "temperature": 0, **extra}  # fmt: skip
        text, first, last = "", None, 0.0
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    now = time.monotonic()
                    first = first if first is not None else now
                    last = now
                    text += json.loads(line[6:])["choices"][0]["text"]
        assert first is not None
        return text, first, last


@pytest.fixture(scope="module")
def server() -> Iterator[BatchingServer]:
    with serve_subprocess(["--max-batch", "3", "--max-queue", "16"]) as (process, url, log):
        yield BatchingServer(process, url, log)


def test_concurrent_clients_get_the_sequential_greedy_text(server, capsys):
    tokens = 24
    sequential = [server.complete(p, tokens) for p in PROMPTS]
    results: list[tuple[str, float, float] | None] = [None] * len(PROMPTS)

    def send(i: int) -> None:
        results[i] = server.stream(PROMPTS[i], tokens)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r is not None for r in results)
    assert [r[0] for r in results] == sequential  # type: ignore[index]
    # They decoded together: each stream's first chunk came before every other's last.
    firsts = [r[1] for r in results]  # type: ignore[index]
    lasts = [r[2] for r in results]  # type: ignore[index]
    assert max(firsts) < min(lasts)
    # And one-sequence decoding (specter generate, the engine's generate) agrees.
    assert main(["generate", PROMPTS[0], "--device", "cpu", "--max-new-tokens", str(tokens),
                 "--no-stream"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    generated = out[len(PROMPTS[0]) :].split("\n" + "-" * 40)[0].split("<|endoftext|>")[0]
    assert sequential[0] == generated


def test_a_disconnect_mid_stream_frees_its_place(server):
    cancelled = server.metric('specter_generations_cancelled_total{reason="disconnect"}')
    long = {"max_tokens": 300, "ignore_eos": True}
    done: list[float] = []

    def stay() -> None:
        server.stream(PROMPTS[1], **long)
        done.append(time.monotonic())

    staying = [threading.Thread(target=stay) for _ in range(2)]
    for t in staying:
        t.start()
    body = {"model": MODEL, "prompt": PROMPTS[2], "stream": True, **long}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # the first chunk, then the client goes away
    # The batch holds three: the two long ones and, once the third left, this one.
    answered = server.complete("x = ", 4)
    answered_at = time.monotonic()
    assert answered is not None
    assert server.metric('specter_generations_cancelled_total{reason="disconnect"}') == (
        cancelled + 1
    )
    for t in staying:
        t.join(600)
    assert len(done) == 2
    assert answered_at < min(done)  # it did not wait for a long one to finish
    assert server.metric("specter_batch_size") == 0
    assert server.metric("specter_queue_depth") == 0


def test_load_of_eight_clients_is_answered_completely(server):
    prompts = [*PROMPTS, "def main():\n"]
    report = run_load(server.url, MODEL, prompts, clients=8, requests_per_client=5, max_tokens=4)
    print("\n" + report.describe())
    assert report.answered == 40
    assert report.refused == []

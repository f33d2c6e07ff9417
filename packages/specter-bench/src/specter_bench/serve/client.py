"""A small streaming client that times the server: time to first token, time per output
token, and a bounded load of concurrent clients with throughput and latency percentiles.

It speaks plain HTTP (the standard library's ``http.client``) so that measuring needs no
dependency beyond the server's own.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LoadReport", "StreamTiming", "percentile", "run_load", "stream_completion"]


@dataclass(frozen=True)
class StreamTiming:
    """One streamed completion as its client saw it.

    Attributes:
        ttft_s: from sending the request to the first decode step's chunk (with or without text).
        tpot_s: from the first to the last decode step's chunk per further token (None below two
            tokens).
        total_s: from sending the request to ``[DONE]``.
        tokens: completion tokens (``usage``).
        text: the streamed text.
        status: the HTTP status.
        stats: the final chunk's ``specter`` statistics.
    """

    ttft_s: float | None
    tpot_s: float | None
    total_s: float
    tokens: int
    text: str
    status: int
    stats: dict[str, Any] = field(default_factory=dict)


def stream_completion(
    url: str,
    body: dict[str, Any],
    *,
    api_key: str | None = None,
    timeout_s: float = 600.0,
) -> StreamTiming:
    """POST a streamed ``/v1/completions`` request and time its chunks.

    Args:
        url: the server's ``http://host:port``.
        body: the request body (``stream`` and ``stream_options.include_usage`` are set).

    Returns:
        The timing; a refused request (4xx/5xx) has its status, no tokens and no times.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = dict(body, stream=True, stream_options={"include_usage": True})
    started = time.perf_counter()
    first = last = None
    text, tokens, stats = "", 0, {}
    try:
        conn.request("POST", "/v1/completions", json.dumps(payload), headers)
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            return StreamTiming(None, None, time.perf_counter() - started, 0, "", response.status)
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the server failed mid-stream: {chunk['error']['message']}")
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", ()):
                if choice.get("finish_reason") is None:  # a decode step's chunk, text or not
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                text += choice.get("text") or ""
            if chunk.get("specter"):
                stats = chunk["specter"]
    finally:
        conn.close()
    total = time.perf_counter() - started
    ttft = None if first is None else first - started
    tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return StreamTiming(ttft, tpot, total, tokens, text, 200, stats)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation (None: empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class LoadReport:
    """What a load run measured.

    Attributes:
        clients, requests_per_client: the load's shape.
        answered: requests answered 200; ``refused``: status codes of the others.
        wall_s: the run's wall time.
        requests_per_s, tokens_per_s: throughput over the wall time.
        latency_s, ttft_s, tpot_s: p50/p90/p99 (and mean) of each request's figures.
    """

    clients: int
    requests_per_client: int
    answered: int
    refused: list[int]
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    latency_s: dict[str, float | None]
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """A few lines for a terminal or a test log."""

        def row(name: str, values: dict[str, float | None]) -> str:
            shown = ", ".join(
                f"{k} {1e3 * v:.1f} ms" if v is not None else f"{k} -" for k, v in values.items()
            )
            return f"  {name:<8} {shown}"

        return "\n".join(
            [
                f"{self.clients} clients x {self.requests_per_client} requests: "
                f"{self.answered} answered, {len(self.refused)} refused in {self.wall_s:.2f} s "
                f"({self.requests_per_s:.2f} requests/s, {self.tokens_per_s:.1f} tokens/s)",
                row("latency", self.latency_s),
                row("TTFT", self.ttft_s),
                row("TPOT", self.tpot_s),
            ]
        )


def _summary(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def run_load(
    url: str,
    model: str,
    prompts: Sequence[str],
    *,
    clients: int = 8,
    requests_per_client: int = 5,
    max_tokens: int = 16,
    api_key: str | None = None,
) -> LoadReport:
    """``clients`` threads each send ``requests_per_client`` streamed greedy completions
    one after another (prompts taken in turn) and time them.

    Raises:
        ValueError: no prompts, or a load of no requests.
    """
    if not prompts:
        raise ValueError("run_load needs at least one prompt")
    if clients < 1 or requests_per_client < 1:
        raise ValueError(f"a load of {clients} clients x {requests_per_client} requests is empty")
    timings: list[StreamTiming] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for j in range(requests_per_client):
            prompt = prompts[(index * requests_per_client + j) % len(prompts)]
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            try:
                timing = stream_completion(url, body, api_key=api_key)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                timings.append(timing)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed; the first: {errors[0]!r}")
    ok = [t for t in timings if t.status == 200]
    return LoadReport(
        clients=clients,
        requests_per_client=requests_per_client,
        answered=len(ok),
        refused=[t.status for t in timings if t.status != 200],
        wall_s=wall,
        requests_per_s=len(ok) / wall,
        tokens_per_s=sum(t.tokens for t in ok) / wall,
        latency_s=_summary([t.total_s for t in ok]),
        ttft_s=_summary([t.ttft_s for t in ok if t.ttft_s is not None]),
        tpot_s=_summary([t.tpot_s for t in ok if t.tpot_s is not None]),
    )

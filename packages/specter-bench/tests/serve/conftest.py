"""Fixtures of the server's tests: a server on a background thread over a fake engine."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest

MODEL = "fake-model"

_SERVER = ("fastapi", "uvicorn", "prometheus_client", "httpx")
_missing = [name for name in _SERVER if importlib.util.find_spec(name) is None]
# Where specter-bench's dependencies and test group are not installed (a machine without
# internet access that lacks their wheels), the server's tests are not collected.
collect_ignore = [
    name
    for name in (
        "test_app.py",
        "test_client.py",
        "test_measure.py",
        "test_metrics.py",
        "test_real_server.py",
        "test_real_batching.py",
        "test_serve_command.py",
    )
    if _missing or (name == "test_real_server.py" and importlib.util.find_spec("openai") is None)
]


@pytest.fixture
def start_server() -> Iterator[Callable[..., Any]]:
    """``start_server(engine, load=None, **config)``: a ready server on 127.0.0.1:0 over
    ``engine`` (or whatever ``load`` returns), stopped after the test."""
    from specter_bench.serve.config import ServeConfig
    from specter_bench.serve.server import BackgroundServer, start_background

    servers: list[BackgroundServer] = []

    def start(
        engine: Any = None,
        *,
        load: Callable[[], Any] | None = None,
        wait: bool = True,
        **config: Any,
    ) -> BackgroundServer:
        settings = {"model_name": MODEL, "port": 0, **config}
        server = start_background(ServeConfig(**settings), load or (lambda: engine))
        servers.append(server)
        if wait:
            server.wait_ready(30)
        return server

    yield start
    for server in servers:
        server.stop()

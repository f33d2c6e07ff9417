"""Fixtures of the server's tests: a server on a background thread over a fake engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from specter_bench.serve.config import ServeConfig
from specter_bench.serve.server import BackgroundServer, start_background

MODEL = "fake-model"


@pytest.fixture
def start_server() -> Iterator[Callable[..., BackgroundServer]]:
    """``start_server(engine, load=None, **config)``: a ready server on 127.0.0.1:0 over
    ``engine`` (or whatever ``load`` returns), stopped after the test."""
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

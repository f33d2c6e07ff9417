"""Running the application under uvicorn: in the foreground (``specter serve``) or on a
background thread (tests, ``specter serve --measure``).

The socket is bound before the model loads, so ``/health`` answers 503 while it loads
and 200 once the engine is ready; a model that fails to load stops the server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from specter_bench.serve.app import create_app
from specter_bench.serve.config import ServeConfig
from specter_bench.serve.engine import ServingEngine
from specter_bench.serve.metrics import ServerMetrics
from specter_bench.serve.scheduler import Scheduler

__all__ = ["BackgroundServer", "bind", "run_server", "start_background"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    Raises:
        OSError: the address is taken or cannot be bound; the message names it.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _build(
    config: ServeConfig, load: Callable[[], ServingEngine]
) -> tuple[uvicorn.Server, Scheduler, ServerMetrics]:
    metrics = ServerMetrics()
    scheduler = Scheduler(
        load,
        metrics,
        max_queue=config.max_queue,
        queue_timeout_s=config.queue_timeout_s,
        max_batch=config.max_batch,
    )
    app = create_app(config, scheduler, metrics)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
            lifespan="on",
        )
    )
    return server, scheduler, metrics


def run_server(
    config: ServeConfig, load: Callable[[], ServingEngine], log: Callable[[str], None]
) -> int:
    """Serve until interrupted; returns the exit status (2 when the model failed to load).

    Args:
        config: the server's settings.
        load: builds the engine (on the engine's thread, while the server already listens).
        log: where the listening address and readiness are reported.
    """
    sock = bind(config.host, config.port)
    server, scheduler, _ = _build(config, load)
    url = _url(sock)

    def report_loading() -> None:
        scheduler.finished_loading.wait()
        if scheduler.load_error is not None:
            server.should_exit = True
        else:
            log(f"ready: serving {config.model_name} at {url}/v1")

    log(f"listening on {url} (GET /health answers 200 once the model is loaded)")
    scheduler.start()
    threading.Thread(target=report_loading, daemon=True).start()
    server.run(sockets=[sock])
    if scheduler.load_error is not None:
        error = scheduler.load_error
        log(f"error: loading the model failed: {type(error).__name__}: {error}")
        return 2
    return 0


@dataclass
class BackgroundServer:
    """A server running on a background thread of this process.

    Attributes:
        url: ``http://host:port`` (append ``/v1`` for an OpenAI client).
        scheduler: its engine queue.
        metrics: its metrics.
    """

    url: str
    scheduler: Scheduler
    metrics: ServerMetrics
    server: uvicorn.Server
    thread: threading.Thread

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Wait until the engine is loaded.

        Raises:
            RuntimeError: loading failed, or took longer than ``timeout_s``.
        """
        if not self.scheduler.finished_loading.wait(timeout_s):
            raise RuntimeError(f"the model did not load within {timeout_s} s")
        if self.scheduler.load_error is not None:
            raise RuntimeError(f"loading the model failed: {self.scheduler.load_error}")
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(10)


def start_background(config: ServeConfig, load: Callable[[], ServingEngine]) -> BackgroundServer:
    """Start a server on a background thread (``config.port`` 0 picks a free port)."""
    sock = bind(config.host, config.port)
    server, scheduler, metrics = _build(config, load)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="specter-http", daemon=True
    )
    scheduler.start()
    thread.start()
    return BackgroundServer(_url(sock), scheduler, metrics, server, thread)

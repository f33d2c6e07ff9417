"""The gate every HTTP request passes: API key, body size, and the request counter.

A plain ASGI middleware (no body parsing of its own): it checks ``Authorization: Bearer``
on every path but ``/health``, refuses bodies over the size limit before the application
reads them (by ``Content-Length``, and by counting a chunked body), and counts answers by
endpoint and status for ``/metrics``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from specter_bench.serve.errors import error_body
from specter_bench.serve.metrics import ServerMetrics

__all__ = ["ENDPOINTS", "Gatekeeper"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ENDPOINTS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
)
"""Paths counted under their own name in ``specter_requests_total``; others count as
``other`` (so unknown paths cannot grow the metric without bound)."""

_OPEN_PATHS = ("/health",)


async def _send_error(
    send: Send, status: int, message: str, type: str, code: str, headers: list | None = None
) -> None:
    body = json.dumps(error_body(message, type, None, code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Gatekeeper:
    """ASGI middleware: authentication, body size limit, request counting.

    Args:
        app: the application behind it.
        metrics: where answers are counted.
        api_key: the key clients must send as ``Authorization: Bearer KEY`` (None: open).
        max_body_bytes: the largest request body accepted (413 beyond).
    """

    def __init__(
        self, app: ASGIApp, *, metrics: ServerMetrics, api_key: str | None, max_body_bytes: int
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        if path.startswith("/v1/models/"):
            endpoint = "/v1/models"

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        if self.api_key is not None and path not in _OPEN_PATHS and not self._authorized(scope):
            await _send_error(
                counted_send,
                401,
                "missing or wrong API key: send the server's key as 'Authorization: Bearer KEY' "
                "(openai client: api_key=KEY)",
                "authentication_error",
                "invalid_api_key",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._too_large(counted_send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await self._too_large(counted_send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, counted_send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                assert self.api_key is not None
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    token.strip().encode(), self.api_key.encode()
                )
        return False

    async def _too_large(self, send: Send) -> None:
        await _send_error(
            send,
            413,
            f"the request body is over this server's limit of {self.max_body_bytes} bytes "
            "(specter serve --max-body-bytes)",
            "invalid_request_error",
            "request_too_large",
        )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

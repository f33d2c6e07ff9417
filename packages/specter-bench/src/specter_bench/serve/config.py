"""The server's settings (``specter serve``'s options, as one typed config)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServeConfig"]


@dataclass(frozen=True)
class ServeConfig:
    """How ``specter serve`` listens and whom it answers.

    Attributes:
        model_name: the model id clients name (``GET /v1/models``).
        host: the address to bind (127.0.0.1: this machine only).
        port: the TCP port (0: any free port, printed at start).
        api_key: the Bearer key every endpoint but ``/health`` requires (None: none).
        max_queue: requests that may wait while the engine's batch is full; one more gets
            429.
        max_batch: the most requests generated at once: 1 runs them one at a time; N > 1
            batches continuously (waiting requests join the running batch at step
            boundaries, up to N; the engine must be built for N sequences).
        queue_timeout_s: the most seconds a request waits for the engine (None: no limit);
            past it the request gets 503 with ``Retry-After``.
        request_timeout_s: the most seconds a generation runs (None: no limit); past it
            the generation stops at its next step and answers what it has, with
            ``finish_reason`` ``length``.
        max_body_bytes: the largest request body (413 beyond).
        default_max_tokens: ``max_tokens`` of a completion that gives none (OpenAI's 16).
        chat_template: a Jinja chat template replacing the tokenizer's (None: the
            tokenizer's own, if it has one).
    """

    model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 32
    max_batch: int = 1
    queue_timeout_s: float | None = 600.0
    request_timeout_s: float | None = 600.0
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 16
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int):
            raise ValueError(f"max_batch must be an int >= 1, got {self.max_batch!r}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.api_key == "":
            raise ValueError("api_key is empty; give a key or leave it out")
        for name in ("queue_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value}")

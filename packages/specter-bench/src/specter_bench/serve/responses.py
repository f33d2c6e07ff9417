"""Response bodies in the OpenAI wire format, and server-sent events.

A streamed answer is a sequence of ``data: {json}`` events, one chunk object each, closed
by ``data: [DONE]``. The last chunk with a ``finish_reason`` also carries ``specter``: the
request's decoding statistics (acceptance, depth, expert cache), as the non-streamed
answer does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DONE",
    "Outcome",
    "ResponseIds",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "sse",
    "usage",
]

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


@dataclass(frozen=True)
class ResponseIds:
    """The id, creation time and model name shared by every chunk of one answer."""

    model: str
    prefix: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", f"{self.prefix}-{uuid.uuid4().hex[:24]}")


@dataclass
class Outcome:
    """A finished generation as the server answers it.

    Attributes:
        text: the answer's text (stop strings and the EOS token's text cut off).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (max_tokens, or
            the request timeout).
        prompt_tokens, completion_tokens: the usage counts.
        stats: the engine's statistics of the generation, plus ``stop_reason``.
    """

    text: str = ""
    finish_reason: str = "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


def usage(outcome: Outcome) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def _base(ids: ResponseIds, obj: str) -> dict[str, Any]:
    return {"id": ids.id, "object": obj, "created": ids.created, "model": ids.model}


def completion_response(ids: ResponseIds, outcome: Outcome) -> dict[str, Any]:
    """The body of a non-streamed ``/v1/completions`` answer."""
    choice = {
        "index": 0,
        "text": outcome.text,
        "logprobs": None,
        "finish_reason": outcome.finish_reason,
    }
    body = _base(ids, "text_completion")
    body.update(choices=[choice], usage=usage(outcome), specter=outcome.stats)
    return body


def completion_chunk(
    ids: ResponseIds,
    text: str,
    finish_reason: str | None = None,
    *,
    stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed ``/v1/completions`` chunk."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    body = _base(ids, "text_completion")
    body["choices"] = [choice]
    if stats is not None:
        body["specter"] = stats
    return body


def chat_response(ids: ResponseIds, outcome: Outcome) -> dict[str, Any]:
    """The body of a non-streamed ``/v1/chat/completions`` answer."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": outcome.text},
        "logprobs": None,
        "finish_reason": outcome.finish_reason,
    }
    body = _base(ids, "chat.completion")
    body.update(choices=[choice], usage=usage(outcome), specter=outcome.stats)
    return body


def chat_chunk(
    ids: ResponseIds,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed ``/v1/chat/completions`` chunk (``delta`` holds role and/or content)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    body = _base(ids, "chat.completion.chunk")
    body["choices"] = [choice]
    if stats is not None:
        body["specter"] = stats
    return body

"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``.

The fields of the OpenAI API that one-sequence decoding can honour are typed and checked
(strictly: a string where a number belongs is an error, not a guess); fields it cannot
honour yet are accepted only at their neutral value, so a client asking for them gets a
clear 400 instead of a silently different answer. Specter's own knob ``depth`` is an
optional extra field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "GenerationRequest",
    "StreamOptions",
]


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields both endpoints share.

    Attributes:
        model: the served model's id (``GET /v1/models``).
        max_tokens: the most tokens to generate (completions: default 16, as OpenAI's;
            chat: default the rest of the context).
        temperature: 0 is greedy; otherwise the logits' divisor (at most 2).
        top_p, top_k: nucleus mass in (0, 1] and the k most likely tokens (0: all).
        seed: the sampler's seed: the same request with the same seed gives the same text.
        stop: a string or up to four strings; the text ends before the first one.
        n: completions per prompt; only 1 until batching exists.
        stream: answer with server-sent events, one chunk per engine step.
        depth: Specter's speculation depth K for this request (0: plain decoding; default:
            the server's setting), for an engine whose ``generate`` takes one (others
            answer 400).
        ignore_eos: keep generating past the EOS token, to ``max_tokens`` (for load tests and
            measurements that need a fixed length; vLLM's field of the same name).
    """

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    depth: int | None = Field(default=None, ge=0, le=64)
    ignore_eos: bool = False


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: ``prompt`` is a string or token ids (one prompt)."""

    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None


class ContentPart(BaseModel):
    """A part of a message's content; only ``text`` parts are understood."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined).

        Raises:
            ValueError: a part that is not text (images, audio).
        """
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(
                    f"a content part of type {part.type!r}: this model reads text only; "
                    "send text parts or a string"
                )
            parts.append(part.text)
        return "".join(parts)


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: ``messages`` through the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)

"""The HTTP application: OpenAI-compatible endpoints over the engine's queue.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not), ``GET
/v1/models``, ``GET /health`` (200 once the model is loaded and its CUDA graphs
captured, 503 before) and ``GET /metrics`` (Prometheus text). A request is checked
completely (model, parameters, context length) before it queues; a streamed answer starts
only once its generation has, so queue errors still get their own status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specter_bench.serve.config import ServeConfig
from specter_bench.serve.engine import ServingEngine, accepts_depth, context_limits, eos_ids
from specter_bench.serve.errors import APIError, error_body, install_error_handlers
from specter_bench.serve.metrics import CONTENT_TYPE, ServerMetrics
from specter_bench.serve.middleware import Gatekeeper
from specter_bench.serve.responses import (
    DONE,
    Outcome,
    ResponseIds,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    sse,
    usage,
)
from specter_bench.serve.scheduler import Job, JobEvent, QueueFullError, Scheduler
from specter_bench.serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
)
from specter_bench.serve.stop_strings import StopMatcher
from specter_spec import SamplingConfig

__all__ = ["create_app"]

MAX_STOP_STRINGS = 4
_DISCONNECT_POLL_S = 0.25


def _json_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The statistics' plain values (numbers, strings, booleans; non-finite as None)."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
    return out


class _Service:
    """The endpoints' shared work: checks, queueing, collecting and streaming."""

    def __init__(self, config: ServeConfig, scheduler: Scheduler, metrics: ServerMetrics):
        self.config = config
        self.scheduler = scheduler
        self.metrics = metrics

    # ----------------------------------------------------------------------- checks

    def engine(self) -> ServingEngine:
        if self.scheduler.engine is None or not self.scheduler.ready.is_set():
            raise APIError(
                503,
                "the model is still loading; GET /health answers 200 once it is ready",
                type="server_error",
                code="model_loading",
                headers={"Retry-After": "5"},
            )
        return self.scheduler.engine

    def check_model(self, name: str) -> None:
        if name != self.config.model_name:
            raise APIError(
                404,
                f"model {name!r} is not served here; this server serves "
                f"{self.config.model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_options(self, body: GenerationRequest, engine: ServingEngine) -> None:
        """Refuse what one-sequence decoding cannot honour, naming the field."""

        def refuse(param: str, message: str) -> None:
            raise APIError(400, message, param=param, code="unsupported_value")

        if body.n not in (None, 1):
            refuse("n", f"n={body.n}: this server generates one completion per request (n=1)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(body, name)
            if value not in (None, 0, 0.0):
                refuse(name, f"{name}={value}: penalties are not supported; leave it out or 0")
        if body.logit_bias:
            refuse("logit_bias", "logit_bias is not supported; leave it out")
        if isinstance(body, CompletionRequest):
            if body.logprobs not in (None, 0):
                refuse("logprobs", "logprobs are not available from this engine; leave it out")
            if body.echo:
                refuse("echo", "echo is not supported; prepend the prompt yourself")
            if body.best_of not in (None, 1):
                refuse("best_of", f"best_of={body.best_of}: only 1 is supported")
            if body.suffix:
                refuse("suffix", "suffix (insertion) is not supported; leave it out")
        if isinstance(body, ChatCompletionRequest) and (body.logprobs or body.top_logprobs):
            refuse("logprobs", "logprobs are not available from this engine; leave it out")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            refuse("stop", f"{len(stops)} stop strings: at most {MAX_STOP_STRINGS}")
        if body.depth is not None and not accepts_depth(engine):
            refuse("depth", "this engine chooses its depth itself; leave depth out")
        if body.depth is not None and self.scheduler.max_batch > 1:
            refuse(
                "depth",
                f"this server batches requests (--max-batch {self.scheduler.max_batch}): every "
                "sequence of the batch decodes at the engine's depth; leave depth out",
            )
        greedy = not body.temperature
        if greedy and (body.top_p not in (None, 1, 1.0) or body.top_k not in (None, 0)):
            refuse(
                "temperature",
                "top_p/top_k shape sampling, but temperature 0 (the default) is greedy: "
                "give a temperature > 0",
            )

    def sampling(self, body: GenerationRequest) -> SamplingConfig:
        if not body.temperature:
            return SamplingConfig.greedy()
        return SamplingConfig(
            temperature=body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            seed=body.seed,
        )

    def fit_context(
        self, engine: ServingEngine, prompt_tokens: int, max_tokens: int | None, param: str
    ) -> int:
        """``max_tokens`` checked against the context (None: all that fits).

        Raises:
            APIError: 400 naming the limit when the prompt and ``max_tokens`` exceed it.
        """
        limit, reserved = context_limits(engine)
        room = limit - reserved - prompt_tokens
        if max_tokens is None and room >= 1:
            return room
        if max_tokens is not None and max_tokens <= room:
            return max_tokens
        asked = "" if max_tokens is None else f" and {param} asks for {max_tokens}"
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens ({reserved} kept for "
            f"speculative verification): the prompt has {prompt_tokens} tokens{asked}, so at "
            f"most {max(room, 0)} new tokens fit. Shorten the prompt or lower {param}.",
            param=param if max_tokens is not None and room >= 1 else "prompt",
            code="context_length_exceeded",
        )

    # --------------------------------------------------------------------- running

    def enqueue(
        self, body: GenerationRequest, engine: ServingEngine, ids: list[int], n: int
    ) -> Job:
        job = Job(
            prompt_ids=ids,
            max_new_tokens=n,
            sampling=self.sampling(body),
            stop_token_ids=[] if body.ignore_eos else eos_ids(engine.tokenizer),
            depth=body.depth,
            timeout_s=self.config.request_timeout_s,
        )
        try:
            self.scheduler.submit(job)
        except QueueFullError as full:
            raise APIError(
                429,
                f"the server is busy: {full.waiting} requests are waiting for the engine "
                f"(its queue holds {self.config.max_queue} while {self.config.max_batch} "
                f"generate); retry after {full.retry_after_s} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(full.retry_after_s)},
            ) from None
        return job

    async def next_event(self, job: Job, request: Request | None) -> JobEvent:
        """The job's next event other than ``start``; a client that disconnects meanwhile
        (polled every ``_DISCONNECT_POLL_S`` when ``request`` is given) cancels the job."""
        while True:
            if request is not None and time.monotonic() - job.polled > _DISCONNECT_POLL_S:
                job.polled = time.monotonic()
                if await request.is_disconnected():
                    job.cancel("disconnect")
            try:
                event = await asyncio.wait_for(job.events.get(), _DISCONNECT_POLL_S)
            except TimeoutError:
                continue
            if event.kind != "start":
                return event

    async def started(self, job: Job, request: Request) -> JobEvent | None:
        """Wait until the engine takes ``job`` (at most the queue timeout); a client that
        disconnects meanwhile cancels it.

        Returns:
            None once the job started, or the event that ended it first (an error).

        Raises:
            APIError: 503 when the queue timeout passes first (the job is cancelled).
        """
        timeout = self.config.queue_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is not None and time.monotonic() > deadline:
                job.cancel("queue_timeout")
                raise APIError(
                    503,
                    f"the request waited {timeout:g} s for the engine (the server's queue "
                    "timeout, specter serve --queue-timeout); retry later",
                    type="server_error",
                    code="queue_timeout",
                    headers={"Retry-After": "5"},
                )
            try:
                event = await asyncio.wait_for(job.events.get(), _DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel("disconnect")
                continue
            return None if event.kind == "start" else event

    def raise_for(self, event: JobEvent) -> None:
        if event.kind != "error":
            return
        if isinstance(event.value, TimeoutError):
            raise APIError(
                503,
                f"the request {event.value}, longer than the server's queue timeout; retry",
                type="server_error",
                code="queue_timeout",
                headers={"Retry-After": "5"},
            )
        if isinstance(event.value, ValueError):
            raise APIError(400, str(event.value), code="invalid_value")
        raise APIError(
            500,
            f"the engine failed on this request ({type(event.value).__name__}: {event.value})",
            type="server_error",
            code="engine_error",
        )

    async def pieces(
        self,
        job: Job,
        first: JobEvent,
        matcher: StopMatcher,
        outcome: Outcome,
        request: Request | None = None,
    ) -> AsyncIterator[str]:
        """The answer's text as it is released (stop strings held back and cut), starting
        with the event ``first``; ``outcome`` is complete when the iteration ends.
        ``request``: polled for a disconnect while waiting (a streamed answer learns of
        one from the server instead)."""
        event: JobEvent | None = first
        try:
            while True:
                if event is None:
                    event = await self.next_event(job, request)
                self.raise_for(event)
                if event.kind == "end":
                    tail = matcher.flush()
                    if tail:
                        outcome.text += tail
                        yield tail
                    self.finish(job, event, matcher, outcome)
                    return
                chunk = event.value
                outcome.completion_tokens += len(chunk.token_ids)
                released = matcher.feed(chunk.text) if not matcher.stopped else ""
                if matcher.needs_cancel and not job.cancelled:
                    job.cancel("stop_string")
                outcome.text += released
                if released or chunk.token_ids:
                    # A chunk of tokens whose text is held back (a possible stop string) or
                    # empty (bytes of an unfinished character) still goes out, without text,
                    # so a streaming client sees every decode step as it happens.
                    yield released
                event = None
        finally:
            if not job.cancelled and outcome.stats.get("stop_reason") is None:
                job.cancel("disconnect")  # the client went away mid-answer

    def finish(self, job: Job, event: JobEvent, matcher: StopMatcher, outcome: Outcome) -> None:
        generation = event.value
        stats = _json_stats(dict(getattr(generation, "stats", None) or {}))
        engine_reason = getattr(generation, "stop_reason", None)
        if engine_reason == "stop_token":
            reason = "stop_token"
        elif matcher.needs_cancel:
            reason = "stop_string"
        elif job.timed_out:
            reason = "timeout"
        else:
            reason = engine_reason or "max_new_tokens"
        stats["stop_reason"] = reason
        outcome.stats = stats
        outcome.finish_reason = "stop" if reason in ("stop_string", "stop_token") else "length"

    def matcher(self, body: GenerationRequest, engine: ServingEngine) -> StopMatcher:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        # The EOS token ends the generation; its text ("<|endoftext|>") is not the answer's.
        ends = [] if body.ignore_eos else eos_ids(engine.tokenizer)
        final = [engine.tokenizer.decode([eos]) for eos in ends]
        return StopMatcher(stops, final)

    async def answer(
        self,
        request: Request,
        body: GenerationRequest,
        ids: list[int],
        max_tokens: int,
        kind: str,
    ) -> Response:
        engine = self.engine()
        job = self.enqueue(body, engine, ids, max_tokens)
        try:
            first = await self.started(job, request) or await self.next_event(job, request)
            self.raise_for(first)
        except BaseException:
            job.cancel("disconnect")
            raise
        outcome = Outcome(prompt_tokens=len(ids))
        matcher = self.matcher(body, engine)
        ids_ = ResponseIds(self.config.model_name, "cmpl" if kind == "text" else "chatcmpl")
        if not body.stream:
            try:
                async for _ in self.pieces(job, first, matcher, outcome, request):
                    pass
            except BaseException:
                job.cancel("disconnect")
                raise
            build = completion_response if kind == "text" else chat_response
            return JSONResponse(build(ids_, outcome))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            self.stream(job, first, matcher, outcome, ids_, kind, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def stream(
        self,
        job: Job,
        first: JobEvent,
        matcher: StopMatcher,
        outcome: Outcome,
        ids: ResponseIds,
        kind: str,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        if kind == "chat":
            yield sse(chat_chunk(ids, {"role": "assistant", "content": ""}))
        try:
            async for piece in self.pieces(job, first, matcher, outcome):
                if kind == "text":
                    yield sse(completion_chunk(ids, piece))
                else:
                    yield sse(chat_chunk(ids, {"content": piece}))
        except APIError as exc:
            yield sse(error_body(exc.message, exc.type, exc.param, exc.code))
            yield DONE
            return
        if kind == "text":
            yield sse(completion_chunk(ids, "", outcome.finish_reason, stats=outcome.stats))
        else:
            yield sse(chat_chunk(ids, {}, outcome.finish_reason, stats=outcome.stats))
        if include_usage:
            final = completion_chunk(ids, "") if kind == "text" else chat_chunk(ids, {})
            final["choices"] = []
            final["usage"] = usage(outcome)
            yield sse(final)
        yield DONE


def _encode(tokenizer: Any, text: str, *, special: bool = True) -> list[int]:
    if special:
        return list(tokenizer.encode(text))
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


def _chat_prompt(service: _Service, engine: ServingEngine, body: ChatCompletionRequest) -> str:
    tokenizer = engine.tokenizer
    template = service.config.chat_template or getattr(tokenizer, "chat_template", None)
    if not template or not hasattr(tokenizer, "apply_chat_template"):
        raise APIError(
            400,
            f"model {service.config.model_name!r} has no chat template, so it cannot take "
            "chat messages: send a prompt to /v1/completions, or start the server with "
            "--chat-template FILE",
            param="messages",
            code="no_chat_template",
        )
    try:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages", code="invalid_value") from None
    try:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # a template that rejects the conversation (roles, order)
        raise APIError(
            400, f"the chat template refused these messages: {exc}", param="messages"
        ) from None


def create_app(config: ServeConfig, scheduler: Scheduler, metrics: ServerMetrics) -> Any:
    """The ASGI application of one server (the FastAPI app behind its :class:`Gatekeeper`).

    Args:
        config: the server's settings.
        scheduler: the engine's queue (started by the caller; the app stops it at shutdown).
        metrics: the server's metrics.
    """
    service = _Service(config, scheduler, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        scheduler.stop(timeout_s=1.0)

    app = FastAPI(
        title="Specter", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if scheduler.ready.is_set():
            return JSONResponse({"status": "ok", "model": config.model_name})
        if scheduler.load_error is not None:
            status = {"status": "error", "message": f"loading failed: {scheduler.load_error}"}
            return JSONResponse(status, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    def model_card() -> dict[str, Any]:
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "specter"}
        if scheduler.engine is not None:
            card["max_model_len"] = context_limits(scheduler.engine)[0]
        return card

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        service.check_model(name)
        return model_card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        service.check_model(body.model)
        engine = service.engine()
        service.check_options(body, engine)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(
                    400,
                    f"{len(prompt)} prompts: this server completes one prompt per request",
                    param="prompt",
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "the prompt is empty; give text to complete", param="prompt")
            ids = _encode(engine.tokenizer, prompt)
        else:
            ids = list(prompt)
            vocab = len(engine.tokenizer) if hasattr(engine.tokenizer, "__len__") else None
            if not ids or (vocab and not all(0 <= i < vocab for i in ids)):
                raise APIError(
                    400,
                    f"prompt token ids must be a non-empty list of ids in [0, {vocab})",
                    param="prompt",
                )
        n = service.fit_context(
            engine, len(ids), body.max_tokens or config.default_max_tokens, "max_tokens"
        )
        return await service.answer(request, body, ids, n, "text")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        service.check_model(body.model)
        engine = service.engine()
        service.check_options(body, engine)
        text = _chat_prompt(service, engine, body)
        ids = _encode(engine.tokenizer, text, special=False)
        asked = body.max_completion_tokens or body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        n = service.fit_context(engine, len(ids), asked, param)
        return await service.answer(request, body, ids, n, "chat")

    return Gatekeeper(
        app, metrics=metrics, api_key=config.api_key, max_body_bytes=config.max_body_bytes
    )

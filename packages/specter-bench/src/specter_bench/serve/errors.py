"""OpenAI-style error objects, and the handlers that turn every failure into one.

Every error the server answers has the body ``{"error": {"message", "type", "param",
"code"}}`` of the OpenAI API and a 4xx status for the client's mistakes (5xx only for the
server's own); no traceback ever reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["APIError", "error_body", "error_response", "install_error_handlers"]

log = logging.getLogger("specter.serve")


class APIError(Exception):
    """A failure answered with an OpenAI-style error object.

    Args:
        status: the HTTP status.
        message: what went wrong and what to do, for the person reading the client's error.
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault, if one.
        code: a short machine-readable code (``model_not_found``, ...).
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {...}}`` as the OpenAI API writes it."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    """The JSON response of an :class:`APIError`."""
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status,
        headers=exc.headers,
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line naming the first bad field, what it got and what it expects."""
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", first.get("msg"))
        return f"the request body is not valid JSON: {detail}", None
    if first.get("type") == "missing" and not loc:
        return "the request needs a JSON object body", None
    got = first.get("input")
    if not loc and isinstance(got, bytes | str):
        return (
            "the request body was not read as JSON: send a JSON object with the header "
            "'Content-Type: application/json'",
            None,
        )
    if not loc:
        return f"the request body must be a JSON object; got {got!r:.80}", None
    field = str(loc[0])
    same = [e for e in errors if [p for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    shown = repr(got) if len(repr(got)) < 80 else repr(got)[:77] + "..."
    if len(same) > 1 and len(loc) > 1 and isinstance(loc[1], str):
        # A field of several accepted types: pydantic reports one error per type.
        kinds = []
        for error in same:
            parts = [p for p in error.get("loc", ()) if p != "body"]
            if len(parts) > 1 and isinstance(parts[1], str) and parts[1] not in kinds:
                kinds.append(parts[1])
        return f"'{field}': got {shown}; expected one of: {', '.join(kinds)}", field
    param = ".".join(str(part) for part in loc)
    where = f"'{param}'"
    more = len(errors) - 1
    extra = f" ({more} more problem{'s' if more > 1 else ''} after it)" if more else ""
    return f"{where}: {first.get('msg')}; got {shown}{extra}", param


def install_error_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and unexpected exceptions with error objects."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(APIError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /v1/models"
            code = "not_found"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return error_response(APIError(exc.status_code, message, code=code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return error_response(
            APIError(
                500,
                f"the server failed on this request ({type(exc).__name__}); its log has the "
                "details",
                type="server_error",
            )
        )

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
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return (
            "the request body is not valid JSON: "
            + str(first.get("ctx", {}).get("error", first.get("msg"))),
            None,
        )
    if first.get("type") == "missing" and not loc:
        return "the request needs a JSON object body", None
    got = first.get("input")
    shown = repr(got) if not isinstance(got, dict | list) or len(repr(got)) < 80 else "..."
    where = f"'{param}'" if param else "the body"
    more = f" ({len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg')}; got {shown}{more}", param


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

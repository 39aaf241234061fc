"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server answers goes through here, so clients (the openai
package maps status codes to exception classes) always get the same body, and
a 500 never reveals a traceback.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inflight.engine.async_engine import EngineDeadError

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "server_overloaded"}


class OpenAIError(Exception):
    """An error answered to the client with ``status`` and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """The OpenAI error object for an HTTP status."""
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def bad_request(message: str, param: Optional[str] = None) -> OpenAIError:
    return OpenAIError(400, message, param)


def engine_error(exc: BaseException) -> OpenAIError:
    """Map an exception from the engine to the error the client sees."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, (ValueError, TypeError)):
        return bad_request(str(exc))
    if isinstance(exc, EngineDeadError):
        return OpenAIError(500, "the inference engine is not running; the request could not be completed",
                           code="engine_dead")
    logger.exception("internal error while serving a request", exc_info=exc)
    return OpenAIError(500, "internal server error", code="internal_error")


_UNION_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*)$")


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None

    def path(err: dict) -> str:
        # Drop "body" and pydantic's union-member tags ("str", "list[int]") from the location.
        return ".".join(str(p) for p in err.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p)))

    param = path(first) or None
    # A value matching no member of a union yields one error per member: report them together.
    msgs = list(dict.fromkeys(e.get("msg", "invalid value").removeprefix("Value error, ")
                              for e in errors if path(e) == path(first)))
    msg = msgs[0] if len(msgs) == 1 else "invalid value: " + "; or ".join(msgs)
    return (f"{param}: {msg}" if param else msg), param


def param_of(message: str, fields: Iterable[str]) -> Optional[str]:
    """The request field a message like "top_p must be in (0, 1]" is about, if any."""
    m = re.match(r"(\w+)", message)
    return m.group(1) if m and m.group(1) in fields else None


def install_error_handlers(app: FastAPI) -> None:
    """Make validation errors 400, HTTP errors and crashes OpenAI-shaped."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return bad_request(message, param).response()

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        return engine_error(exc).response()

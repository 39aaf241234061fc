"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server answers goes through here, so clients (the openai
package maps status codes to exception classes) always get the same body, and
a 500 never reveals a traceback. Only InvalidRequestError (our validation)
becomes a 400 with its message; any other exception is a 500, logged with the
request id.
"""
from __future__ import annotations

import contextvars
import logging
import re
from typing import Any, Iterable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inflight.engine.async_engine import EngineDeadError
from inflight.entrypoints.openai.limits import clip
from inflight.errors import InvalidRequestError

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 431: "invalid_request_error",
          500: "server_error", 503: "server_overloaded"}
# Error messages quote input; this bounds the whole message whatever slipped in.
MAX_MESSAGE_CHARS = 1000

# Set per HTTP request by the middleware, so a 500 in the log names its request.
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("inflight_request_id", default="-")


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
    return {"error": {"message": clip(message, MAX_MESSAGE_CHARS), "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def bad_request(message: str, param: Optional[str] = None) -> OpenAIError:
    """A 400 (invalid_request_error) naming ``param``."""
    return OpenAIError(400, message, param)


def engine_error(exc: BaseException) -> OpenAIError:
    """Map an exception from the engine to the error the client sees."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc), param_of(str(exc)))
    if isinstance(exc, EngineDeadError):
        return OpenAIError(500, "the inference engine is not running; the request could not be completed",
                           code="engine_dead")
    rid = request_id_var.get()
    logger.error("internal error while serving request %s", rid, exc_info=exc)
    return OpenAIError(500, f"internal server error (request id {rid})", code="internal_error")


_UNION_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|literal\[.*\]|function-.*)$")


def error_path(err: dict) -> str:
    """A pydantic error's location as the client wrote it: without "body" and pydantic's
    union-member tags ("str", "list[int]", "function-after[...]")."""
    return ".".join(str(p) for p in err.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p)))


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None

    path = error_path
    param = path(first) or None
    # A value matching no member of a union yields one error per member: report them together.
    msgs = list(dict.fromkeys(e.get("msg", "invalid value").removeprefix("Value error, ")
                              for e in errors if path(e) == path(first)))
    msg = msgs[0] if len(msgs) == 1 else "invalid value: " + "; or ".join(msgs)
    if param:
        return f"{param}: {msg}", param
    return msg, param_of(msg)  # a model-level check names its field first: "logit_bias: ..."


def param_of(message: str, fields: Optional[Iterable[str]] = None) -> Optional[str]:
    """The request field a message like "top_p must be in (0, 1]" or "n: at most 16"
    is about: the leading word if it is in ``fields`` (a dotted one like
    ``structured_outputs.json`` if its first part is), or (without ``fields``) if a colon follows it."""
    m = re.match(r"([\w.]+)(:?)", message)
    if not m:
        return None
    if fields is None:
        return m.group(1) if m.group(2) else None
    return m.group(1) if m.group(1).split(".")[0] in fields else None


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

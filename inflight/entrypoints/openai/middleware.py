"""Connection hygiene in front of the app: request ids, header and body size
limits, a body read deadline, a concurrency limit (503 + Retry-After), and a
uvicorn protocol that closes connections whose headers never finish.
"""
from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any, Awaitable, Callable, Optional

from inflight.entrypoints.openai.errors import OpenAIError, request_id_var
from inflight.entrypoints.openai.limits import ServerLimits

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Probes must answer even when the server sheds load.
EXEMPT_PATHS = frozenset({"/health", "/ping", "/load", "/metrics", "/version"})
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class _Reject(Exception):
    def __init__(self, error: OpenAIError) -> None:
        self.error = error


class RequestGuard:
    """ASGI middleware applying ServerLimits to every HTTP request."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        self.app, self.limits = app, limits
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = self._request_id(scope)
        token = request_id_var.set(rid)
        send = _with_header(send, b"x-request-id", rid.encode())
        counted = scope["path"] not in EXEMPT_PATHS
        try:
            self._check_headers(scope)
            if counted:
                self._check_concurrency()
            self.in_flight += counted
            try:
                if scope["method"] in ("POST", "PUT", "PATCH"):
                    receive = await self._buffered_body(scope, receive)
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= counted
        except _Reject as r:
            await _send_error(send, r.error)
        finally:
            request_id_var.reset(token)

    @staticmethod
    def _request_id(scope: Scope) -> str:
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
                if _CLIENT_ID.match(given):
                    return given
        return uuid.uuid4().hex

    def _check_headers(self, scope: Scope) -> None:
        size = sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        if size > self.limits.max_header_bytes:
            raise _Reject(OpenAIError(431, f"request headers are {size} bytes, more than "
                                           f"{self.limits.max_header_bytes} (--max-header-bytes)"))

    def _check_concurrency(self) -> None:
        limit = self.limits.max_concurrent_requests
        if limit is not None and self.in_flight >= limit:
            raise _Reject(OpenAIError(503, f"the server is overloaded: {limit} requests are in flight "
                                           f"(--max-concurrent-requests)", code="server_overloaded",
                                      headers={"Retry-After": "1"}))

    async def _buffered_body(self, scope: Scope, receive: Receive) -> Receive:
        """Read the whole body within the size limit and deadline; return a receive that replays it."""
        limit = self.limits.max_request_body_bytes
        too_large = OpenAIError(413, f"the request body is larger than {limit} bytes (--max-request-body-bytes)")
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise _Reject(too_large)
        chunks: list[bytes] = []
        size = 0

        async def read_all() -> None:
            nonlocal size
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise _Reject(OpenAIError(400, "the client disconnected while sending the body"))
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > limit:
                    raise _Reject(too_large)
                if not message.get("more_body", False):
                    return

        try:
            await asyncio.wait_for(read_all(), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise _Reject(OpenAIError(408, f"the request body did not arrive within "
                                           f"{self.limits.body_timeout_s:g} s (--body-timeout)")) from None
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return replay


def _content_length(scope: Scope) -> Optional[int]:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _with_header(send: Send, name: bytes, value: bytes) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=list(message.get("headers", [])) + [(name, value)])
        await send(message)
    return wrapped


async def _send_error(send: Send, error: OpenAIError) -> None:
    response = error.response()
    headers = list(response.raw_headers)
    if error.status in (408, 413, 431):
        headers.append((b"connection", b"close"))  # the rest of the request is not read
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def timed_h11_protocol(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers have not
    all arrived ``header_timeout_s`` after it opened (or after its previous response)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _header_timer: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # a request line and headers arrived
            elif self._header_timer is None and not self.transport.is_closing():
                self._arm()  # the next request on a kept-alive connection has begun

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol

"""Server-Sent Events for the streaming handlers: one event per JSON chunk, and a
text/event-stream response that closes (aborts) its engine streams however it ends."""
from __future__ import annotations

import inspect
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from inflight.engine.async_engine import RequestStream
from inflight.entrypoints.openai.errors import OpenAIError, engine_error


def sse(data: Any) -> str:
    """One Server-Sent Event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def sse_model(model: BaseModel) -> str:
    """One Server-Sent Event carrying a response model (pydantic's serializer writes the
    JSON directly; None fields kept, as ``dump`` keeps them)."""
    return f"data: {model.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs ``on_close`` (a function, or a coroutine
    function it awaits) however it ends.

    Starlette never starts the body iterator if the client left before the
    response began, so closing the engine streams (or a proxy's upstream) cannot live
    in the iterator's ``finally`` alone.
    """

    def __init__(self, content: AsyncIterator[Union[str, bytes]], on_close: Callable[[], Optional[Awaitable[None]]],
                 status_code: int = 200) -> None:
        super().__init__(content, status_code=status_code, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            closing = self._on_close()
            if inspect.isawaitable(closing):
                await closing


def stream_response(streams: list[RequestStream], events: AsyncIterator[str],
                    on_error: Optional[Callable[[OpenAIError], list[str]]] = None) -> Response:
    """Wrap an SSE generator over ``streams`` so they are closed (aborted) however it ends.
    A failure after the headers is reported in the stream: as ``on_error``'s events, or
    by default an error chunk and ``[DONE]`` (the completions APIs' way)."""

    async def guarded() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except Exception as exc:  # headers are gone: report in-band, then end the stream
            error = engine_error(exc)
            for event in on_error(error) if on_error else [sse(error.body()), SSE_DONE]:
                yield event
        finally:
            for s in streams:
                s.close()
            await events.aclose()  # type: ignore[attr-defined]

    return SSEResponse(guarded(), lambda: [s.close() for s in streams])

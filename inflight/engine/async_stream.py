"""The pieces the async engine hands out: per-request output streams, the
commands queued for the step thread, and the errors and observer hooks around them."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from inflight.errors import InvalidRequestError, RequestError
from inflight.outputs import RequestOutput

if TYPE_CHECKING:
    from inflight.engine.async_engine import AsyncLLMEngine

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop crashed (or was shut down); no request can make progress."""


class StepObserver(Protocol):
    """Receives every step's results on the step thread (metrics, logging)."""

    def on_step(self, engine: Any, outputs: list[RequestOutput], step_time: float) -> None: ...

    def on_abort(self, engine: Any, request_id: str, outputs: list[RequestOutput]) -> None: ...


_CLOSED = object()  # queue marker: the consumer closed the stream


@dataclass
class Command:
    """A call queued for the step thread, with the future its caller awaits."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future
    is_add: bool = False

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # the caller gave up before the step thread got here
        try:
            self.future.set_result(self.fn())
        except BaseException as e:  # handed to the caller, never kills the loop
            self.future.set_exception(e)

    def fail(self, error: BaseException) -> None:
        if self.future.set_running_or_notify_cancel():
            self.future.set_exception(error)


class RequestStream:
    """Async iterator over one request's RequestOutputs, ending after the finished one.

    ``close()`` (or cancelling a pending ``__anext__``) aborts the request if it
    has not finished; consumers must close streams they stop reading.
    """

    def __init__(self, engine: "AsyncLLMEngine", request_id: str) -> None:
        self.request_id = request_id
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False
        self._engine = engine

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self.queue.get()
        except BaseException:  # cancelled: whoever waited for this request is gone
            self.close()
            raise
        if item is _CLOSED:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def close(self) -> None:
        """Stop reading; an unfinished request is aborted at the next step boundary."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)
            self.queue.put_nowait(_CLOSED)  # wakes a reader still waiting on this stream

    async def aclose(self) -> None:
        self.close()


def put_all(items: list[tuple[RequestStream, Any]]) -> None:
    for stream, item in items:
        stream.queue.put_nowait(item)


def deliver(batch: list[tuple[RequestStream, Any]]) -> None:
    """Hand items to their consumers' loops from another thread: one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Any]]] = {}
    for stream, item in batch:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(put_all, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def observe(observer: "StepObserver | None", event: str, engine: Any, *args: Any) -> None:
    """Call ``observer.<event>(engine, *args)``. Metrics are not worth a dead engine:
    an observer failure is only logged."""
    if observer is not None:
        try:
            getattr(observer, event)(engine, *args)
        except Exception:
            logger.exception("step observer %s failed", event)


def log_abort_failure(future: concurrent.futures.Future) -> None:
    # Nobody awaits an abort: a failure (other than a dead engine) would otherwise vanish.
    if not future.cancelled() and future.exception() is not None \
            and not isinstance(future.exception(), EngineDeadError):
        logger.error("abort failed", exc_info=future.exception())


def request_error(out: RequestOutput) -> Exception:
    """What the stream of a request that failed alone raises: a client error when its input was to blame."""
    message = out.error or "the request failed"
    if out.error_is_bad_input:
        return InvalidRequestError(message)
    return RequestError(out.request_id, message)

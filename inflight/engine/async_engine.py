"""Drives an ``LLMEngine`` from a dedicated thread and gives every request an
async stream of outputs.

Threading model: ``LLMEngine`` is not thread-safe, so exactly one thread (the
step thread) ever touches it. The event loop never calls the engine: it queues
commands (add, abort, arbitrary calls) that the step thread applies at the next
step boundary. Outputs travel back with ``loop.call_soon_threadsafe`` into one
``asyncio.Queue`` per request. With no commands and no unfinished requests the
step thread blocks on a condition variable, so an idle server burns no CPU.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from inflight.engine.async_stream import (Command, EngineDeadError, RequestStream, StepObserver, deliver,
                                          log_abort_failure, observe, request_error)
from inflight.engine.protocol import EngineClient
from inflight.lora.request import LoRARequest
from inflight.sampling_params import SamplingParams

__all__ = ["AsyncLLMEngine", "EngineDeadError", "RequestStream", "StepObserver"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncLLMEngine(EngineClient):
    """Asynchronous front of an ``LLMEngine``: ``generate()`` yields RequestOutputs.

    ``start()`` must be called from the event loop that will consume outputs.
    ``abort()`` may be called from any thread; it takes effect at the next step
    boundary and frees the request's KV blocks there.
    """

    def __init__(self, engine: Any, observer: Optional[StepObserver] = None) -> None:
        self.engine = engine
        self.observer = observer
        self._cond = threading.Condition()
        self._commands: list[Command] = []  # guarded by _cond
        self._pending_adds = 0  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._dead: Optional[BaseException] = None  # set once, under _cond
        self.crash: Optional[BaseException] = None  # what killed the step loop, unless it was shut down
        self._idle = True  # the step thread waits with nothing to do (guarded by _cond)
        self._last_progress = time.monotonic()  # when the step thread last finished a step or a wait
        self._accepting = True
        self._streams: dict[str, RequestStream] = {}  # owned by the step thread
        self._thread: Optional[threading.Thread] = None
        self._go = threading.Event()  # set by start(): a prebuilt thread may begin stepping
        self.num_waiting = 0  # snapshot written by the step thread, read anywhere

    @classmethod
    def from_factory(cls, factory: Callable[[], Any], observer: Optional[StepObserver] = None) -> "AsyncLLMEngine":
        """Build the engine with ``factory()`` on the thread that will step it; blocks
        until it is built and re-raises a failure to build.

        NOTE: torch's OpenMP pool belongs to the thread that first runs a parallel
        op. Loading the model on one thread and stepping on another leaves two
        pools, and libgomp then stops spinning between parallel regions when the
        pools outnumber the cores: every op pays a futex wake-up (30% slower on
        2 cores). Building on the step thread keeps one pool.
        """
        self = cls(None, observer)
        built: concurrent.futures.Future = concurrent.futures.Future()

        def main() -> None:
            try:
                self.engine = factory()
            except BaseException as e:
                built.set_exception(e)
                return
            built.set_result(None)
            self._go.wait()
            self._run()

        self._thread = threading.Thread(target=main, name="inflight-step-loop", daemon=True)
        self._thread.start()
        built.result()
        return self

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the step thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inflight-step-loop", daemon=True)
            self._thread.start()
        self._go.set()

    @property
    def thread(self) -> Optional[threading.Thread]:
        return self._thread

    @property
    def is_alive(self) -> bool:
        """True while the step loop runs and has not crashed."""
        return self._dead is None and self._thread is not None and self._thread.is_alive()

    def seconds_without_progress(self) -> float:
        """How long the step loop has been busy without finishing a step (0 while idle):
        a hung forward pass or a wedged thread shows here while ``is_alive`` stays true."""
        with self._cond:
            # idle with a command just queued still counts as idle: the notify wakes the thread at
            # once, and its last progress may be long ago
            return 0.0 if self._idle else time.monotonic() - self._last_progress

    @property
    def num_unfinished(self) -> int:
        """Requests the engine holds, plus adds still queued for the step thread."""
        with self._cond:
            return len(self._streams) + self._pending_adds

    @property
    def num_waiting_total(self) -> int:
        """Waiting requests plus adds not yet applied: what admission control compares."""
        with self._cond:
            return self.num_waiting + self._pending_adds

    @property
    def accepting(self) -> bool:
        return self._accepting

    def stop_accepting(self) -> None:
        """New requests fail with EngineDeadError from now on; running ones continue."""
        self._accepting = False

    async def abort_all(self) -> None:
        """Abort every request the engine holds (their streams end with finish_reason "abort")."""
        try:
            await self.call(lambda eng: self._abort_all())
        except EngineDeadError:
            pass  # died meanwhile: _die already failed every stream

    async def shutdown(self, grace_period: float = 0.0) -> None:
        """Stop admitting, let running requests finish for up to ``grace_period``
        seconds, abort the rest, and stop the step thread."""
        self.stop_accepting()
        self._go.set()  # a prebuilt thread that was never started must still run down
        deadline = time.monotonic() + grace_period
        while self.num_unfinished and time.monotonic() < deadline and self.is_alive:
            await asyncio.sleep(0.05)
        if self.is_alive:
            await self.abort_all()
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)

    # ------------------------------------------------------------- commands
    def _submit(self, fn: Callable[[], T], is_add: bool = False) -> "concurrent.futures.Future[T]":
        """Queue ``fn`` for the step thread; its result or exception lands in the future."""
        command = Command(fn, concurrent.futures.Future(), is_add)
        with self._cond:
            if self._dead is not None or self._stopping:
                command.fail(EngineDeadError("the engine loop is not running"))
                return command.future
            self._commands.append(command)
            self._pending_adds += int(is_add)
            self._cond.notify()
        connector = getattr(self.engine, "kv_connector", None)
        if connector is not None:  # a step thread idling on KV transfers takes the command at once
            connector.wake()
        return command.future

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(engine)`` on the step thread at the next step boundary."""
        return await asyncio.wrap_future(self._submit(lambda: fn(self.engine)))

    def call_sync(self, fn: Callable[[Any], T], timeout: Optional[float] = None) -> T:
        """``call`` for threads other than the event loop's (tests, benchmarks): blocks."""
        return self._submit(lambda: fn(self.engine)).result(timeout)

    def abort(self, request_id: str) -> None:
        """Abort a request at the next step boundary (thread-safe, non-blocking)."""
        self._submit(lambda: self._do_abort(request_id)).add_done_callback(log_abort_failure)

    # ------------------------------------------------------------- requests
    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams, priority: int = 0,
                          arrival_time: Optional[float] = None, cache_salt: Optional[str] = None,
                          lora_request: Optional[LoRARequest] = None) -> RequestStream:
        """Queue a request and return its output stream once the engine accepted it.

        Raises ValueError for input the engine rejects (the caller answers 400),
        EngineDeadError when the loop is dead or shutting down. A request that later
        fails on its own ends its stream with InvalidRequestError or RequestError.
        """
        if not self._accepting:
            raise EngineDeadError("the server is shutting down")
        stream = RequestStream(self, request_id)
        arrival = arrival_time if arrival_time is not None else time.time()
        add = self._submit(lambda: self._do_add(stream, prompt, params, arrival, priority, cache_salt, lora_request),
                           is_add=True)
        try:
            await asyncio.wrap_future(add)
        except asyncio.CancelledError:
            stream.close()  # the add may still run: the abort queued after it undoes it
            raise
        return stream

    # ------------------------------------------------ step thread internals
    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _do_add(self, stream: RequestStream, prompt: Any, params: SamplingParams,
                arrival: float, priority: int, cache_salt: Optional[str],
                lora_request: Optional[LoRARequest] = None) -> None:
        if stream.request_id in self._streams:
            raise ValueError(f"request id {stream.request_id!r} is already in use")
        kw: dict[str, Any] = {"cache_salt": cache_salt} if cache_salt is not None else {}
        if lora_request is not None:
            kw["lora_request"] = lora_request
        self.engine.add_request(stream.request_id, prompt, params, arrival_time=arrival, priority=priority, **kw)
        self._streams[stream.request_id] = stream
        self.num_waiting = len(self.engine.scheduler.waiting)

    def _do_abort(self, request_id: str) -> None:
        outputs = self.engine.abort_request([request_id])
        stream = self._streams.pop(request_id, None)
        observe(self.observer, "on_abort", self.engine, request_id, outputs)
        if stream is not None:
            deliver([(stream, out) for out in outputs])
        self.num_waiting = len(self.engine.scheduler.waiting)

    def _abort_all(self) -> None:
        for rid in list(self._streams):
            self._do_abort(rid)

    def _next_commands(self) -> Optional[list[Command]]:
        """Block until there is a command or work; None means stop."""
        with self._cond:
            self._idle = True
            while not (self._commands or self._stopping or self.engine.has_unfinished_requests()):
                self._cond.wait()
            self._idle = False
            self._last_progress = time.monotonic()
            if self._stopping and not self._commands:
                return None
            commands, self._commands = self._commands, []
            return commands

    def _run(self) -> None:
        connector = getattr(self.engine, "kv_connector", None)
        if connector is not None:  # a transfer thread with work for an idle step thread wakes it
            connector.on_work = self._wake
        try:
            while True:
                commands = self._next_commands()
                if commands is None:
                    break
                for command in commands:
                    if command.is_add:
                        with self._cond:
                            self._pending_adds -= 1
                    command.run()
                if self.engine.has_unfinished_requests():
                    self._step()
                elif commands:
                    observe(self.observer, "on_step", self.engine, [], 0.0)  # refresh gauges after aborts
        except BaseException as e:
            logger.exception("the engine step loop crashed; failing every pending request")
            self.crash = e
            self._free_all()
            self._die(e)
        else:
            self._die(EngineDeadError("the engine loop was shut down"))

    def _step(self) -> None:
        t0 = time.perf_counter()
        outputs = self.engine.step()
        step_time = time.perf_counter() - t0
        self._last_progress = time.monotonic()
        batch: list[tuple[RequestStream, Any]] = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            batch.append((stream, out if out.error is None else request_error(out)))
            if out.finished:
                del self._streams[out.request_id]
        # NOTE: gauges first, outputs second: a client that sees its request finish
        # and then reads /metrics must find this step's KV usage, not the last one's.
        self.num_waiting = len(self.engine.scheduler.waiting)
        observe(self.observer, "on_step", self.engine, outputs, step_time)
        deliver(batch)

    def _free_all(self) -> None:
        # Best effort after a crash: return the KV blocks, so the gauges read true while the process drains.
        try:
            self.engine.abort_request(list(self._streams))
        except Exception:
            logger.exception("could not free the requests of the crashed engine")

    def _die(self, error: BaseException) -> None:
        with self._cond:
            if not isinstance(error, EngineDeadError):
                error = EngineDeadError(f"the engine loop died: {type(error).__name__}")
            self._dead = error
            commands, self._commands = self._commands, []
            self._pending_adds = 0
        for command in commands:  # fail queued adds/calls instead of leaving them hanging
            command.fail(EngineDeadError(str(error)))
        streams, self._streams = list(self._streams.values()), {}
        deliver([(s, error) for s in streams])


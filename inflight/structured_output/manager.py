"""Compiled grammars, cached by constraint and compiled on a worker thread."""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Optional, Sequence

from inflight.errors import InvalidRequestError
from inflight.structured_output.params import StructuredOutputsParams
from inflight.structured_output.reasoning_gate import ReasoningGate

if TYPE_CHECKING:  # the grammar library is imported on first use: seconds an engine without it never pays
    from inflight.structured_output.backend import GrammarBackend, GrammarState

# Compiled grammars kept (a JSON schema's is a few hundred KB at most); least recently used leave first.
CACHE_SIZE = 256


class StructuredOutputManager:
    """Compiles each constraint once and makes a fresh matcher per request.

    The server compiles before a request is queued (``compile_async``, on this
    manager's thread), so the step thread only ever finds the grammar in the
    cache; the in-process API compiles in ``add_request``. Failures are cached
    too: a bad schema sent again fails again without compiling.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._args = (tokenizer, vocab_size, tuple(eos_token_ids))
        self._backend: Optional[GrammarBackend] = None  # built on first use: ~1 s of vocabulary analysis
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._pool: Optional[ThreadPoolExecutor] = None

    def backend(self) -> "GrammarBackend":
        with self._lock:
            if self._backend is None:
                from inflight.structured_output.backend import GrammarBackend
                self._backend = GrammarBackend(*self._args)
            return self._backend

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``params``; raises InvalidRequestError if it cannot be compiled."""
        key = params.cache_key()
        with self._lock:
            fut = self._cache.get(key)
            owner = fut is None
            if owner:
                fut = self._cache[key] = Future()
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        if owner:
            try:
                fut.set_result(self.backend().compile(params))
            except InvalidRequestError as e:
                fut.set_exception(e)
            except BaseException as e:  # not the request's fault: not cached
                with self._lock:
                    self._cache.pop(key, None)
                fut.set_exception(e)
                raise
        error = fut.exception()  # waits while another thread compiles the same constraint
        if isinstance(error, InvalidRequestError):
            # a fresh exception each time: raising the cached one would grow its traceback forever
            raise InvalidRequestError(str(error))
        return fut.result()

    async def compile_async(self, params: StructuredOutputsParams) -> Any:
        """``compile`` on the manager's worker thread, off the event loop and the step thread."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-grammar")
        return await asyncio.wrap_future(self._pool.submit(self.compile, params))

    def new_state(self, params: StructuredOutputsParams) -> "GrammarState":
        """A matcher at the start of ``params``'s grammar, for one request (behind a
        reasoning gate when the grammar starts after the thinking)."""
        state = self.backend().new_state(self.compile(params))
        if params.after_reasoning is None:
            return state
        return ReasoningGate(state, params.after_reasoning, params.optional_reasoning_start)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

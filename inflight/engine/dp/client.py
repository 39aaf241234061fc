"""``DPEngineClient``: N engine replicas behind the interface the server uses from
``AsyncLLMEngine`` (add_request / generate streams, abort, health, metrics).

Threading model: all state lives on the event loop. Each replica's reader thread
hands its reports to the loop with ``call_soon_threadsafe``; commands go out through
the replica's writer thread, so nothing on the loop ever blocks on a pipe.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import time
from types import SimpleNamespace
from typing import Any, Optional

from inflight.engine.async_stream import EngineDeadError, RequestStream, put_all, request_error
from inflight.engine.dp.metrics import DPMetrics
from inflight.engine.dp.replica_handle import ReplicaHandle
from inflight.engine.dp.router import PrefixAwareRouter
from inflight.engine.dp.serving_view import ServingView
from inflight.engine.dp.wire import AbortCommand, AddCommand, OutputDecoder, StepReport
from inflight.engine.generation_config import default_sampling_params
from inflight.engine.protocol import EngineClient
from inflight.errors import InvalidRequestError
from inflight.lora.request import LoRARequest
from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_ADD_ERRORS = {"ValueError": ValueError, "InvalidRequestError": InvalidRequestError}


def _replica_kwargs(kwargs: dict[str, Any], index: int) -> dict[str, Any]:
    # one trace file per replica: two processes appending lines to one file would interleave them
    if kwargs.get("trace_file"):
        return dict(kwargs, trace_file=f"{kwargs['trace_file']}.dp{index}")
    return kwargs


class DPEngineClient(EngineClient):
    """Data parallelism: ``data_parallel_size`` replicas, each a full engine in its own
    process with its share of the cores, and a :class:`PrefixAwareRouter` in front.

    The constructor blocks until every replica has built its engine; ``start()`` must
    then be called from the event loop that consumes outputs (the app's lifespan does).
    A replica that dies fails its requests with EngineDeadError and sets ``crash``.
    """

    def __init__(self, engine_kwargs: dict[str, Any], data_parallel_size: int, *,
                 balance_abs_threshold: int = 8, startup_timeout_s: float = 900.0) -> None:
        kwargs = {k: v for k, v in engine_kwargs.items() if k != "data_parallel_size"}
        from inflight.platforms import current_platform

        placements = current_platform(kwargs.get("device", "auto")).replica_placements(data_parallel_size)
        ctx = multiprocessing.get_context("spawn")  # a forked torch (threads, OpenMP) is not safe
        if kwargs.get("data_parallel_backend", "mp") == "ray":
            from inflight.engine.dp.ray_replica import start_ray_replicas

            self.replicas = start_ray_replicas([_replica_kwargs(kwargs, i) for i in range(data_parallel_size)],
                                               placements)
        else:
            self.replicas = [ReplicaHandle.spawn(i, ctx, _replica_kwargs(kwargs, i), placement)
                             for i, placement in enumerate(placements)]
        try:
            from inflight.loader import load_tokenizer

            tokenizer = load_tokenizer(kwargs.get("model"))  # while the replicas build their engines
            infos = [r.wait_ready(startup_timeout_s) for r in self.replicas]
        except BaseException:
            for r in self.replicas:
                r.kill()
            raise
        # a script that never shuts the client down must not hang at exit joining its replicas
        atexit.register(self._kill_replicas)
        info = infos[0]
        self.engine = ServingView(tokenizer, info.max_model_len, info.model_source,
                                  SimpleNamespace(vocab_size=info.vocab_size, hidden_size=info.hidden_size),
                                  info.eos_token_ids,
                                  default_sampling_params(info.model_source, kwargs.get("generation_config", "auto"),
                                                          kwargs.get("override_generation_config")),
                                  kwargs.get("max_logprobs", 20), info.pooler_config,
                                  min((i.max_sequence_tokens or i.max_model_len) for i in infos))
        self.block_size = info.block_size
        self.router = PrefixAwareRouter(data_parallel_size, info.block_size, balance_abs_threshold)
        self.metrics = DPMetrics(kwargs.get("served_model_name") or "model", data_parallel_size,
                                 log_interval_s=float("inf"))
        self.observer = None  # what build_state sets on an AsyncLLMEngine; metrics are per replica here
        self.crash: Optional[BaseException] = None
        self._decoder = OutputDecoder()
        self._streams: dict[str, RequestStream] = {}
        self._adds: dict[str, asyncio.Future] = {}
        self._num_waiting = [0] * data_parallel_size
        self._last_progress = [time.monotonic()] * data_parallel_size
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._accepting = True
        self._stopping = False
        self._dead: Optional[EngineDeadError] = None
        logger.info("data parallel: %d replicas ready (pids %s), %d KV blocks each", data_parallel_size,
                    [i.pid for i in infos], info.num_blocks)

    def use_metrics(self, model_name: str, log_interval_s: float) -> DPMetrics:
        """Per-replica metrics under the served model's name (the server calls this once)."""
        self.metrics = DPMetrics(model_name, len(self.replicas), log_interval_s)
        return self.metrics

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start moving messages (idempotent; call on the consuming event loop)."""
        if self._loop is not None:
            return
        self._loop = loop = asyncio.get_running_loop()

        def post(fn, *args: Any) -> None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        for r in self.replicas:
            r.start(lambda i, rep: post(self._on_report, i, rep), lambda i, why: post(self._on_exit, i, why))

    @property
    def is_alive(self) -> bool:
        """True while every replica runs."""
        return self._loop is not None and self._dead is None and not self._stopping

    @property
    def accepting(self) -> bool:
        return self._accepting

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    @property
    def num_waiting_total(self) -> int:
        """Requests waiting in every replica plus adds not yet acknowledged."""
        return sum(self._num_waiting) + len(self._adds)

    def seconds_without_progress(self) -> float:
        """The longest time a replica holding requests has gone without reporting."""
        now = time.monotonic()
        busy = [now - self._last_progress[i] for i, v in enumerate(self.router.replicas) if v.alive and v.load]
        return max(busy, default=0.0)

    async def abort_all(self) -> None:
        for rid in list(self._streams):
            self.abort(rid)

    async def shutdown(self, grace_period: float = 0.0) -> None:
        """Stop admitting, let running requests finish for up to ``grace_period`` seconds,
        then have every replica abort the rest and exit."""
        self.stop_accepting()
        deadline = time.monotonic() + grace_period
        while self._streams and time.monotonic() < deadline and self.is_alive:
            await asyncio.sleep(0.05)
        self._stopping = True
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, r.stop) for r in self.replicas))
        await asyncio.sleep(0)  # let the replicas' last reports (their aborts) land
        self._fail_all(EngineDeadError("the engine was shut down"))

    def _kill_replicas(self) -> None:
        for r in self.replicas:
            try:
                if r.process.is_alive():
                    r.kill()
            except Exception:  # Ray may be gone already at exit: its actors went with it
                pass

    # ------------------------------------------------------------- requests
    def abort(self, request_id: str) -> None:
        """Abort a request on the replica that holds it (any thread, non-blocking)."""
        replica = self.router.replica_of(request_id)
        if replica is not None:
            self.replicas[replica].send(AbortCommand(request_id))

    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams, priority: int = 0,
                          arrival_time: Optional[float] = None, cache_salt: Optional[str] = None,
                          lora_request: Optional[LoRARequest] = None) -> RequestStream:
        """Route a request and return its stream once its replica accepted it (ValueError:
        the replica rejected the input; EngineDeadError: no replica can take it)."""
        if not self._accepting or self._dead is not None or self._loop is None:
            raise EngineDeadError("the server is shutting down" if not self._accepting else
                                  str(self._dead or "the engine is not started"))
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self._tokens(prompt)
        hashes = self.router.prompt_hashes(ids, cache_salt, lora_request.lora_name if lora_request else None)
        decision = self.router.choose(hashes, len(ids))
        r = decision.replica
        if self.router.replicas[r].load == 0:
            self._last_progress[r] = time.monotonic()  # an idle replica has no stall to account for
        self.router.on_routed(request_id, r, hashes)
        self.metrics.on_route(decision, self.block_size)
        stream = RequestStream(self, request_id)
        accepted = self._loop.create_future()
        self._streams[request_id], self._adds[request_id] = stream, accepted
        self._decoder.add(request_id, ids)
        self.replicas[r].send(AddCommand(request_id, {"prompt": text, "prompt_token_ids": ids}, params,
                                         arrival_time if arrival_time is not None else time.time(),
                                         priority, cache_salt, lora_request))
        try:
            await accepted
        except asyncio.CancelledError:
            stream.close()  # the add still lands: the abort queued after it undoes it
            raise
        return stream

    def _tokens(self, prompt: Any) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            return prompt, list(self.engine.tokenizer(prompt).input_ids)
        return None, list(prompt)

    # --------------------------------------------------- replica messages
    def _on_report(self, replica: int, report: StepReport) -> None:
        self._last_progress[replica] = time.monotonic()
        self._num_waiting[replica] = int(report.stats.get("num_waiting", 0)) if report.stats else 0
        # the cache first: requests finishing below stop counting as in-flight prefixes
        self.router.apply_cache_delta(replica, report.cache_added, report.cache_removed)
        for rid, error in report.added:
            self._acknowledge(rid, error)
        for rid, outs in report.aborts:
            outs = [self._decoder.decode(o) for o in outs]
            self.metrics.on_abort(replica, rid, outs)
            self._deliver(rid, outs)
            self._finish(rid)
        if report.step_time is not None:
            outs = [self._decoder.decode(o) for o in report.outputs]
            self.metrics.on_step(replica, outs, report.step_time, report.stats, report.num_scheduled_tokens)
            for out in outs:
                self._deliver(out.request_id, [out if out.error is None else request_error(out)])
                if out.finished:
                    self._finish(out.request_id)
        elif report.stats:
            self.metrics.on_step(replica, [], 0.0, report.stats, 0)  # gauges after adds and aborts
        if report.crash is not None:
            self._on_exit(replica, f"its engine loop crashed: {report.crash}")

    def _acknowledge(self, request_id: str, error: Optional[tuple[str, str]]) -> None:
        accepted = self._adds.pop(request_id, None)
        if error is not None:
            self._streams.pop(request_id, None)
            self._finish(request_id)
        if accepted is None or accepted.done():
            return
        if error is None:
            accepted.set_result(None)
        else:
            accepted.set_exception(_ADD_ERRORS.get(error[0], RuntimeError)(error[1]))

    def _deliver(self, request_id: str, items: list[Any]) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and items:
            put_all([(stream, item) for item in items])

    def _finish(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._decoder.forget(request_id)
        self.router.on_finished(request_id)

    def _on_exit(self, replica: int, why: str) -> None:
        if self._stopping or not self.router.replicas[replica].alive:
            return
        error = EngineDeadError(f"engine replica {replica} died: {why}")
        logger.critical("%s; failing its requests", error)
        self._dead = self._dead or error
        self.crash = self.crash or error
        for rid in self.router.mark_dead(replica):
            self._fail(rid, error)

    def _fail(self, request_id: str, error: BaseException) -> None:
        accepted = self._adds.pop(request_id, None)
        if accepted is not None and not accepted.done():
            accepted.set_exception(error)
        self._deliver(request_id, [error])
        self._streams.pop(request_id, None)
        self._decoder.forget(request_id)

    def _fail_all(self, error: BaseException) -> None:
        for rid in list(self._streams):
            self._fail(rid, error)
            self.router.on_finished(rid)

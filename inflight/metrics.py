"""Prometheus metrics and the periodic stats log line of a serving engine.

Names follow vLLM's (``vllm:num_requests_running`` -> ``inflight:num_requests_running``).
Every metric lives in a per-instance ``CollectorRegistry`` so two servers in one
process (tests) never share or clash. All recording happens on the engine's
step thread; prometheus_client's metric objects are thread-safe for the scrape.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inflight.outputs import PoolingRequestOutput, RequestOutput

logger = logging.getLogger("inflight.stats")

PREFIX = "inflight:"
# running totals in engine.stats() that become Prometheus counters of the same name
_ENGINE_TOTALS = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "spec_decode_num_drafts",
                  "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "kv_transfer_pulls",
                  "kv_transfer_failures", "kv_transfer_tokens", "kv_transfer_seconds")
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                          10.0, 20.0, 40.0, 80.0]
_REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


@dataclass
class _RequestTiming:
    """What the metrics need to remember about one live request."""

    arrival_time: float
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    num_generated: int = 0


@dataclass
class _Window:
    """Token counts since the last log line."""

    start: Optional[float] = None  # time.monotonic() of the window's first step
    prompt_tokens: int = 0
    generation_tokens: int = 0


class EngineMetrics:
    """The engine's Prometheus metrics; also the async engine's step observer.

    ``on_step``/``on_abort`` run on the step thread; ``render()`` on any thread.
    A log line with throughput, queue sizes and cache usage is written every
    ``log_interval_s`` seconds while steps run (an idle engine logs nothing).
    """

    def __init__(self, model_name: str, registry: Optional[CollectorRegistry] = None,
                 log_interval_s: float = 5.0, log_label: str = "") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.log_label = log_label  # starts the stats line: which engine replica it is about
        self.model_name = model_name
        self.log_interval_s = log_interval_s
        self._requests: dict[str, _RequestTiming] = {}
        self._totals = dict.fromkeys(_ENGINE_TOTALS, 0)
        self._window = _Window()
        self._last_hit_rate = (0, 0)  # prefix-cache queries/hits at the previous log line
        self._stats: dict[str, float] = {}
        self._build()

    def _build(self) -> None:
        labels = ["model_name"]

        def make(kind, name, doc, extra_labels=(), **kw):
            metric = kind(PREFIX + name, doc, labels + list(extra_labels), registry=self.registry, **kw)
            return metric if extra_labels else metric.labels(model_name=self.model_name)

        self.num_requests_running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage_perc = make(Gauge, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.prefix_cache_queries = make(Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = make(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = make(Counter, "num_preemptions", "Cumulative number of preemptions.")
        self.spec_decode_num_drafts = make(Counter, "spec_decode_num_drafts",
                                           "Request steps that verified speculative draft tokens.")
        self.spec_decode_num_draft_tokens = make(Counter, "spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_decode_num_accepted_tokens = make(Counter, "spec_decode_num_accepted_tokens",
                                                    "Draft tokens accepted.")
        # prefill/decode disaggregation, on a decode instance (distributed/kv_transfer/)
        self.kv_transfer_pulls = make(Counter, "kv_transfer_pulls", "Prompts whose KV was pulled from a producer.")
        self.kv_transfer_failures = make(Counter, "kv_transfer_failures",
                                         "Pulls that failed (the prompt was computed here instead).")
        self.kv_transfer_tokens = make(Counter, "kv_transfer_tokens", "Prompt tokens whose KV was pulled.")
        self.kv_transfer_seconds = make(Counter, "kv_transfer_seconds", "Time from queuing a pull to its arrival.")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of requests that started generating.")
        self.generation_tokens = make(Counter, "generation_tokens", "Generated tokens.")
        self.request_success = make(Counter, "request_success", "Finished requests by finish reason.",
                                    ["finished_reason"])
        self.time_to_first_token = make(Histogram, "time_to_first_token_seconds", "Time to first token.",
                                        buckets=_TTFT_BUCKETS)
        self.inter_token_latency = make(Histogram, "inter_token_latency_seconds",
                                        "Time between consecutive outputs of a request.",
                                        buckets=_TOKEN_LATENCY_BUCKETS)
        self.time_per_output_token = make(Histogram, "time_per_output_token_seconds",
                                          "Mean time per output token after the first, per request.",
                                          buckets=_TOKEN_LATENCY_BUCKETS)
        self.e2e_request_latency = make(Histogram, "e2e_request_latency_seconds", "End-to-end request latency.",
                                        buckets=_REQUEST_LATENCY_BUCKETS)
        self.request_queue_time = make(Histogram, "request_queue_time_seconds", "Time from arrival to first schedule.",
                                       buckets=_REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = make(Histogram, "iteration_tokens_total", "Tokens computed per engine step.",
                                     buckets=_ITERATION_TOKEN_BUCKETS)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    # ------------------------------------------------------- step observer
    def on_step(self, engine: Any, outputs: list[RequestOutput], step_time: float) -> None:
        """Record one step's outputs and refresh the gauges from the engine."""
        now = time.time()
        if outputs and self._window.start is None:
            self._window.start = time.monotonic() - step_time
        new_prompt = new_generated = 0
        for out in outputs:
            timing = self._requests.setdefault(out.request_id, _RequestTiming(_arrival(out, now)))
            if isinstance(out, PoolingRequestOutput):  # a pooling request: its prompt, once it is done
                if out.finished:
                    new_prompt += len(out.prompt_token_ids) if out.outputs is not None else 0
                    self._finish(out, timing, now)
                continue
            total = sum(len(c.token_ids) for c in out.outputs)
            new = total - timing.num_generated
            if new > 0:
                if timing.first_token_time is None:
                    timing.first_token_time = now
                    self.time_to_first_token.observe(now - timing.arrival_time)
                    new_prompt += len(out.prompt_token_ids)
                else:
                    self.inter_token_latency.observe(now - timing.last_token_time)
                timing.last_token_time, timing.num_generated = now, total
                new_generated += new
            if out.finished:
                self._finish(out, timing, now)
        if outputs:
            scheduled = getattr(engine, "last_num_scheduled_tokens", None)
            self.iteration_tokens.observe(scheduled if scheduled is not None else new_prompt + new_generated)
        self.prompt_tokens.inc(new_prompt)
        self.generation_tokens.inc(new_generated)
        self._window.prompt_tokens += new_prompt
        self._window.generation_tokens += new_generated
        stats = self._refresh(engine)
        self._maybe_log(idle=not (stats["num_running"] or stats["num_waiting"]))

    def on_abort(self, engine: Any, request_id: str, outputs: list[RequestOutput]) -> None:
        """An aborted request leaves: count it and forget its timing."""
        now = time.time()
        for out in outputs:
            timing = self._requests.get(out.request_id) or _RequestTiming(_arrival(out, now))
            self._finish(out, timing, now)
        self._requests.pop(request_id, None)

    def _finish(self, out: RequestOutput, timing: _RequestTiming, now: float) -> None:
        self._requests.pop(out.request_id, None)
        if isinstance(out, PoolingRequestOutput):
            reasons = ["stop" if out.outputs is not None else "error" if out.error else "abort"]
        else:
            reasons = [c.finish_reason for c in out.outputs if c.finish_reason]
        self.request_success.labels(model_name=self.model_name,
                                    finished_reason=reasons[0] if reasons else "abort").inc()
        self.e2e_request_latency.observe(now - timing.arrival_time)
        m = out.metrics
        if m is not None and m.first_scheduled_time is not None:
            self.request_queue_time.observe(max(m.first_scheduled_time - m.arrival_time, 0.0))
        if timing.first_token_time is not None and timing.num_generated > 1:
            self.time_per_output_token.observe(
                (timing.last_token_time - timing.first_token_time) / (timing.num_generated - 1))

    def _refresh(self, engine: Any) -> dict[str, float]:
        stats = engine.stats()
        self.num_requests_running.set(stats["num_running"])
        self.num_requests_waiting.set(stats["num_waiting"])
        self.kv_cache_usage_perc.set(stats["kv_cache_usage"])
        # The engine keeps running totals; Prometheus counters only go up by deltas.
        for name in _ENGINE_TOTALS:
            total = stats.get(name, 0)
            delta = total - self._totals[name]
            if delta > 0:
                getattr(self, name).inc(delta)
            self._totals[name] = total
        self._stats = stats
        return stats

    def _maybe_log(self, idle: bool) -> None:
        """Log every ``log_interval_s`` of busy time, and once when a burst of at least 1 s ends."""
        w = self._window
        if w.start is None or self.log_interval_s == float("inf"):  # inf: logging disabled
            return
        elapsed = time.monotonic() - w.start
        if elapsed >= self.log_interval_s or (idle and elapsed >= min(1.0, self.log_interval_s)):
            stats = self._stats
            queries = self._totals["prefix_cache_queries"] - self._last_hit_rate[0]
            hits = self._totals["prefix_cache_hits"] - self._last_hit_rate[1]
            logger.info("%sprompt throughput: %.1f tokens/s, generation throughput: %.1f tokens/s, running: %d, "
                        "waiting: %d, KV cache usage: %.1f%%, prefix cache hit rate: %.1f%%", self.log_label,
                        w.prompt_tokens / elapsed, w.generation_tokens / elapsed, stats["num_running"],
                        stats["num_waiting"], 100.0 * stats["kv_cache_usage"],
                        100.0 * hits / queries if queries else 0.0)
            self._last_hit_rate = (self._totals["prefix_cache_queries"], self._totals["prefix_cache_hits"])
        elif not idle:
            return
        self._window = _Window()  # logged, or a short burst ended: start afresh with the next step


def _arrival(out: RequestOutput, default: float) -> float:
    return out.metrics.arrival_time if out.metrics is not None else default

"""Iteration-level scheduler: decides, every step, how many new tokens each
request computes under one token budget."""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Iterable, Optional

from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import (EngineCoreOutput, ModelRunnerOutput, ScheduledRequest,
                                   SchedulerOutput)
from inflight.core.request import Request, RequestStatus

logger = logging.getLogger(__name__)


class Scheduler:
    """Continuous batching with chunked prefill, prefix caching and recompute preemption.

    Each step: running requests first (oldest first; a decode takes one token, a
    request mid-prefill its next chunk), then waiting requests by policy while
    ``max_num_seqs``, the token budget and free KV blocks allow; the last prefill
    admitted takes whatever budget remains.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_blocks: int, max_model_len: int) -> None:
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.max_model_len = max_model_len
        self.kv = KVCacheManager(num_blocks, cache_config.block_size, cache_config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._finished_ids: list[str] = []
        self.num_preemptions = 0

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        """Queue a validated request; raises ValueError if it could never fit."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.check_feasible(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def check_feasible(self, request: Request) -> None:
        max_tokens = request.sampling_params.max_tokens or (self.max_model_len - request.num_prompt_tokens)
        need = self.kv.blocks_needed(request.num_prompt_tokens + max_tokens)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) needs {need} KV "
                f"blocks but the whole KV cache has {self.kv.num_blocks} blocks of {self.block_size} tokens")
        if not self.config.enable_chunked_prefill and request.num_prompt_tokens > self.config.max_num_batched_tokens:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens}) and chunked prefill is disabled")

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Finish requests now and return their blocks to the pool."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                self._finish(req, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                self._finish(req, status)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        req.times.finished_time = time.time()
        self.kv.free(req)
        self._finished_ids.append(req.request_id)
        del self.requests[req.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted_req_ids:
            # NOTE: no admissions in a step that had to preempt: memory is short.
            self._schedule_waiting(out, budget)
        out.total_num_scheduled_tokens = sum(s.num_new_tokens for s in out.scheduled)
        for s in out.scheduled:
            if s.request.times.first_scheduled_time is None:
                s.request.times.first_scheduled_time = time.time()
        return out

    def _chunk(self, req: Request, num_computed: int, budget: int) -> int:
        n = min(req.num_tokens - num_computed, budget)
        # The threshold caps prefill chunks, so it only means something when chunking is on.
        if self.config.enable_chunked_prefill and self.config.long_prefill_token_threshold > 0:
            n = min(n, self.config.long_prefill_token_threshold)
        return n

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        scheduled: dict[str, int] = {}
        for req in list(self.running):
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = self._chunk(req, req.num_computed_tokens, budget)
            if n <= 0:
                continue
            while not self.kv.allocate_slots(req, n):
                victim = self._pick_victim()
                if victim is req and len(self.running) == 1:
                    logger.warning("request %s alone exceeds the KV cache (%d blocks); finishing it with "
                                   "finish_reason=length", req.request_id, self.kv.num_blocks)
                    self._finish(req, RequestStatus.FINISHED_LENGTH_CAPPED)
                    break
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id)
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                scheduled[req.request_id] = n
                budget -= n
        out.scheduled.extend(
            ScheduledRequest(r, scheduled[r.request_id], self.kv.get_block_ids(r.request_id))
            for r in self.running if r.request_id in scheduled)
        return budget

    def _pick_victim(self) -> Request:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted_req_ids.append(req.request_id)
        logger.warning("preempted request %s by recompute (preemptions: %d for it, %d in total)",
                       req.request_id, req.num_preemptions, self.num_preemptions)

    def _make_room(self) -> bool:
        """Free memory for a waiting request without preempting; True if something was freed."""
        return False

    def _admissible(self):
        """Waiting requests that may start now (all of them, for continuous batching)."""
        return self.waiting

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            candidates = self._admissible()
            if not candidates:
                break
            if self.config.scheduling_policy == "priority":
                req = min(candidates, key=lambda r: (r.priority, r.arrival_time))
            else:
                req = candidates[0]
            computed = self.kv.get_computed_blocks(req)
            n = self._chunk(req, computed.num_tokens, budget)
            # NOTE: without chunked prefill a prompt runs whole or not at all; a request
            # preempted mid-generation may still be recomputed in chunks, else a
            # prompt+output longer than the budget could never resume.
            if (not self.config.enable_chunked_prefill and req.num_output_tokens == 0
                    and n < req.num_tokens - computed.num_tokens):
                break
            if not self.kv.allocate_slots(req, n, computed):
                if self._make_room():
                    continue
                break
            self.waiting.remove(req)
            req.num_computed_tokens = computed.num_tokens
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed.num_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n, self.kv.get_block_ids(req.request_id)))
            budget -= n

    # ------------------------------------------------------------------ update
    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance progress, append sampled tokens, apply stop conditions, free finished."""
        outputs = []
        now = time.time()
        for s in sched.scheduled:
            req = s.request
            if req.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            req.num_computed_tokens += s.num_new_tokens
            token = result.sampled_token_ids.get(req.request_id)
            if token is None:
                continue
            req.append_output_token(token)
            if req.times.first_token_time is None:
                req.times.first_token_time = now
            req.times.last_token_time = now
            status = self._check_stop(req, token)
            if status is not None:
                self._finish(req, status)
            lp = result.logprobs.get(req.request_id)
            outputs.append(EngineCoreOutput(
                req.request_id, [token], status.finish_reason if status else None, req.stop_reason,
                [lp] if lp is not None else None, max(req.num_cached_tokens, 0)))
        return outputs

    def _check_stop(self, req: Request, token: int) -> Optional[RequestStatus]:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

"""Iteration-level scheduler: decides, every step, how many new tokens each
request computes under one token budget."""
from __future__ import annotations

import logging
import time
from typing import Iterable, Optional, Sequence

from inflight.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from inflight.core.admission import AdmissionQueue, check_feasible, chunk_size
from inflight.core.batching import BatchingPolicy
from inflight.core.hybrid_kv import make_kv_cache_manager
from inflight.core.outputs import EngineCoreOutput, ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from inflight.core.pooling import step_result
from inflight.core.preemption import Preemptor, VictimPolicy
from inflight.core.request import Request, RequestStatus
from inflight.core.spec_decode import DraftPlanner
from inflight.core.static_scheduler import StaticBatching
from inflight.core.stop import append_tokens
from inflight.core.swap import SwapSpace
from inflight.core.worker_view import WorkerView

logger = logging.getLogger(__name__)


class Scheduler:
    """Continuous batching with chunked prefill, prefix caching, and preemption by
    recompute or swap; or static batching (``scheduling="static"``), as a policy.

    Each step: under the priority policy, a waiting request may first preempt
    lower-priority running ones, and with the fairness policy a queued
    interactive request may preempt a long generation beyond its seat share
    (core/preemption.py, core/admission.py); then running requests
    (oldest first; a decode takes one token, a request mid-prefill its next
    chunk; one that cannot get a block preempts); then, unless that preempted,
    swapped requests resume and waiting ones are admitted (core/admission.py)
    while ``max_num_seqs``, the token budget and free KV blocks above the
    watermark allow; the last prefill admitted takes whatever budget remains;
    speculative draft tokens, if any, get what is left after that (core/spec_decode.py).

    Composed of parts with small interfaces: the admission queue (who waits, in
    what order, and taking a request off the queue with its blocks), the victim
    policy and the preemptor (who yields, and how), the draft planner, the
    batching policy (core/batching.py; static batching in core/static_scheduler.py)
    and the worker view (what the worker was sent).

    ``num_host_blocks`` sizes the host pool for ``preemption_mode="swap"`` (the
    worker computes it from ``swap_space``); with none, swap falls back to recompute.
    ``sliding_window``: the model's, when every layer has it (the KV manager then
    frees the blocks that fall out of it). ``layer_windows``: each layer's window where
    they differ and the worker lays its KV pool out in layer groups: the KV manager is
    then a :class:`HybridKVCacheManager` (block counts are pool blocks of one layer per
    group; every request has a block table per group). ``max_loras`` (with LoRA): the
    adapters the running batch may mix; a request of another adapter waits its turn.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_blocks: int, max_model_len: int, num_host_blocks: int = 0,
                 speculative_config: Optional[SpeculativeConfig] = None,
                 sliding_window: Optional[int] = None, batching: Optional[BatchingPolicy] = None,
                 layer_windows: Optional[Sequence[Optional[int]]] = None, max_loras: Optional[int] = None) -> None:
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.max_model_len = max_model_len
        self.kv = make_kv_cache_manager(num_blocks, cache_config.block_size, cache_config.enable_prefix_caching,
                                        sliding_window, layer_windows, scheduler_config.preemption_mode)
        if batching is None:
            batching = StaticBatching(scheduler_config) if scheduler_config.scheduling == "static" \
                else BatchingPolicy()
        self.batching = batching
        swap_mode = scheduler_config.preemption_mode == "swap" and batching.supports_swap
        self.swap = SwapSpace(num_host_blocks if swap_mode else 0)
        if swap_mode and not self.swap.num_blocks:
            logger.warning("preemption_mode=swap with no host swap space (swap_space=0): "
                           "every preemption falls back to recompute")
        self.watermark_blocks = int(scheduler_config.watermark * num_blocks)
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.batching.bind(self.running, self.kv, self._finish_now)
        self.queue = AdmissionQueue(scheduler_config, batching, self.running, self.kv, self.swap,
                                    self.watermark_blocks, max_loras)
        self.victims = VictimPolicy(scheduler_config, self.queue.is_long)
        self.preemptor = Preemptor(scheduler_config, self.kv, self.swap, self.queue, self.victims, batching)
        self.drafts = DraftPlanner(speculative_config, max_model_len) if speculative_config is not None else None
        self._finished_ids: list[str] = []
        self._pending_outputs: list[EngineCoreOutput] = []  # finishes decided in schedule()
        self.kv_connector = None  # prefill/decode disaggregation's KVConnectorBase, set by the engine
        # This step's batch as the scheduler sees it (with the Requests); the worker gets data only.
        self.last_scheduled: list[ScheduledRequest] = []
        self.worker_view = WorkerView([w is not None for w in self.kv.group_windows])
        # Structured output's step masks (structured_output.GrammarMasks), set by the engine.
        self.grammar_masks = None

    # The parts' state under the names the engine, the metrics and the tests read.
    waiting = property(lambda self: self.queue.waiting)
    swapped = property(lambda self: self.queue.swapped)
    num_preemptions = property(lambda self: self.preemptor.num_preemptions)
    num_swap_outs = property(lambda self: self.preemptor.num_swap_outs)
    num_swap_fallbacks = property(lambda self: self.preemptor.num_swap_fallbacks)
    num_spec_drafts = property(lambda self: self.drafts.num_spec_drafts if self.drafts else 0)
    num_draft_tokens = property(lambda self: self.drafts.num_draft_tokens if self.drafts else 0)
    num_accepted_tokens = property(lambda self: self.drafts.num_accepted_tokens if self.drafts else 0)

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        """Queue a validated request; raises ValueError if it could never fit."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.check_feasible(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def check_feasible(self, request: Request) -> None:
        """Raise ValueError if the request could never run, whatever else is running."""
        check_feasible(self.config, self.kv, self.max_model_len, request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Finish requests now and return their blocks to the pool."""
        self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Finish requests (unknown or finished ones are skipped) with ``status``."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                self._finish(req, status)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        if not self.batching.keeps_row(req, status):
            self._finish_now(req, status)

    def _finish_now(self, req: Request, status: RequestStatus) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.SWAPPED:
            self.swapped.remove(req)
            self.swap.free(req.request_id)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        req.times.finished_time = time.time()
        if self.kv_connector is None or not self.kv_connector.request_finished(req):
            self.kv.free(req)  # else the connector frees them once a consumer has pulled them
        req.structured_output = None  # frees its grammar matcher
        self._finished_ids.append(req.request_id)
        del self.requests[req.request_id]
        self.batching.on_finished(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def check_integrity(self) -> None:
        """Assert the invariants of both pools and that each request is where its status says."""
        self.kv.check_integrity()
        self.swap.check_integrity()
        for r in self.swapped:
            assert r.status == RequestStatus.SWAPPED and self.kv.num_blocks_of(r.request_id) == 0
            assert self.swap.num_blocks_of(r.request_id) > 0, f"swapped request {r.request_id} holds no host blocks"
        for r in self.waiting:
            assert self.kv.num_blocks_of(r.request_id) == 0, f"waiting request {r.request_id} holds blocks"
        assert set(self.swap.req_to_blocks) == {r.request_id for r in self.swapped}

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch; see the class docstring for the order."""
        self.batching.before_schedule(self.waiting)
        out = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = []
        self.queue.preempted_now = set()
        self.last_scheduled = []
        self.preemptor.preempt_for_policy(out)
        num_policy_preemptions = len(out.preempted_req_ids)
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if len(out.preempted_req_ids) == num_policy_preemptions:
            # NOTE: no admissions in a step whose running requests had to preempt: memory is short.
            budget = self._schedule_waiting(out, budget)
            if self.drafts is not None:
                self.drafts.add_drafts(self.last_scheduled, budget, self._reserve,
                                       self.kv.get_group_block_ids)
        for s in self.last_scheduled:
            if s.request.times.first_scheduled_time is None:
                s.request.times.first_scheduled_time = time.time()
        self.worker_view.emit(out, self.last_scheduled)
        if self.grammar_masks is not None:
            self.grammar_masks.start(out, self.requests)
        return out

    def _reserve(self, req: Request, n: int) -> bool:
        """Take the slots of ``n`` more tokens for a running request, keeping the watermark."""
        return self.queue.room_for(self.kv.num_blocks_to_allocate(req, n)) and self.kv.allocate_slots(req, n)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        scheduled: dict[str, int] = {}
        for req in list(self.running):
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = chunk_size(self.config, req, req.num_computed_tokens, budget)
            if n <= 0:
                continue
            while not self.kv.allocate_slots(req, n):
                victim = self.batching.victim() or self.victims.pick(self.running, req)
                if victim is req and len(self.running) == 1:
                    self._finish_infeasible(req)
                    break
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id)
                self.preemptor.preempt(victim, out)
                if victim is req:
                    break
            else:
                scheduled[req.request_id] = n
                budget -= n
        self.last_scheduled.extend(
            ScheduledRequest(r, scheduled[r.request_id], self.kv.get_group_block_ids(r.request_id))
            for r in self.running if r.request_id in scheduled)
        return budget

    def _finish_infeasible(self, req: Request) -> None:
        """A request that alone fills the pool ends with finish_reason=length (never a hang).

        NOTE: admission rejects prompt + max_tokens that cannot fit, so this is defence
        in depth; the output goes out with the next update_from_output."""
        logger.warning("request %s alone fills the KV cache (%d blocks of %d tokens, %d tokens needed); "
                       "finishing it with finish_reason=length", req.request_id, self.kv.num_blocks,
                       self.block_size, req.num_tokens)
        self._finish(req, RequestStatus.FINISHED_LENGTH_CAPPED)
        self._pending_outputs.append(EngineCoreOutput(req.request_id, [], "length", None, None,
                                                      max(req.num_cached_tokens, 0)))

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.queue.next_candidate()
            if req is None:
                break
            if req.status == RequestStatus.SWAPPED:
                n = self.queue.resume_swapped(req, out, budget, self._start)
            else:
                n = self.queue.admit(req, budget, self.kv_connector, self._start)
            if n is None:  # short of blocks
                if self.batching.make_room():
                    continue
                break
            if n == 0:  # a whole prompt does not fit the budget left
                break
            budget -= n
        return budget

    def _start(self, req: Request, n: int) -> None:
        """Put a request that holds its blocks into the batch (the admission queue calls it)."""
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.last_scheduled.append(ScheduledRequest(req, n, self.kv.get_group_block_ids(req.request_id)))

    # ------------------------------------------------------------------ update
    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance progress, append sampled tokens, apply stop conditions, free finished."""
        outputs, self._pending_outputs = self._pending_outputs, []
        self.batching.filter_result(sched, result)
        if self.grammar_masks is not None:
            self.grammar_masks.advance(sched, result, self.requests)
        now = time.time()
        for rid, num_new in sched.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            tokens = result.sampled_token_ids.get(req.request_id)
            drafts = sched.scheduled_spec_decode_tokens.get(rid, ())
            # NOTE: rejected drafts leave KV in slots past num_computed_tokens; the
            # tokens that later take those positions overwrite it before any read.
            num_rejected = len(drafts) - (len(tokens) - 1 if tokens else 0)
            req.num_computed_tokens += num_new - num_rejected
            if req.request_id in result.prompt_logprobs:
                req.add_prompt_logprobs(*result.prompt_logprobs[req.request_id])
            if req.pooling is not None:  # it samples nothing: it ends with its prompt, pooled
                if (data := step_result(req, result.pooled, result.failed)) is not None:
                    req.times.first_token_time = req.times.last_token_time = now
                    self._finish(req, RequestStatus.FINISHED_STOPPED)
                    outputs.append(EngineCoreOutput(req.request_id, [], "stop", None, None,
                                                    max(req.num_cached_tokens, 0), pooling_output=data))
                continue
            if not tokens:
                continue
            first_output = req.num_output_tokens == 0
            if self.drafts is not None:
                self.drafts.count(drafts, tokens)
            new, status = append_tokens(req, tokens, self.max_model_len)
            if req.times.first_token_time is None:
                req.times.first_token_time = now
            req.times.last_token_time = now
            if status is not None:
                self._finish(req, status)
            elif self.drafts is not None:
                req.spec_token_ids = self.drafts.propose(req, len(self.running))
            lp = result.logprobs.get(req.request_id)
            plp = req.prompt_logprobs if first_output and req.sampling_params.prompt_logprobs is not None else None
            outputs.append(EngineCoreOutput(
                req.request_id, new, status.finish_reason if status else None, req.stop_reason,
                [lp] if lp is not None else None, max(req.num_cached_tokens, 0), plp))
        return self.batching.release(outputs)

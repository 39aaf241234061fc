"""Preemption: who yields when KV blocks run short, and how (recompute or swap).

Rules, in order of precedence:

* A running request that cannot get a block for its next chunk preempts the
  most preemptible running request, possibly itself: under ``fcfs`` the newest
  by arrival, under ``priority`` the lowest priority (largest number), newest
  among ties. With the fairness policy on, long generations yield before
  interactive requests (after priority, under ``priority``).
* Progress guarantee: a request preempted ``max_preemptions_per_request``
  times is never preempted again in favour of newer work (a requester that
  arrived after it), and does not preempt itself while another running
  request may yield instead. After that only older requests can take its
  blocks, so the oldest such request always progresses; under plain ``fcfs`` victims are
  the newest anyway, so the oldest running request is never preempted at all.
* Under ``priority``, before anything else is scheduled, a waiting (or
  swapped) request preempts running requests of strictly lower priority while
  it cannot get a seat or the blocks for its first chunk.
* With the fairness policy on, an interactive request that finds every seat
  taken while long generations hold more than their share preempts the
  newest of them (under ``priority``, only one of no better priority; see
  :mod:`inflight.core.admission`).
* Static batching never preempts for priority or fairness (its batches are
  fixed) and preempts by recompute only (``core/static_scheduler.py``).
* ``swap`` copies the request's computed blocks into the host pool and keeps
  its progress; when the host pool cannot hold them it falls back to
  recompute (free the blocks, ``num_computed_tokens = 0``).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

from inflight.config import SchedulerConfig
from inflight.core.admission import AdmissionQueue, chunk_size
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import SchedulerOutput
from inflight.core.request import Request, RequestStatus
from inflight.core.swap import SwapSpace

if TYPE_CHECKING:
    from inflight.core.batching import BatchingPolicy

logger = logging.getLogger("inflight.core.scheduler")


class VictimPolicy:
    """Who yields: the order running requests are preempted in, and the progress guarantee.

    ``is_long`` tells long generations apart (the admission queue's seat-share rule)."""

    def __init__(self, config: SchedulerConfig, is_long: Callable[[Request], bool]) -> None:
        self.config = config
        self.is_long = is_long

    def protected(self, r: Request, requester: Optional[Request]) -> bool:
        """True if ``r`` may not be preempted for ``requester`` (progress guarantee)."""
        return (requester is not None and r is not requester
                and r.num_preemptions >= self.config.max_preemptions_per_request
                and r.arrival_time < requester.arrival_time)

    def key(self, r: Request, index: int) -> tuple:
        """Larger is preempted first; ``index`` (position in running) breaks arrival ties.
        Priority (under that policy) outranks the long-generation preference."""
        base = (r.priority,) if self.config.scheduling_policy == "priority" else ()
        return (*base, self.is_long(r), r.arrival_time, index)

    def pick(self, running: list[Request], requester: Optional[Request]) -> Request:
        """The running request to preempt so that ``requester`` (running too) gets a block."""
        cands = [(self.key(r, i), r) for i, r in enumerate(running) if not self.protected(r, requester)]
        if requester is not None and requester.num_preemptions >= self.config.max_preemptions_per_request:
            # NOTE: a request out of preemptions yields to itself only when no one else may yield:
            # the lowest-priority oldest request would otherwise preempt itself again and again
            # while newer requests, which may not preempt it, preempt themselves (a livelock)
            cands = [c for c in cands if c[1] is not requester] or cands
        return max(cands, key=lambda c: c[0])[1]

    def for_priority(self, running: list[Request], cand: Request) -> Optional[Request]:
        """The running request of lower priority than ``cand`` that yields to it, or None."""
        victims = [(self.key(r, i), r) for i, r in enumerate(running)
                   if r.priority > cand.priority and not self.protected(r, cand)]
        return max(victims, key=lambda c: c[0])[1] if victims else None

    def for_fairness(self, running: list[Request], newest: Request) -> Optional[Request]:
        """The newest long generation that yields its seat to the interactive ``newest``, or None."""
        by_priority = self.config.scheduling_policy == "priority"
        victims = [(r.arrival_time, i, r) for i, r in enumerate(running)
                   if self.is_long(r) and not self.protected(r, newest)
                   and (not by_priority or r.priority >= newest.priority)]
        return max(victims, key=lambda v: v[:2])[2] if victims else None


class Preemptor:
    """How a request yields: its KV goes to the host pool (swap) when it fits
    there, else it is freed and the request recomputes from its tokens (unless
    the batching policy ends it instead). Also the preemptions the priority and
    fairness policies make before a step is scheduled."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, swap: SwapSpace, queue: AdmissionQueue,
                 victims: VictimPolicy, batching: "BatchingPolicy") -> None:
        self.config, self.kv, self.swap, self.queue = config, kv, swap, queue
        self.victims, self.batching, self.running = victims, batching, queue.running
        self.num_preemptions = 0
        self.num_swap_outs = 0  # preemptions whose KV went to the host pool
        self.num_swap_fallbacks = 0  # swap preemptions that found the host pool full and recomputed

    def preempt_for_policy(self, out: SchedulerOutput) -> None:
        """The priority and fairness preemptions (where the batching policy has them)."""
        if self.batching.preempts_for_policy:
            self._for_priority(out)
            self._for_fairness(out)

    def _for_priority(self, out: SchedulerOutput) -> None:
        """Under ``priority``: let the best waiting request displace lower-priority running ones.

        NOTE: runs before anything of this step is scheduled, so the victims hold
        only computed blocks."""
        if self.config.scheduling_policy != "priority":
            return
        while self.running:
            cand = self.queue.next_candidate()
            if cand is None:
                return
            if len(self.running) < self.config.max_num_seqs and self._fits_now(cand):
                return
            victim = self.victims.for_priority(self.running, cand)
            if victim is None:
                return
            self.preempt(victim, out)

    def _for_fairness(self, out: SchedulerOutput) -> None:
        """Give queued interactive requests the seats long generations hold beyond their share."""
        if self.config.long_generation_threshold <= 0:
            return
        waiting = self.queue.interactive_queued()
        while waiting > self.config.max_num_seqs - len(self.running) and self.queue.long_over_share() > 0:
            victim = self.victims.for_fairness(self.running, self.queue.newest_interactive())
            if victim is None:
                return
            self.preempt(victim, out)

    def _fits_now(self, cand: Request) -> bool:
        """Whether ``cand`` could start this step without preempting anyone (an estimate
        that ignores prefix-cache hits and reserves a block for each running request
        whose next token opens a new block)."""
        if cand.status == RequestStatus.SWAPPED:
            need = self.kv.blocks_to_resume(cand, self.swap.num_blocks_of(cand.request_id), 1)
        else:
            need = self.kv.blocks_needed(chunk_size(self.config, cand, 0, self.config.max_num_batched_tokens))
        reserve = sum(1 for r in self.running if r.num_computed_tokens % self.kv.block_size == 0)
        return self.queue.room_for(need + reserve)

    def preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Take a running request off the batch, by swap if possible, else by recompute."""
        if self.batching.drops_instead_of_preempting(req):
            return
        self.running.remove(req)
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.queue.preempted_now.add(req.request_id)
        out.preempted_req_ids.append(req.request_id)
        mode = "swap" if self.config.preemption_mode == "swap" and self._swap_out(req, out) else "recompute"
        if mode == "recompute":
            self.kv.free_preempted(req)
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0
            self.queue.waiting.appendleft(req)
        logger.warning("preempted request %s by %s (preemptions: %d for it, %d in total; "
                       "%d running, %d waiting, %d swapped)", req.request_id, mode, req.num_preemptions,
                       self.num_preemptions, len(self.running), len(self.queue.waiting), len(self.queue.swapped))

    def _swap_out(self, req: Request, out: SchedulerOutput) -> bool:
        """Move a request's computed KV to the host pool; False if it does not fit there."""
        ids = self.kv.computed_block_ids(req)
        if not self.swap.can_hold(len(ids)):
            if ids:
                self.num_swap_fallbacks += 1
            if ids and self.swap.num_blocks:  # (with no host pool at all, the scheduler warned once)
                logger.warning("host swap pool full (%d of %d blocks free, %d needed): request %s "
                               "falls back to recompute", self.swap.num_free_blocks, self.swap.num_blocks,
                               len(ids), req.request_id)
            return False
        out.blocks_to_swap_out.extend(self.swap.swap_out(req.request_id, ids))
        self.kv.free_preempted(req)
        req.status = RequestStatus.SWAPPED
        self.queue.swapped.append(req)
        self.num_swap_outs += 1
        return True

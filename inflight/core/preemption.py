"""Preemption: who yields when KV blocks run short, and how (recompute or swap).

Rules, in order of precedence:

* A running request that cannot get a block for its next chunk preempts the
  most preemptible running request, possibly itself: under ``fcfs`` the newest
  by arrival, under ``priority`` the lowest priority (largest number), newest
  among ties. With the fairness policy on, long generations yield before
  interactive requests (after priority, under ``priority``).
* Progress guarantee: a request preempted ``max_preemptions_per_request``
  times is never preempted again in favour of newer work (a requester that
  arrived after it). After that only older requests can take its blocks, so
  the oldest such request always progresses; under plain ``fcfs`` victims are
  the newest anyway, so the oldest running request is never preempted at all.
* Under ``priority``, before anything else is scheduled, a waiting (or
  swapped) request preempts running requests of strictly lower priority while
  it cannot get a seat or the blocks for its first chunk.
* With the fairness policy on, an interactive request that finds every seat
  taken while long generations hold more than their share preempts the
  newest of them (under ``priority``, only one of no better priority; see
  :mod:`inflight.core.admission`).
* ``swap`` copies the request's computed blocks into the host pool and keeps
  its progress; when the host pool cannot hold them it falls back to
  recompute (free the blocks, ``num_computed_tokens = 0``).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from inflight.core.outputs import SchedulerOutput
from inflight.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from inflight.core.scheduler import Scheduler

logger = logging.getLogger("inflight.core.scheduler")


class PreemptionMixin:
    """Victim choice and the two preemption modes, mixed into :class:`Scheduler`."""

    # The running request asking for blocks; set by the caller before _pick_victim()
    # (kept out of the signature, which subclasses override without arguments).
    _requester: Optional[Request] = None

    def _protected(self: "Scheduler", r: Request, requester: Optional[Request]) -> bool:
        """True if ``r`` may not be preempted for ``requester`` (progress guarantee)."""
        return (requester is not None and r is not requester
                and r.num_preemptions >= self.config.max_preemptions_per_request
                and r.arrival_time < requester.arrival_time)

    def _victim_key(self: "Scheduler", r: Request, index: int) -> tuple:
        """Larger is preempted first; ``index`` (position in running) breaks arrival ties.
        Priority (under that policy) outranks the long-generation preference."""
        base = (r.priority,) if self.config.scheduling_policy == "priority" else ()
        return (*base, self._is_long(r), r.arrival_time, index)

    def _pick_victim(self: "Scheduler") -> Request:
        req = self._requester
        cands = [(self._victim_key(r, i), r) for i, r in enumerate(self.running)
                 if not self._protected(r, req)]
        return max(cands, key=lambda c: c[0])[1]

    def _preempt(self: "Scheduler", req: Request, out: SchedulerOutput) -> None:
        """Take a running request off the batch, by swap if possible, else by recompute."""
        self.running.remove(req)
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_now.add(req.request_id)
        out.preempted_req_ids.append(req.request_id)
        mode = "swap" if self.config.preemption_mode == "swap" and self._swap_out(req, out) else "recompute"
        if mode == "recompute":
            self.kv.free_preempted(req)
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0
            self.waiting.appendleft(req)
        logger.warning("preempted request %s by %s (preemptions: %d for it, %d in total; "
                       "%d running, %d waiting, %d swapped)", req.request_id, mode, req.num_preemptions,
                       self.num_preemptions, len(self.running), len(self.waiting), len(self.swapped))

    def _swap_out(self: "Scheduler", req: Request, out: SchedulerOutput) -> bool:
        """Move a request's computed KV to the host pool; False if it does not fit there."""
        ids = self.kv.computed_block_ids(req)
        if not self.swap.can_hold(len(ids)):
            if ids:
                self.num_swap_fallbacks += 1
            if ids and self.swap.num_blocks:  # (with no host pool at all, __init__ warned once)
                logger.warning("host swap pool full (%d of %d blocks free, %d needed): request %s "
                               "falls back to recompute", self.swap.num_free_blocks, self.swap.num_blocks,
                               len(ids), req.request_id)
            return False
        out.blocks_to_swap_out.extend(self.swap.swap_out(req.request_id, ids))
        self.kv.free_preempted(req)
        req.status = RequestStatus.SWAPPED
        self.swapped.append(req)
        self.num_swap_outs += 1
        return True

    def _preempt_for_priority(self: "Scheduler", out: SchedulerOutput) -> None:
        """Under ``priority``: let the best waiting request displace lower-priority running ones.

        NOTE: runs before anything of this step is scheduled, so the victims hold
        only computed blocks; static batching never preempts for priority (its
        batches are fixed)."""
        if self.config.scheduling_policy != "priority" or self.config.scheduling != "continuous":
            return
        while self.running:
            cand = self._next_candidate()
            if cand is None:
                return
            if len(self.running) < self.config.max_num_seqs and self._fits_now(cand):
                return
            victims = [(self._victim_key(r, i), r) for i, r in enumerate(self.running)
                       if r.priority > cand.priority and not self._protected(r, cand)]
            if not victims:
                return
            self._preempt(max(victims, key=lambda c: c[0])[1], out)

    def _preempt_for_fairness(self: "Scheduler", out: SchedulerOutput) -> None:
        """Give queued interactive requests the seats long generations hold beyond their share."""
        if self.config.long_generation_threshold <= 0 or self.config.scheduling != "continuous":
            return
        waiting = self._interactive_queued()
        by_priority = self.config.scheduling_policy == "priority"
        while waiting > self.config.max_num_seqs - len(self.running) and self._long_over_share() > 0:
            newest = self._queued_interactive_newest()
            victims = [(r.arrival_time, i, r) for i, r in enumerate(self.running)
                       if self._is_long(r) and not self._protected(r, newest)
                       and (not by_priority or r.priority >= newest.priority)]
            if not victims:
                return
            self._preempt(max(victims, key=lambda v: v[:2])[2], out)

    def _queued_interactive_newest(self: "Scheduler") -> Request:
        return max((r for r in self._queued() if not self._is_long(r)), key=lambda r: r.arrival_time)

    def _fits_now(self: "Scheduler", cand: Request) -> bool:
        """Whether ``cand`` could start this step without preempting anyone (an estimate
        that ignores prefix-cache hits and reserves a block for each running request
        whose next token opens a new block)."""
        if cand.status == RequestStatus.SWAPPED:
            need = self.kv.blocks_to_resume(cand, self.swap.num_blocks_of(cand.request_id), 1)
        else:
            need = self.kv.blocks_needed(self._chunk(cand, 0, self.config.max_num_batched_tokens))
        reserve = sum(1 for r in self.running if r.num_computed_tokens % self.block_size == 0)
        return self._room_for(need + reserve)

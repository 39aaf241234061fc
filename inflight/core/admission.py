"""Admission: which queued request starts next, and whether memory allows it.

Order. Swapped requests come before waiting ones (under ``fcfs`` always;
under ``priority`` they compete by ``(priority, arrival)`` like everyone
else). Waiting requests keep queue order under ``fcfs`` (recompute-preempted
requests sit at the front), and go by ``(priority, arrival)`` under
``priority``. A request preempted in this step is not resumed in it.

Watermark. While anything runs, a request is admitted only if at least
``watermark * num_blocks`` blocks stay free afterwards (vLLM keeps 1%): the
running requests need room to grow, and admitting into the last free blocks
only to preempt the newcomer a step later is thrashing. With nothing running
the watermark is waived, so it can never block progress.

Fairness for interactive traffic: a seat share for long generations.
A request whose ``max_tokens`` exceeds ``long_generation_threshold`` is a
*long generation*. Long generations together may hold at most
``long_generation_seat_share`` of the ``max_num_seqs`` seats (at least one);
admission skips a long request when that share is full and takes the next
interactive one behind it, so a flood of long generations cannot occupy every
seat and queue interactive requests behind thousands of decode steps: their
wait is bounded by the other interactive requests, not by the flood. When
blocks run out, long generations are also preempted before interactive ones.
Why this policy: it needs no knowledge beyond what the client declares
(``max_tokens``), costs nothing when there is no interactive traffic except
the reserved seats, and its effect is easy to reason about; priority aging
would only reorder a queue whose head is still stuck behind full seats. The
price: the reserved seats stay empty when no interactive request is waiting.
Off by default (``long_generation_threshold=0``); ``benchmarks/fairness.py``
measures it.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable, Optional

from inflight.core.request import Request

if TYPE_CHECKING:
    from inflight.core.scheduler import Scheduler


class AdmissionMixin:
    """Candidate order, the watermark and the long-generation seat share, mixed into :class:`Scheduler`."""

    def _is_long(self: "Scheduler", r: Request) -> bool:
        # NOTE: static batches are fixed up front; a seat share there could strand a member.
        t = self.config.long_generation_threshold
        return t > 0 and r.max_tokens > t and self.config.scheduling == "continuous"

    def _long_seats(self: "Scheduler") -> int:
        return max(1, int(self.config.long_generation_seat_share * self.config.max_num_seqs))

    def _room_for(self: "Scheduler", num_blocks: int) -> bool:
        """Whether ``num_blocks`` more blocks can be taken while keeping the watermark."""
        keep = self.watermark_blocks if self.running else 0
        return self.kv.num_free_blocks - num_blocks >= keep

    def _queued(self: "Scheduler") -> Iterable[Request]:
        """Swapped requests (by arrival), then the admissible waiting ones in queue order."""
        swapped = sorted(self.swapped, key=lambda r: r.arrival_time)
        return itertools.chain(swapped, self._admissible())

    def _next_candidate(self: "Scheduler") -> Optional[Request]:
        """The request admission should try next, or None."""
        long_full = False
        if self.config.long_generation_threshold > 0 and self.config.scheduling == "continuous":
            long_full = sum(1 for r in self.running if self._is_long(r)) >= self._long_seats()
        by_priority = self.config.scheduling_policy == "priority"
        best: Optional[Request] = None
        for r in self._queued():
            if r.request_id in self._preempted_now or (long_full and self._is_long(r)):
                continue
            if not by_priority:
                return r
            if best is None or (r.priority, r.arrival_time) < (best.priority, best.arrival_time):
                best = r
        return best

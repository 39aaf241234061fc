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

Fairness for interactive traffic: a work-conserving seat share for long
generations. A request whose ``max_tokens`` exceeds
``long_generation_threshold`` is a *long generation*; the others are
*interactive*. Long generations are entitled to ``long_generation_seat_share``
of the ``max_num_seqs`` seats (at least one):

* while an interactive request is queued, admission skips long requests once
  they hold their share, and takes the interactive one behind them;
* with no interactive request queued, long requests may fill every seat
  (no seat idles for traffic that is not there);
* when an interactive request is queued, every seat is taken and long
  generations hold more than their share, the newest such long generation is
  preempted (swap or recompute; core/preemption.py) to give it a seat;
* when KV blocks run out, long generations are preempted before interactive ones.

So a flood of long generations cannot queue interactive requests behind
thousands of decode steps: an interactive request waits for at most one step
plus the other interactive requests. Why this policy: it needs nothing beyond
what the client declares (``max_tokens``); the reserved seats cost nothing when
there is no interactive traffic; the price is one preemption of a long
generation per interactive request that arrives while the flood holds every
seat, and the preemption cap (progress guarantee) bounds how often any one long
generation pays it. Priority aging would not help here: it reorders a queue
whose head still waits for a seat. Off by default
(``long_generation_threshold=0``); ``benchmarks/fairness.py`` measures it.
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

    def _interactive_queued(self: "Scheduler") -> int:
        """Interactive (not long) requests waiting for a seat."""
        return sum(1 for r in self._queued() if r.request_id not in self._preempted_now and not self._is_long(r))

    def _long_over_share(self: "Scheduler") -> int:
        """How many seats long generations hold beyond their share (negative: below it)."""
        return sum(1 for r in self.running if self._is_long(r)) - self._long_seats()

    def _next_candidate(self: "Scheduler") -> Optional[Request]:
        """The request admission should try next, or None."""
        long_full = False
        if self.config.long_generation_threshold > 0 and self.config.scheduling == "continuous":
            long_full = self._long_over_share() >= 0 and self._interactive_queued() > 0
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

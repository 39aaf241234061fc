"""Batching policies: when a waiting request may join the running batch.

The scheduler asks its policy at a few fixed points of a step; continuous
batching (this class) answers "any time, no special rows" at every one of
them. Static batching (core/static_scheduler.py) forms fixed batches and keeps
finished members' rows as padding.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from inflight.core.request import Request, RequestStatus

FinishFn = Callable[[Request, RequestStatus], None]


class BatchingPolicy:
    """Continuous batching: a request starts whenever a seat, the token budget and
    memory allow, and leaves as soon as it finishes."""

    # swap preemption, priority and fairness preemption, the long-generation seat share
    supports_swap = True
    preempts_for_policy = True
    seat_share = True

    def bind(self, running: list[Request], kv: KVCacheManager, finish: FinishFn) -> None:
        """Give the policy the scheduler's running list, the KV manager and the
        call that finishes a request for good (a policy may keep rows past a finish)."""
        self.running, self.kv, self.finish = running, kv, finish

    def before_schedule(self, waiting: Iterable[Request]) -> None:
        """Called at the start of every ``schedule()``."""

    def admissible(self, waiting: Iterable[Request]) -> Iterable[Request]:
        """The waiting requests that may start now, in queue order."""
        return waiting

    def keeps_row(self, req: Request, status: RequestStatus) -> bool:
        """True when a finishing request keeps its place in the batch (it is finished later)."""
        return False

    def on_finished(self, req: Request) -> None:
        """Called once a request has really finished."""

    def make_room(self) -> bool:
        """Free memory for a waiting request without preempting; True if something was freed."""
        return False

    def victim(self) -> Optional[Request]:
        """A running request to preempt before the victim policy is asked, or None."""
        return None

    def drops_instead_of_preempting(self, req: Request) -> bool:
        """True when the policy ended ``req`` itself instead of it being preempted."""
        return False

    def filter_result(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Drop tokens from ``result`` that no request should get, before the update."""

    def release(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        """The outputs the engine gets after this step's update."""
        return outputs

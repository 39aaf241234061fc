"""Request-level (static) batching on the same engine, for comparison.

A batch of up to ``max_num_seqs`` waiting requests is formed only when no batch
is running, and it runs until its last member finishes. With padding on (the
default, as padded static batching does) a finished member keeps its row: it is
still computed every step (its last position is recomputed in place, so it needs
no new KV) and the tokens are thrown away. With ``static_padding=False`` its row is
dropped instead, which separates the cost of padding from the cost of waiting.
Either way every member's output is handed back only when the whole batch ends.
"""
from __future__ import annotations

from typing import Iterable, Optional

from inflight.config import SchedulerConfig
from inflight.core.batching import BatchingPolicy
from inflight.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from inflight.core.request import Request, RequestStatus


class StaticBatching(BatchingPolicy):
    """Admits only between batches; finished members keep their rows as padding.

    NOTE: it preempts by recompute only (its padding rows start once no member
    waits, and a swapped member would look started) and never for priority or
    fairness: its batches are fixed up front, and a seat share could strand a member."""

    supports_swap = False
    preempts_for_policy = False
    seat_share = False

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.batch: list[Request] = []
        self._done: dict[str, RequestStatus] = {}  # finished members still holding their row
        self._held: list[EngineCoreOutput] = []

    def before_schedule(self, waiting: Iterable[Request]) -> None:
        waiting = list(waiting)
        if not self.batch and waiting:
            # The members are fixed now; their prompts may take several steps of budget.
            order = sorted(waiting, key=lambda r: (r.priority, r.arrival_time)) \
                if self.config.scheduling_policy == "priority" else waiting
            self.batch = order[:self.config.max_num_seqs]
        # Live rows take the budget first; padding rows go last (and are the first victims).
        self.running.sort(key=lambda r: r.request_id in self._done)
        # Padding rows only once every member has started: before that they would
        # only eat the budget that the remaining prompts need.
        if not self.admissible(waiting):
            for req in self.running:
                if req.request_id in self._done:
                    req.num_computed_tokens = req.num_tokens - 1  # padding row: recompute in place

    def admissible(self, waiting: Iterable[Request]) -> list[Request]:
        return [r for r in waiting if r in self.batch]

    def keeps_row(self, req: Request, status: RequestStatus) -> bool:
        # Stopping members keep their row (padding) until the batch ends; aborts leave at once.
        # NOTE: a padding row recomputes position num_tokens - 1 in place; its slot is
        # allocated here, so padding never needs another block later. The slot is not
        # written until padding runs (a row may finish first), so its block stays out of
        # the prefix cache until then.
        if (self.config.static_padding and req in self.batch and status != RequestStatus.FINISHED_ABORTED
                and req.status == RequestStatus.RUNNING and req.request_id not in self._done
                and self.kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens, cache=False)):
            self._done[req.request_id] = status
            req.num_computed_tokens = req.num_tokens  # idle until padding starts
            return True
        return False

    def on_finished(self, req: Request) -> None:
        self._done.pop(req.request_id, None)

    def make_room(self) -> bool:
        # A member still waiting for memory beats another member's padding row.
        for req in reversed(self.running):
            status = self._done.pop(req.request_id, None)
            if status is not None:
                self.finish(req, status)
                return True
        return False

    def victim(self) -> Optional[Request]:
        padding = [r for r in self.running if r.request_id in self._done]
        return padding[-1] if padding else None

    def drops_instead_of_preempting(self, req: Request) -> bool:
        # A padding row is not worth memory: drop it (as without padding) instead of preempting.
        status = self._done.pop(req.request_id, None)
        if status is None:
            return False
        self.finish(req, status)
        return True

    def filter_result(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> None:
        for rid in [rid for rid in sched.num_scheduled_tokens if rid in self._done]:
            result.sampled_token_ids.pop(rid, None)  # padding rows' tokens are discarded
            result.logprobs.pop(rid, None)

    def release(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        self._held.extend(outputs)
        if self.batch and all(r.request_id in self._done or r.is_finished for r in self.batch):
            for r in self.batch:
                status = self._done.pop(r.request_id, None)
                if status is not None and not r.is_finished:
                    self.finish(r, status)
            self.batch = []
            released, self._held = self._held, []
            return released
        return []


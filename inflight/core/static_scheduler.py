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

from inflight.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from inflight.core.request import Request, RequestStatus
from inflight.core.scheduler import Scheduler


class StaticScheduler(Scheduler):
    """Scheduler variant that admits only between batches."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch: list[Request] = []
        self._done: dict[str, RequestStatus] = {}  # finished members still holding their row
        self._held: list[EngineCoreOutput] = []

    def schedule(self) -> SchedulerOutput:
        if not self.batch and self.waiting:
            # The members are fixed now; their prompts may take several steps of budget.
            order = sorted(self.waiting, key=self._order_key) if self.config.scheduling_policy == "priority" \
                else list(self.waiting)
            self.batch = order[:self.config.max_num_seqs]
        # Padding rows only once every member has started: before that they would
        # only eat the budget that the remaining prompts need.
        # Live rows take the budget first; padding rows go last (and are the first victims).
        self.running.sort(key=lambda r: r.request_id in self._done)
        if not self._admissible():
            for req in self.running:
                if req.request_id in self._done:
                    req.num_computed_tokens = req.num_tokens - 1  # padding row: recompute in place
        return super().schedule()

    @staticmethod
    def _order_key(r: Request):
        return (r.priority, r.arrival_time)

    def _admissible(self) -> list[Request]:
        return [r for r in self.waiting if r in self.batch]

    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        padding = [rid for rid in sched.num_scheduled_tokens if rid in self._done]
        for rid in padding:
            result.sampled_token_ids.pop(rid, None)  # padding rows' tokens are discarded
            result.logprobs.pop(rid, None)
        outputs = super().update_from_output(sched, result)
        self._held.extend(outputs)
        if self.batch and all(r.request_id in self._done or r.is_finished for r in self.batch):
            for r in self.batch:
                status = self._done.pop(r.request_id, None)
                if status is not None and not r.is_finished:
                    Scheduler._finish(self, r, status)
            self.batch = []
            released, self._held = self._held, []
            return released
        return []

    def _finish(self, req: Request, status: RequestStatus) -> None:
        # Stopping members keep their row (padding) until the batch ends; aborts leave at once.
        # NOTE: a padding row recomputes position num_tokens - 1 in place; its slot is
        # allocated here, so padding never needs another block later.
        if (self.config.static_padding and req in self.batch and status != RequestStatus.FINISHED_ABORTED
                and req.status == RequestStatus.RUNNING and req.request_id not in self._done
                and self.kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens)):
            self._done[req.request_id] = status
            req.num_computed_tokens = req.num_tokens  # idle until padding starts
            return
        super()._finish(req, status)
        self._done.pop(req.request_id, None)

    def _make_room(self) -> bool:
        # A member still waiting for memory beats another member's padding row.
        for req in reversed(self.running):
            status = self._done.pop(req.request_id, None)
            if status is not None:
                super()._finish(req, status)
                return True
        return False

    def _pick_victim(self) -> Request:
        padding = [r for r in self.running if r.request_id in self._done]
        return padding[-1] if padding else super()._pick_victim()

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        # A padding row is not worth memory: drop it (as without padding) instead of preempting.
        status = self._done.pop(req.request_id, None)
        if status is not None:
            super()._finish(req, status)
            return
        super()._preempt(req, out)

"""What the worker holds of each request, so each step sends only the difference."""
from __future__ import annotations

from inflight.core.outputs import CachedRequestData, NewRequestData, ScheduledRequest, SchedulerOutput


class WorkerView:
    """The scheduler's record of each request the worker holds (how many tokens and
    block ids it was sent); turns a step's batch into ``NewRequestData`` for the
    requests it does not hold and ``CachedRequestData`` diffs for the others."""

    def __init__(self, sliding_window: bool) -> None:
        self.sliding_window = sliding_window
        self._sent: dict[str, tuple[int, int]] = {}  # request id -> (tokens, block ids) sent

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._sent

    def emit(self, out: SchedulerOutput, batch: list[ScheduledRequest]) -> None:
        """Write ``batch`` into ``out`` as data; forget what the worker drops this step."""
        for rid in out.preempted_req_ids:
            self._sent.pop(rid, None)  # the worker drops a preempted request's state
        for rid in out.finished_req_ids:
            self._sent.pop(rid, None)
        for s in batch:
            req, rid = s.request, s.request.request_id
            sent = self._sent.get(rid)
            if sent is None:
                out.scheduled_new_reqs.append(NewRequestData.from_request(req, s.block_ids))
            else:
                num_null = 0
                if self.sliding_window:  # blocks behind the window became the null block (id 0)
                    num_null = next((i for i, b in enumerate(s.block_ids) if b != 0), len(s.block_ids))
                out.scheduled_cached_reqs.append(CachedRequestData(
                    rid, req.all_token_ids[sent[0]:], s.block_ids[sent[1]:], req.num_computed_tokens, num_null))
            self._sent[rid] = (req.num_tokens, len(s.block_ids))
            out.num_scheduled_tokens[rid] = s.num_new_tokens
            if s.spec_token_ids:
                out.scheduled_spec_decode_tokens[rid] = list(s.spec_token_ids)
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())

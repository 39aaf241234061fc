"""What the worker holds of each request, so each step sends only the difference."""
from __future__ import annotations

from typing import Sequence

from inflight.core.outputs import CachedRequestData, NewRequestData, ScheduledRequest, SchedulerOutput


class WorkerView:
    """The scheduler's record of each request the worker holds (how many tokens and
    block ids per KV cache group it was sent); turns a step's batch into
    ``NewRequestData`` for the requests it does not hold and ``CachedRequestData``
    diffs for the others.

    ``windowed``: per KV cache group, whether it has a sliding window (its leading
    blocks become the null block as the request runs)."""

    def __init__(self, windowed: Sequence[bool]) -> None:
        self.windowed = tuple(windowed)
        self._any_windowed = any(self.windowed)
        self._sent: dict[str, tuple[int, tuple[int, ...]]] = {}  # request id -> (tokens, block ids per group)

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
                num_null: tuple[int, ...] = ()
                if self._any_windowed:  # blocks behind a window became the null block (id 0)
                    num_null = tuple(next((i for i, b in enumerate(ids) if b != 0), len(ids)) if w else 0
                                     for ids, w in zip(s.block_ids, self.windowed))
                new_ids = tuple(ids[n:] for ids, n in zip(s.block_ids, sent[1]))
                out.scheduled_cached_reqs.append(CachedRequestData(
                    rid, req.all_token_ids[sent[0]:], new_ids, req.num_computed_tokens, num_null))
            self._sent[rid] = (req.num_tokens, tuple(len(ids) for ids in s.block_ids))
            out.num_scheduled_tokens[rid] = s.num_new_tokens
            if s.spec_token_ids:
                out.scheduled_spec_decode_tokens[rid] = list(s.spec_token_ids)
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())

"""The worker's own per-request state, kept across steps and updated from each
SchedulerOutput (vLLM V1's ``CachedRequestState``): a request arrives in full once
(``NewRequestData``), then as diffs (``CachedRequestData``), and leaves when it
finishes or is preempted. The model runner reads only this state, never a
scheduler ``Request``, so the worker may live in another process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from inflight.core.outputs import CachedRequestData, GroupBlockIds, NewRequestData, SchedulerOutput
from inflight.lora.request import LoRARequest
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    """Everything the worker knows of one request: its tokens (prompt, then the
    output the scheduler has sent), its KV block tables (one per KV cache group) and
    its progress."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    block_ids: GroupBlockIds
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    # prompt-logprob entries made before this state was created (before a preemption)
    num_prompt_logprobs: int = 0
    lora_request: Optional[LoRARequest] = None
    pooling_params: Optional[PoolingParams] = None  # a pooling request: pooled, never sampled

    @classmethod
    def from_new(cls, d: NewRequestData) -> "CachedRequestState":
        return cls(d.req_id, d.prompt_token_ids, d.sampling_params, d.eos_token_ids,
                   tuple(list(ids) for ids in d.block_ids),
                   d.num_computed_tokens, list(d.output_token_ids),
                   list(d.prompt_token_ids) + list(d.output_token_ids), d.num_prompt_logprobs, d.lora_request,
                   d.pooling_params)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def lora_int_id(self) -> int:
        """Its adapter's id; 0 for the base model (as ``Request.lora_int_id``)."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    def apply(self, d: CachedRequestData) -> None:
        """Apply one step's diff: tokens appended since, new blocks, progress."""
        self.output_token_ids.extend(d.new_token_ids)
        self.all_token_ids.extend(d.new_token_ids)
        for ids, new in zip(self.block_ids, d.new_block_ids):
            ids.extend(new)
        for ids, n in zip(self.block_ids, d.num_null_blocks):
            if n:
                ids[:n] = [0] * n
        self.num_computed_tokens = d.num_computed_tokens


@dataclass
class ScheduledState:
    """One request's share of this step on the worker side: ``num_new_tokens``
    tokens from ``state.num_computed_tokens``, the last ``len(spec_token_ids)`` of
    them draft tokens past the known tokens."""

    state: CachedRequestState
    num_new_tokens: int
    spec_token_ids: tuple[int, ...] = ()

    @property
    def req_id(self) -> str:
        return self.state.req_id

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a token is sampled
        (never for a pooling request: it is pooled instead)."""
        st = self.state
        return st.pooling_params is None and st.num_computed_tokens + self.num_new_tokens - len(self.spec_token_ids) == st.num_tokens


class RequestStates:
    """The worker's table of requests, updated from each SchedulerOutput."""

    def __init__(self) -> None:
        self.states: dict[str, CachedRequestState] = {}

    def __len__(self) -> int:
        return len(self.states)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.states

    def update(self, sched: SchedulerOutput) -> list[ScheduledState]:
        """Drop the finished and preempted, add the new, apply the diffs; return this
        step's batch in the scheduler's order."""
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for rid in sched.preempted_req_ids:
            self.states.pop(rid, None)
        for d in sched.scheduled_new_reqs:
            self.states[d.req_id] = CachedRequestState.from_new(d)
        for c in sched.scheduled_cached_reqs:
            self.states[c.req_id].apply(c)
        spec = sched.scheduled_spec_decode_tokens
        return [ScheduledState(self.states[rid], n, tuple(spec.get(rid, ())))
                for rid, n in sched.num_scheduled_tokens.items()]

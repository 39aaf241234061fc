"""Typed results passed between scheduler, model runner and engine."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from inflight.core.request import Request

# (token_id, logprob, rank): the sampled token first, then the top-N.
LogprobEntry = list[tuple[int, float, int]]


class ScheduledRequest(NamedTuple):
    """One request's share of a step: compute ``num_new_tokens`` tokens starting at
    ``request.num_computed_tokens``, with KV slots in ``block_ids``. With speculative
    decoding the last ``len(spec_token_ids)`` of them are draft tokens, past the
    request's known tokens."""

    request: Request
    num_new_tokens: int
    block_ids: list[int]
    spec_token_ids: tuple[int, ...] = ()

    @property
    def is_prefill(self) -> bool:
        return self.request.num_computed_tokens < self.request.num_prompt_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a token is sampled."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens - len(self.spec_token_ids) == r.num_tokens


@dataclass
class SchedulerOutput:
    """What to run this step, in batch order (running requests first)."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: list[str] = field(default_factory=list)
    # Swap preemption: (device block, host block) pairs to copy out and (host block,
    # device block) pairs to copy in. NOTE: the runner does both before the forward
    # pass, reading every source before writing any destination, and even when
    # ``scheduled`` is empty.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Requests that left since the previous step; the runner drops their state.
    finished_req_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """Sampled tokens for the requests that reached the end of their known tokens:
    one each, or with draft tokens, the accepted drafts and the model's next token."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, LogprobEntry] = field(default_factory=dict)
    # request id -> (index of the first entry, entries): the prompt logprobs this step's rows made
    prompt_logprobs: dict[str, tuple[int, list[LogprobEntry]]] = field(default_factory=dict)
    # Requests whose own sampling failed this step (no token for them); the engine
    # finishes them with an error and every other request goes on.
    failed: dict[str, Exception] = field(default_factory=dict)


@dataclass
class EngineCoreOutput:
    """One request's progress after a step, for the output processor."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    new_logprobs: Optional[list[LogprobEntry]] = None
    num_cached_tokens: int = 0
    # every prompt token's logprobs but the first's, sent once, with the first output token
    prompt_logprobs: Optional[list[LogprobEntry]] = None

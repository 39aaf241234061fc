"""A request as the scheduler sees it: tokens, progress and status."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from inflight.core.pooling import PoolingState
from inflight.lora.request import LoRARequest
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. Values above SWAPPED are finished.

    PREEMPTED: preempted by recompute, back in the waiting queue with no KV;
    SWAPPED: preempted by swap, its KV blocks held in the host pool."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    SWAPPED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_IGNORED = 7
    FINISHED_ERROR = 8  # this request alone failed on the step thread (vLLM's FinishReason.ERROR)

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.SWAPPED

    @property
    def finish_reason(self) -> Optional[str]:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class RequestTimes:
    """Wall-clock timestamps (time.time()) of a request's milestones."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    finished_time: Optional[float] = None


@dataclass(eq=False)
class Request:
    """One sequence being generated.

    NOTE: ``num_computed_tokens`` counts tokens whose KV is in the cache; the
    scheduler never keeps a separate prefill/decode phase. A request needs
    ``num_tokens - num_computed_tokens`` more tokens computed before it samples.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    cache_salt: Optional[str] = None  # separates tenants in the prefix cache (vLLM's cache_salt)
    lora_request: Optional[LoRARequest] = None  # the adapter it runs with; None: the base model
    # A pooling request (an embedding of its prompt): it computes its prompt, samples nothing
    # and finishes with the pooled vector (core/pooling.py).
    pooling_params: Optional[PoolingParams] = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens served from the prefix cache, set on first schedule
    num_preemptions: int = 0
    stop_reason: Any = None
    block_hashes: list[bytes] = field(default_factory=list)  # chained sha256 of each full block
    spec_token_ids: list[int] = field(default_factory=list)  # drafts for the next step (speculative decoding)
    # The grammar matcher of a request with structured output (structured_output.GrammarState);
    # advanced by the runner with each sampled token, dropped when the request finishes.
    structured_output: Any = None
    # With sampling_params.prompt_logprobs: entry i is [(token, logprob, rank), top-N...] of prompt token i + 1.
    prompt_logprobs: list[list[tuple[int, float, int]]] = field(default_factory=list)
    times: RequestTimes = field(init=False)
    pooling: Optional[PoolingState] = field(init=False, default=None)
    # Token ids after the prompt, including the ones generated so far.
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.times = RequestTimes(arrival_time=self.arrival_time)
        self.all_token_ids = list(self.prompt_token_ids)
        if self.pooling_params is not None:
            self.pooling = PoolingState(self.pooling_params.pooling_type or "LAST")

    @property
    def lora_int_id(self) -> int:
        """Its adapter's id; 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def max_tokens(self) -> int:
        mt = self.sampling_params.max_tokens
        return mt if mt is not None else 1 << 62

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def needs_prompt_logprobs(self) -> bool:
        """True while prompt logprobs were asked for (even 0: the token's own) and are not all computed."""
        return (self.sampling_params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    @property
    def skips_prefix_cache(self) -> bool:
        """True while a cached prefix would lose what the request needs: prompt logprobs not yet
        computed, or a pooling that reads every prompt position (a cached position has no hidden state)."""
        return self.needs_prompt_logprobs or (self.pooling_params is not None
                                              and self.pooling_params.skip_reading_prefix_cache)

    def add_prompt_logprobs(self, start: int, entries: list[list[tuple[int, float, int]]]) -> None:
        """Add a chunk's prompt-logprob entries, which begin at entry ``start``; entries
        this request already has (computed again after a preemption) are skipped."""
        have = len(self.prompt_logprobs)
        if start <= have:
            self.prompt_logprobs.extend(entries[have - start:])

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

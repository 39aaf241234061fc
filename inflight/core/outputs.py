"""Typed results passed between scheduler, model runner and engine.

NOTE: the scheduler-to-worker contract (``SchedulerOutput``) is plain data: ints,
lists, the SamplingParams and, with structured output, one bitmask
array. It pickles, so a worker in another process gets the same step as one in
this process; the worker keeps its own per-request state
(``worker/request_state.py``) and applies each step's diffs to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from inflight.core.pooling import PooledChunk
from inflight.core.request import Request
from inflight.lora.request import LoRARequest
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import SamplingParams

# (token_id, logprob, rank): the sampled token first, then the top-N.
LogprobEntry = list[tuple[int, float, int]]

# One block table per KV cache group, as vLLM's: a 1-tuple unless the stack mixes windowed
# and global layers (core/hybrid_kv.py), then one per layer group.
GroupBlockIds = tuple[list[int], ...]


class ScheduledRequest(NamedTuple):
    """The scheduler's own record of one request's share of a step (it never goes
    to the worker): compute ``num_new_tokens`` tokens starting at
    ``request.num_computed_tokens``, with KV slots in ``block_ids`` (one table per KV
    cache group). With speculative
    decoding the last ``len(spec_token_ids)`` of them are draft tokens, past the
    request's known tokens."""

    request: Request
    num_new_tokens: int
    block_ids: GroupBlockIds
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
class NewRequestData:
    """A request the worker does not hold yet, in full (vLLM V1's ``NewRequestData``):
    on its first step, and again when it resumes after a preemption (the worker
    drops a preempted request's state), then with the output it had so far."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: GroupBlockIds
    num_computed_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    # output tokens generated before a preemption (empty on the first step)
    output_token_ids: list[int] = field(default_factory=list)
    # prompt-logprob entries the request already has (made before a preemption by recompute)
    num_prompt_logprobs: int = 0
    lora_request: Optional[LoRARequest] = None
    pooling_params: Optional[PoolingParams] = None  # a pooling request: pooled, never sampled

    @classmethod
    def from_request(cls, req: Request, block_ids: GroupBlockIds) -> "NewRequestData":
        return cls(req.request_id, list(req.prompt_token_ids), req.sampling_params, tuple(map(list, block_ids)),
                   req.num_computed_tokens, tuple(req.eos_token_ids), list(req.output_token_ids),
                   len(req.prompt_logprobs), req.lora_request, req.pooling_params)


@dataclass
class CachedRequestData:
    """A request the worker already holds, as a diff (vLLM V1's ``CachedRequestData``).

    NOTE: ``new_token_ids`` are the tokens the scheduler appended since the worker
    last saw the request (the tokens sampled in the previous step, after stop
    checks). The worker never appends its own samples: with several workers, or
    tokens the scheduler drops (a stop in the middle of accepted drafts, static
    batching's padding rows), every worker's copy still equals the scheduler's.
    A resumed preempted request comes as a NewRequestData, so there is no
    ``resumed_from_preemption`` flag here."""

    req_id: str
    new_token_ids: list[int]
    new_block_ids: GroupBlockIds  # appended to each group's table
    num_computed_tokens: int
    # per group, leading blocks that fell out of a sliding window and went back to the
    # pool (block id 0, the null block, in the worker's table from now on); () if none
    num_null_blocks: tuple[int, ...] = ()


@dataclass
class SchedulerOutput:
    """What to run this step. ``num_scheduled_tokens`` is in batch order (running
    requests first); with speculative decoding a request's last
    ``len(scheduled_spec_decode_tokens[req_id])`` scheduled tokens are drafts."""

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Requests preempted in this step (recompute or swap): the worker drops their state.
    preempted_req_ids: list[str] = field(default_factory=list)
    # Swap preemption: (device block, host block) pairs to copy out and (host block,
    # device block) pairs to copy in. NOTE: the runner does both before the forward
    # pass, reading every source before writing any destination, and even when
    # nothing is scheduled.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Requests that left since the previous step; the worker drops their state.
    finished_req_ids: list[str] = field(default_factory=list)
    # Structured output: the step's grammar masks (structured_output/masks.py), set by
    # the engine after schedule(); filled on a thread and read by the runner only at
    # sampling time; pickling waits for it and sends the finished masks.
    grammar_bitmask: Optional[Any] = None

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class ModelRunnerOutput:
    """Sampled tokens for the requests that reached the end of their known tokens:
    one each, or with draft tokens, the accepted drafts and the model's next token."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, LogprobEntry] = field(default_factory=dict)
    # request id -> (index of the first entry, entries): the prompt logprobs this step's rows made
    prompt_logprobs: dict[str, tuple[int, list[LogprobEntry]]] = field(default_factory=dict)
    # pooling requests: what this step's chunk of each adds to its pooled vector
    pooled: dict[str, PooledChunk] = field(default_factory=dict)
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
    # a finished pooling request's pooled vector (before the Matryoshka cut and the activation)
    pooling_output: Any = None

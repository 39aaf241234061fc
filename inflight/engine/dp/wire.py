"""What travels between the API server and an engine replica, and how outputs are
made small for the trip.

A RequestOutput carries the whole prompt and every token generated so far; sent
as is after every step, a replica's messages would grow with prompt and output
length. The replica sends each request's prompt never (the server has it), prompt
logprobs once, and of an unfinished sample only what it added since the last
message; the server puts the cumulative output back together.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from inflight.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput
from inflight.pooling.config import PoolerConfig


@dataclass
class ReplicaInfo:
    """What a replica tells the server once its engine is built."""

    max_model_len: int
    vocab_size: int
    block_size: int
    num_blocks: int
    model_source: Optional[str]
    eos_token_ids: tuple[int, ...]
    pid: int
    pooler_config: Optional[PoolerConfig] = None  # a pooling model's (None: it generates)
    hidden_size: int = 0
    max_sequence_tokens: Optional[int] = None  # the most tokens one request can reach in its KV pool


@dataclass
class AddCommand:
    """Add a request (the server already tokenized the prompt)."""

    request_id: str
    prompt: Any
    params: Any
    arrival_time: float
    priority: int = 0
    cache_salt: Optional[str] = None
    lora_request: Any = None  # a LoRARequest


@dataclass
class AbortCommand:
    request_id: str


@dataclass
class ShutdownCommand:
    """Abort what is left and exit."""


@dataclass
class StepReport:
    """Everything one iteration of a replica's loop produced, in the order it happened:
    add results, aborts, then one step's outputs with the engine's stats after it and
    the prefix-cache blocks that came and went (so the router's view is current before
    the server learns that a request finished)."""

    added: list[tuple[str, Optional[tuple[str, str]]]] = field(default_factory=list)  # (id, (error type, message))
    aborts: list[tuple[str, list[RequestOutput]]] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    step_time: Optional[float] = None  # None: no step ran
    num_scheduled_tokens: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    cache_added: list[bytes] = field(default_factory=list)
    cache_removed: list[bytes] = field(default_factory=list)
    crash: Optional[str] = None  # the loop died: the replica exits after this message


class OutputEncoder:
    """Replica side: strips what the server already has from each output."""

    def __init__(self) -> None:
        self._sent: dict[str, dict[int, tuple[int, int, int]]] = {}  # id -> index -> tokens, logprobs, chars
        self._prompt_logprobs_sent: set[str] = set()

    def encode(self, out: RequestOutput) -> RequestOutput:
        if isinstance(out, PoolingRequestOutput):  # one message, at its end
            return replace(out, prompt_token_ids=[])
        sent = self._sent.setdefault(out.request_id, {})
        comps = []
        for c in out.outputs:
            n_tok, n_lp, n_chr = sent.get(c.index, (0, 0, 0))
            sent[c.index] = (len(c.token_ids), len(c.logprobs or ()), len(c.text))
            if c.finished:  # whole: a finished text may differ from the sum of its pieces (stop strings)
                comps.append(c)
                continue
            comps.append(replace(c, token_ids=c.token_ids[n_tok:], text=c.text[n_chr:],
                                 logprobs=None if c.logprobs is None else c.logprobs[n_lp:]))
        prompt_logprobs = out.prompt_logprobs
        if prompt_logprobs is not None:
            if out.request_id in self._prompt_logprobs_sent:
                prompt_logprobs = None
            self._prompt_logprobs_sent.add(out.request_id)
        if out.finished:
            self._sent.pop(out.request_id, None)
            self._prompt_logprobs_sent.discard(out.request_id)
        return replace(out, prompt_token_ids=[], outputs=comps, prompt_logprobs=prompt_logprobs)


@dataclass
class _Received:
    prompt_token_ids: list[int]
    prompt_logprobs: Any = None
    samples: dict[int, CompletionOutput] = field(default_factory=dict)


class OutputDecoder:
    """Server side: rebuilds full outputs from the replica's pieces."""

    def __init__(self) -> None:
        self._requests: dict[str, _Received] = {}

    def add(self, request_id: str, prompt_token_ids: list[int]) -> None:
        self._requests[request_id] = _Received(prompt_token_ids)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def decode(self, out: RequestOutput) -> RequestOutput:
        state = self._requests.get(out.request_id)
        if state is None:
            return out
        if isinstance(out, PoolingRequestOutput):
            self._requests.pop(out.request_id, None)
            return replace(out, prompt_token_ids=state.prompt_token_ids)
        if out.prompt_logprobs is not None:
            state.prompt_logprobs = out.prompt_logprobs
        comps = []
        for c in out.outputs:
            acc = state.samples.get(c.index)
            if c.finished or acc is None:
                acc = c if c.finished else replace(c, token_ids=list(c.token_ids),
                                                   logprobs=None if c.logprobs is None else list(c.logprobs))
            else:
                acc.token_ids.extend(c.token_ids)
                acc.text += c.text
                if acc.logprobs is not None and c.logprobs is not None:
                    acc.logprobs.extend(c.logprobs)
                acc.cumulative_logprob, acc.delta_text = c.cumulative_logprob, c.delta_text
                acc.delta_token_ids, acc.delta_logprobs = c.delta_token_ids, c.delta_logprobs
            state.samples[c.index] = acc
            comps.append(_snapshot(acc))
        if out.finished:
            self._requests.pop(out.request_id, None)
        return replace(out, prompt_token_ids=state.prompt_token_ids, outputs=comps,
                       prompt_logprobs=state.prompt_logprobs)


def _snapshot(c: CompletionOutput) -> CompletionOutput:
    # handed to the consumer: later messages must not change it
    return replace(c, token_ids=list(c.token_ids), logprobs=None if c.logprobs is None else list(c.logprobs))


class CacheReporter:
    """Replica side: which prefix-cache blocks appeared and vanished since the last
    report. The pool's size and eviction count change whenever its cached set does
    (every removal counts as an eviction), so an unchanged pair costs no set diff."""

    def __init__(self) -> None:
        self._known: set[bytes] = set()
        self._fingerprint: tuple[int, int] = (0, 0)

    def delta(self, pool: Any) -> tuple[list[bytes], list[bytes]]:
        fingerprint = (len(pool.cached), pool.num_evictions)
        if fingerprint == self._fingerprint:
            return [], []
        self._fingerprint = fingerprint
        current = set(pool.cached)
        added, removed = list(current - self._known), list(self._known - current)
        self._known = current
        return added, removed

"""A pooling request's embedding, gathered chunk by chunk from the worker's hidden states.

NOTE: the worker sends one ``PooledChunk`` per prefill chunk of a pooling request. The
data is opaque here (a tensor; ``core`` imports no torch): it only adds and divides. For
MEAN and CLS a chunk that starts at 0 begins again (such a request skips the prefix cache,
so after a preemption by recompute its chunks restart at 0) and any other chunk must start
where the last one ended; LAST keeps the chunk that ends the prompt (a cached prefix is fine)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


class PooledChunk(NamedTuple):
    """What one prefill chunk ``[start, start + num_tokens)`` of a pooling request adds:
    LAST, the last prompt token's hidden state (only the chunk that ends the prompt);
    MEAN, the sum of the chunk's hidden states; CLS, the first token's (chunk at 0).
    ``data`` is None where the chunk adds nothing."""

    start: int
    num_tokens: int
    data: Any


@dataclass
class PoolingState:
    """The running result of one request's chunks (``pooling_type``: LAST | MEAN | CLS)."""

    pooling_type: str
    num_pooled: int = 0  # prompt tokens the chunks so far covered
    data: Any = None

    def add(self, chunk: PooledChunk) -> None:
        if self.pooling_type == "LAST":
            self.num_pooled = chunk.start + chunk.num_tokens
            if chunk.data is not None:
                self.data = chunk.data
            return
        if chunk.start == 0:
            self.num_pooled, self.data = 0, None
        if chunk.start != self.num_pooled:
            raise RuntimeError(f"pooled chunk at {chunk.start} after {self.num_pooled} pooled tokens")
        self.num_pooled += chunk.num_tokens
        if chunk.data is None:
            return
        if self.data is not None and self.pooling_type == "MEAN":
            self.data = self.data + chunk.data
        else:
            self.data = chunk.data

    def result(self, num_prompt_tokens: int) -> Optional[Any]:
        """The pooled vector once every prompt token was pooled; None before."""
        if self.num_pooled < num_prompt_tokens or self.data is None:
            return None
        return self.data / num_prompt_tokens if self.pooling_type == "MEAN" else self.data


def step_result(req: Any, pooled: dict[str, PooledChunk], failed: dict[str, Exception]) -> Optional[Any]:
    """Add the step's chunk of pooling request ``req``; its pooled vector once its prompt is
    computed, else None. A failure is the request's alone: it lands in ``failed``."""
    try:
        if req.request_id in pooled:
            req.pooling.add(pooled[req.request_id])
        if req.num_computed_tokens < req.num_prompt_tokens:
            return None
        data = req.pooling.result(req.num_prompt_tokens)
        if data is None:  # NOTE: cannot happen while the worker pools every chunk it runs
            raise RuntimeError("the prompt was computed but nothing was pooled")
        return data
    except Exception as e:
        failed[req.request_id] = e
        return None

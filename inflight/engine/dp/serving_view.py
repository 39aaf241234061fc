"""What the server reads from a data-parallel engine besides requests."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ServingView:
    """What the server reads from "the engine" besides requests: the tokenizer and
    model limits (loaded here once, not asked of a replica), and a grammar compiler
    that validates structured-output requests before they are routed."""

    tokenizer: Any
    max_model_len: int
    model_source: Optional[str]
    arch: Any
    eos_token_ids: tuple[int, ...]
    default_sampling_params: dict = field(default_factory=dict)  # the generation config the replicas read
    max_logprobs: int = 20  # the replicas' max_logprobs
    pooler_config: Any = None  # a pooling model's PoolerConfig (the replicas serve embeddings)
    max_sequence_tokens: Optional[int] = None  # the least over the replicas' KV pools

    def __post_init__(self) -> None:
        from inflight.structured_output.manager import StructuredOutputManager

        self.structured_output = StructuredOutputManager(self.tokenizer, self.arch.vocab_size, self.eos_token_ids)

"""What users get back: RequestOutput with one CompletionOutput per sample."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union


@dataclass
class Logprob:
    """Log-probability of one token under the model's raw distribution, and its rank there."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One dict per generated token: token id -> Logprob (the sampled token and the top-N).
SampleLogprobs = list[dict[int, Logprob]]
# One per prompt token: None for the first (nothing predicts it), then the token and the top-N.
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class RequestMetrics:
    """Wall-clock milestones of a request (time.time() seconds)."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_preemptions: int = 0

    @property
    def time_in_queue(self) -> Optional[float]:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> Optional[float]:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One generated sequence. ``text``/``token_ids`` are cumulative; the
    ``delta_*`` fields hold only what this step added (for streaming)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: Optional[SampleLogprobs] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (or at its end, offline)."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: int = 0
    # Set when the request failed on its own (finish_reason "error"): what went wrong,
    # and whether its input caused it (a client error) rather than the server.
    error: Optional[str] = None
    error_is_bad_input: bool = False
    # With SamplingParams.prompt_logprobs: set once the prompt is computed (vLLM's field)
    prompt_logprobs: Optional[PromptLogprobs] = None


@dataclass
class PoolingOutput:
    """A pooling request's result: ``data``, a float32 tensor (vLLM's ``PoolingOutput``)."""

    data: Any


@dataclass
class PoolingRequestOutput:
    """The output of one pooling request (vLLM's ``PoolingRequestOutput``); ``outputs`` is
    None until it finishes, and for a request that was aborted or failed."""

    request_id: str
    outputs: Optional[PoolingOutput]
    prompt_token_ids: list[int]
    finished: bool
    num_cached_tokens: int = 0
    prompt: Optional[str] = None
    metrics: Optional[RequestMetrics] = None
    error: Optional[str] = None
    error_is_bad_input: bool = False

    def values(self) -> list[float]:
        """The pooled result as floats; ValueError for a request that has none (aborted or failed)."""
        if self.outputs is None:
            raise ValueError(f"request {self.request_id} has no result: {self.error or 'it did not finish'}")
        return self.outputs.data.tolist()


@dataclass
class EmbeddingOutput:
    """An embedding as a list of floats (vLLM's ``EmbeddingOutput``)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class _TaskRequestOutput:
    """A ``PoolingRequestOutput`` with its data as the task's output type (``_output``)."""

    request_id: str
    outputs: Any
    prompt_token_ids: list[int]
    finished: bool
    num_cached_tokens: int = 0
    _output: ClassVar[type]

    @classmethod
    def from_base(cls, out: PoolingRequestOutput):
        return cls(out.request_id, cls._output(out.values()), out.prompt_token_ids, out.finished,
                   out.num_cached_tokens)


@dataclass
class EmbeddingRequestOutput(_TaskRequestOutput):
    """``LLM.embed``'s result per prompt (vLLM's ``EmbeddingRequestOutput``): ``outputs`` an
    ``EmbeddingOutput``."""

    _output = EmbeddingOutput


@dataclass
class ScoringOutput:
    """A pair's score (vLLM's ``ScoringOutput``)."""

    score: float


@dataclass
class ScoringRequestOutput:
    """``LLM.score``'s result per pair (vLLM's ``ScoringRequestOutput``)."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ClassificationOutput:
    """A classifier's probabilities per label (vLLM's ``ClassificationOutput``)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput(_TaskRequestOutput):
    """``LLM.classify``'s result per prompt (vLLM's ``ClassificationRequestOutput``): ``outputs``
    a ``ClassificationOutput``."""

    _output = ClassificationOutput

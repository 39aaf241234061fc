"""Response bodies of the OpenAI-compatible API (pydantic), shaped as OpenAI's."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, model_serializer


def random_id(prefix: str) -> str:
    """OpenAI-style object id, e.g. ``cmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"

# vLLM's fields a request opts into (return_token_ids, a reasoning parser): left out of the JSON
# when unset, so every other answer keeps OpenAI's shape and streams no extra bytes per chunk.
OptIn = Field(default=None, exclude_if=lambda value: value is None)


class PromptTokensDetails(BaseModel):
    """How many prompt tokens were served from the prefix cache."""

    cached_tokens: int = 0


class UsageInfo(BaseModel):
    """Token counts of a response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


# ---------------------------------------------------------------- completions
class CompletionLogProbs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class PromptTokenLogprob(BaseModel):
    """One token's entry in vLLM's ``prompt_logprobs`` (keyed by token id)."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# vLLM's shape: one per prompt token, None for the first, else token id -> its logprob
PromptLogprobsField = Optional[list[Optional[dict[int, PromptTokenLogprob]]]]


class CompletionChoice(BaseModel):
    """One generated text (index = prompt_index * n + sample_index)."""

    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    # vLLM's return_token_ids: the prompt's ids (streamed: in a choice's first chunk) and the generated ids
    prompt_token_ids: Optional[list[int]] = OptIn
    token_ids: Optional[list[int]] = OptIn


class CompletionResponseChoice(CompletionChoice):
    """A choice of a non-streaming answer: with vLLM's ``prompt_logprobs`` when asked."""

    prompt_logprobs: PromptLogprobsField = None


class CompletionResponse(BaseModel):
    """Non-streaming ``/v1/completions`` answer."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: Optional[UsageInfo] = None


class CompletionStreamResponse(CompletionResponse):
    """One SSE chunk of a streaming completion (same object name as OpenAI's)."""

    choices: list[CompletionChoice]


# ----------------------------------------------------------------------- chat
class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    """The sampled token's logprob and the most likely alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: Optional[list[TokenLogprob]] = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(BaseModel):
    """A call the model made (``message.tool_calls``)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # a thinking model's reasoning (--reasoning-parser): vLLM's name, and the older one clients still read
    reasoning: Optional[str] = OptIn
    reasoning_content: Optional[str] = OptIn


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    token_ids: Optional[list[int]] = OptIn  # vLLM's return_token_ids


class ChatCompletionResponse(BaseModel):
    """Non-streaming ``/v1/chat/completions`` answer."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Optional[UsageInfo] = None
    prompt_logprobs: PromptLogprobsField = None  # vLLM's extension, when asked
    prompt_token_ids: Optional[list[int]] = OptIn  # vLLM's return_token_ids


class _NoNulls(BaseModel):
    """Unset fields are left out of the JSON, as OpenAI leaves them out of stream chunks."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(_NoNulls):
    name: Optional[str] = None
    arguments: Optional[str] = None


class DeltaToolCall(_NoNulls):
    """A piece of a streamed tool call: id, type and name first, then argument fragments."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[DeltaFunctionCall] = None


class DeltaMessage(BaseModel):
    """What a chunk adds to a message; unset fields are left out, as OpenAI does."""

    role: Optional[str] = None
    content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None
    reasoning: Optional[str] = None
    reasoning_content: Optional[str] = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    token_ids: Optional[list[int]] = OptIn  # vLLM's return_token_ids: this chunk's


class ChatCompletionChunk(BaseModel):
    """One SSE chunk of a streaming chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None
    prompt_token_ids: Optional[list[int]] = OptIn  # vLLM's return_token_ids: in the first chunk


# ---------------------------------------------------------- models, tokenizer
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "inflight"
    root: Optional[str] = None
    parent: Optional[str] = None  # a LoRA adapter's base model
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(BaseModel):
    prompt: str


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict of a response (None fields kept: OpenAI clients expect them)."""
    return model.model_dump(mode="json")

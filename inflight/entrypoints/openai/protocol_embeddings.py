"""``POST /v1/embeddings`` (OpenAI's request, plus vLLM's extensions): bodies and answers."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, model_validator

from inflight.entrypoints.openai.protocol import ChatMessage, Int64, OpenAIBaseModel
from inflight.entrypoints.openai.responses import UsageInfo
from inflight.entrypoints.openai.validation import SafeStr, check_template_kwargs

# OpenAI's own limit on the inputs of one embeddings request
MAX_EMBEDDING_INPUTS = 2048

EmbeddingInput = Union[SafeStr, list[SafeStr], list[int], list[list[int]]]


class EmbeddingRequest(OpenAIBaseModel):
    """Texts or token-id lists in ``input``, or one conversation in ``messages`` (vLLM's
    chat form, rendered with the chat template)."""

    model: Optional[SafeStr] = None
    input: Optional[EmbeddingInput] = None
    messages: Optional[list[ChatMessage]] = Field(default=None, min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[Int64] = None
    user: Optional[SafeStr] = None
    # vLLM's extensions
    use_activation: Optional[bool] = None  # L2-normalize (None: the model's pooler config)
    truncate_prompt_tokens: Optional[Int64] = Field(default=None, ge=-1)
    # vLLM's: "right" keeps the first truncate_prompt_tokens ([CLS] and a pair's query: the default
    # here), "left" the last
    truncation_side: Optional[Literal["left", "right"]] = None
    add_special_tokens: Optional[bool] = None  # default: true for input, false for messages (the template's own)
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # of base64 answers
    endianness: Literal["native", "big", "little"] = "native"
    priority: Int64 = 0
    cache_salt: Optional[SafeStr] = Field(default=None, min_length=1, max_length=1024)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "normalize" in data:
            raise ValueError("Parameter `normalize` was removed; use `use_activation` instead.")
        return data

    @model_validator(mode="after")
    def _check(self) -> "EmbeddingRequest":
        if (self.input is None) == (self.messages is None):
            raise ValueError("input: give either input or messages")
        if self.input is not None:
            check_inputs(self.input)
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message: cannot be set together with add_generation_prompt")
        check_template_kwargs(self.chat_template_kwargs)
        return self

    def inputs(self) -> list[Union[str, list[int]]]:
        """The batch: each a text or a token-id list (empty for the chat form)."""
        return inputs_of(self.input) if self.input is not None else []


def check_inputs(p: EmbeddingInput) -> None:
    """No empty input, text or token list; at most MAX_EMBEDDING_INPUTS inputs."""
    if p == "" or (isinstance(p, list) and (not p or any(isinstance(x, (list, str)) and not x for x in p))):
        raise ValueError("input: must not be empty (nor hold an empty string or token list)")
    if isinstance(p, list) and p and not isinstance(p[0], int) and len(p) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"input: at most {MAX_EMBEDDING_INPUTS} inputs per request, got {len(p)}")


def inputs_of(p: EmbeddingInput) -> list[Union[str, list[int]]]:
    """The batch an ``input`` field holds: each a text or a token-id list."""
    if isinstance(p, str):
        return [p]
    return [list(p)] if p and isinstance(p[0], int) else list(p)


class EmbeddingResponseData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: Union[list[float], str]


class EmbeddingResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingResponseData]
    usage: UsageInfo

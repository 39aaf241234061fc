"""Request bodies of the OpenAI-compatible API (pydantic), and their mapping to SamplingParams.

Field names, defaults and ranges follow OpenAI's API, plus vLLM's sampling
extensions (top_k, min_p, repetition_penalty, ignore_eos, ...). Unknown fields
are accepted and ignored, as OpenAI and vLLM do, so newer clients keep working,
except those that would change the output (validation.check_unsupported).
Floats must be finite and integers within int64.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inflight.entrypoints.openai.limits import MAX_DETOKENIZE_TOKENS, MAX_TOKENIZE_CHARS, clip
from inflight.entrypoints.openai.structured_protocol import StructuredOutputFields
from inflight.entrypoints.openai.tool_protocol import (MAX_TOOLS, ChatCompletionToolsParam, ToolCallParam,
                                                       ToolRequestFields, check_tool_message)
from inflight.entrypoints.openai.validation import (ROLES, SafeStr, check_continuation, check_message,
                                                    check_prompt_count, check_template_kwargs, check_unsupported,
                                                    logit_bias_of)
from inflight.sampling_params import INT64_MAX, INT64_MIN, SamplingParams


class OpenAIBaseModel(BaseModel):
    """Base of every request/response model: extra fields are kept, not rejected."""

    # NaN compares false against every bound: refuse it (and infinities) at parse time.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


class StreamOptions(OpenAIBaseModel):
    """``stream_options``: ask for a final usage chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingRequest(OpenAIBaseModel, StructuredOutputFields):
    """Fields shared by completions and chat completions."""

    model: Optional[SafeStr] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[Int64] = None
    min_p: Optional[float] = None
    n: int = Field(default=1, ge=1, le=INT64_MAX)
    seed: Optional[Int64] = None
    stop: Optional[Union[SafeStr, list[SafeStr]]] = None
    stop_token_ids: Optional[list[Int64]] = None
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    priority: Int64 = 0
    user: Optional[SafeStr] = None  # accepted, ignored
    # vLLM's cache_salt: only requests with the same salt share prefix-cache blocks (and see cached_tokens)
    cache_salt: Optional[Annotated[SafeStr, Field(min_length=1, max_length=1024)]] = None
    logit_bias: Optional[dict[str, float]] = None  # token id (as a string) -> bias in [-100, 100]
    allowed_token_ids: Optional[list[Int64]] = None  # vLLM's: only these token ids may be sampled
    bad_words: Optional[list[SafeStr]] = None  # vLLM's: words never generated
    return_token_ids: bool = False  # vLLM's: the prompt's and the output's token ids in the answer
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:N"
    # vLLM's: keep only N of the prompt's tokens (-1: max_model_len), the last N unless
    # truncation_side is "right" (then the first N)
    truncate_prompt_tokens: Optional[Int64] = Field(default=None, ge=-1)
    truncation_side: Optional[Literal["left", "right"]] = None
    # vLLM's: {"do_remote_decode": true} asks a prefill instance to keep the KV for a decode
    # instance; the answer's kv_transfer_params, sent to a decode instance, say where to pull it
    kv_transfer_params: Optional[dict[str, Any]] = None
    # vLLM's beam search: n is the beam width; a finished beam scores cum_logprob / len ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0

    @model_validator(mode="after")
    def _check_stream_options(self) -> "SamplingRequest":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be set when stream is true")
        check_unsupported(self)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: every chunk carries the counts so far."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int],
                        prompt_logprobs: Optional[int] = None,
                        defaults: Optional[dict[str, Any]] = None) -> SamplingParams:
        """The engine's SamplingParams; raises ValueError (-> 400) on out-of-range values.
        ``defaults`` (the model's generation config) fill the fields the request leaves
        unset, and cap max_tokens, as vLLM does."""
        d = defaults or {}

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        if d.get("max_tokens") is not None:
            max_tokens = d["max_tokens"] if max_tokens is None else min(max_tokens, d["max_tokens"])

        return SamplingParams(
            n=self.n, temperature=pick(self.temperature, d.get("temperature", 1.0)),
            top_p=pick(self.top_p, d.get("top_p", 1.0)), top_k=pick(self.top_k, d.get("top_k", 0)),
            min_p=pick(self.min_p, d.get("min_p", 0.0)), seed=self.seed,
            presence_penalty=pick(self.presence_penalty, 0.0),
            frequency_penalty=pick(self.frequency_penalty, 0.0),
            repetition_penalty=pick(self.repetition_penalty, d.get("repetition_penalty", 1.0)),
            max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured_outputs_params(),
            logit_bias=logit_bias_of(self.logit_bias), prompt_logprobs=prompt_logprobs,
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            extra_args={"kv_transfer_params": self.kv_transfer_params} if self.kv_transfer_params else None,
        )


PromptInput = Union[SafeStr, list[SafeStr], list[int], list[list[int]]]


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``."""

    prompt: PromptInput
    max_tokens: Optional[Int64] = 16
    logprobs: Optional[Int64] = Field(default=None, ge=0)  # at most --max-logprobs
    echo: bool = False
    prompt_logprobs: Optional[Int64] = None  # vLLM's extension: top-N per prompt token (not streamed)
    add_special_tokens: bool = True  # vLLM's: the tokenizer's own (a BOS token, for models that have one)

    @model_validator(mode="after")
    def _check_prompt(self) -> "CompletionRequest":
        p = self.prompt
        if isinstance(p, list) and (not p or any(isinstance(x, list) and not x for x in p)):
            raise ValueError("prompt must not be empty")
        if isinstance(p, list) and p and not isinstance(p[0], int):
            check_prompt_count(len(p))
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs: not available when stream is true (use echo with logprobs)")
        return self

    def prompts(self) -> list[Union[str, list[int]]]:
        """The batch of prompts: each a string or a token-id list."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens=0``: the prompt (and its logprobs) back, nothing generated."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self, defaults: Optional[dict[str, Any]] = None) -> SamplingParams:
        # As vLLM: echo with logprobs reports the prompt's; max_tokens=0 runs one token, never shown.
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo:
            prompt_logprobs = self.logprobs
        return self.sampling_params(1 if self.echo_only else self.max_tokens, self.logprobs, prompt_logprobs,
                                    defaults)


class ContentPart(OpenAIBaseModel):
    """One part of a multi-part message; only text parts are understood."""

    type: SafeStr
    text: Optional[SafeStr] = None


class ChatMessage(OpenAIBaseModel):
    """A conversation turn."""

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Optional[Union[SafeStr, list[ContentPart]]] = None
    name: Optional[SafeStr] = Field(default=None, max_length=256)
    tool_calls: Optional[list[ToolCallParam]] = None  # an assistant turn's calls, sent back
    tool_call_id: Optional[SafeStr] = None  # the call a tool turn answers

    @model_validator(mode="after")
    def _check_content(self) -> "ChatMessage":
        check_message(self.role, self.content)
        check_tool_message(self.role, self.tool_calls, self.tool_call_id)
        if isinstance(self.content, list):
            kinds = {part.type for part in self.content} - {"text"}
            if kinds:
                raise ValueError(f"unsupported message content part type(s): {clip(sorted(kinds)[:4], 100)}; "
                                 f"only text is supported")
        return self

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined into one string."""
        content = self.content
        if isinstance(content, list):  # only text parts: checked at parse time
            content = "".join(part.text or "" for part in content)
        # Templates know system, rarely developer: OpenAI treats the two alike.
        role = "system" if self.role == "developer" else self.role
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        if self.name:
            msg["name"] = self.name
        if self.tool_calls:
            msg["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


class ChatCompletionRequest(SamplingRequest, ToolRequestFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[Int64] = None
    max_tokens: Optional[Int64] = None  # deprecated by OpenAI, still sent by many clients
    logprobs: bool = False
    top_logprobs: Optional[Int64] = Field(default=None, ge=0)  # at most --max-logprobs
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # vLLM's: the model continues the last message (a prefilled answer)
    include_reasoning: bool = True  # vLLM's: with --reasoning-parser, the thinking in message.reasoning
    echo: bool = False  # vLLM's: the answer starts with the last message when it has the answer's role
    chat_template_kwargs: Optional[dict[str, Any]] = None
    prompt_logprobs: Optional[Int64] = None  # vLLM's extension: top-N per prompt token (not streamed)

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs: not available when stream is true")
        check_continuation(self.add_generation_prompt, self.continue_final_message)
        check_template_kwargs(self.chat_template_kwargs)
        return self

    def answer_role(self, response_role: str = "assistant") -> str:
        """The answer's role, as vLLM's: --response-role after a generation prompt, else the last message's."""
        return response_role if self.add_generation_prompt else self.messages[-1].role

    def echo_text(self, response_role: str = "assistant") -> str:
        """What ``echo`` puts before the generated text: the last message's text, when its
        role is the answer's."""
        last = self.messages[-1]
        if not self.echo or last.role != self.answer_role(response_role):
            return ""
        return last.template_dict()["content"]

    def to_sampling_params(self, defaults: Optional[dict[str, Any]] = None) -> SamplingParams:
        return self.sampling_params(self.requested_max_tokens, (self.top_logprobs or 0) if self.logprobs else None,
                                    self.prompt_logprobs, defaults)

    @property
    def requested_max_tokens(self) -> Optional[int]:
        """max_completion_tokens, or the older max_tokens; None: the rest of the context."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(OpenAIBaseModel):
    """``POST /tokenize``: a prompt, or a chat conversation rendered as chat completions
    render it (its tools and template arguments included, so the counts agree)."""

    model: Optional[SafeStr] = None
    prompt: Optional[SafeStr] = Field(default=None, max_length=MAX_TOKENIZE_CHARS)
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: Optional[list[ChatCompletionToolsParam]] = Field(default=None, max_length=MAX_TOOLS)
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        check_continuation(self.add_generation_prompt, self.continue_final_message)
        check_template_kwargs(self.chat_template_kwargs)
        return self

    @property
    def tool_choice(self) -> None:
        """As a chat request without one: "auto" where tools are given (they are rendered)."""
        return None


class DetokenizeRequest(OpenAIBaseModel):
    """``POST /detokenize``."""

    model: Optional[SafeStr] = None
    tokens: list[Int64] = Field(max_length=MAX_DETOKENIZE_TOKENS)


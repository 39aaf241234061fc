"""The request body of ``POST /v1/responses`` (stateless), and its mapping to a chat request.

The Responses API is served by the chat machinery: ``instructions`` and ``input``
become chat messages, function tools become chat tools, ``text.format``
becomes ``response_format``; everything else is the chat path's.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inflight.entrypoints.openai.errors import error_path
from inflight.entrypoints.openai.protocol import ChatCompletionRequest, Int64
from inflight.entrypoints.openai.tool_protocol import FUNCTION_NAME_PATTERN, MAX_TOOLS
from inflight.entrypoints.openai.validation import SafeStr
from inflight.errors import InvalidRequestError

# Fields of the Responses API this stateless server cannot honour: 400, never ignored.
_UNSUPPORTED = {"previous_response_id": "stored responses", "conversation": "stored conversations",
                "prompt": "stored prompts", "background": "background responses",
                "top_logprobs": "logprobs on /v1/responses"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class FunctionTool(_Model):
    """A function tool in the Responses shape (flat: no ``function`` wrapper)."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: Optional[SafeStr] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class NamedFunctionChoice(_Model):
    type: Literal["function"]
    name: SafeStr


class TextFormat(_Model):
    """``text.format``: plain text, JSON, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Optional[SafeStr] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    description: Optional[SafeStr] = None
    strict: Optional[bool] = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("schema is required when the type is json_schema")
        return self


class TextConfig(_Model):
    format: Optional[TextFormat] = None


class ReasoningConfig(_Model):
    """``reasoning``: the effort goes to the chat template as ``reasoning_effort`` (templates
    without it ignore it); summaries are not produced."""

    effort: Optional[Literal["minimal", "low", "medium", "high"]] = None
    summary: Optional[str] = None


class ResponsesRequest(_Model):
    """``POST /v1/responses``."""

    model: Optional[SafeStr] = None
    input: Union[SafeStr, list[dict[str, Any]]]
    instructions: Optional[SafeStr] = None
    max_output_tokens: Optional[Int64] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[Int64] = None
    seed: Optional[Int64] = None
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedFunctionChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    store: Optional[bool] = None
    metadata: Optional[dict[str, SafeStr]] = None
    user: Optional[SafeStr] = None
    priority: Int64 = 0

    @model_validator(mode="after")
    def _check_stateless(self) -> "ResponsesRequest":
        if self.store:
            raise ValueError("store: not supported: this server keeps no responses (send store=false)")
        extra = self.model_extra or {}
        for name, what in _UNSUPPORTED.items():
            if extra.get(name) not in (None, False, [], {}):
                raise ValueError(f"{name}: not supported: this server has no {what}")
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input: must not be empty")
        return self

    def function_tools(self) -> list[FunctionTool]:
        """``tools``, each checked to be a function tool."""
        out = []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                raise InvalidRequestError(f"tools[{i}].type: only function tools are supported, "
                                          f"got {str(tool.get('type'))[:50]!r}")
            try:
                out.append(FunctionTool.model_validate(tool))
            except ValueError as e:
                raise InvalidRequestError(f"tools[{i}]: {_first_error(e)}") from None
        return out

    def to_chat_request(self) -> ChatCompletionRequest:
        """The equivalent chat completion request; raises InvalidRequestError naming the field."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(), "stream": False,
                                "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                                "priority": self.priority, "parallel_tool_calls": self.parallel_tool_calls}
        tools = self.function_tools()
        if tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in tools]
        if isinstance(self.tool_choice, NamedFunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.reasoning is not None and self.reasoning.effort is not None:
            body["chat_template_kwargs"] = {"reasoning_effort": self.reasoning.effort}
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValueError as e:
            raise InvalidRequestError(_first_error(e).replace("messages.", "input.", 1)) from None

    def messages(self) -> list[dict[str, Any]]:
        """``instructions`` and ``input`` as chat messages."""
        out = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            _add_item(out, item, i)
        return out


def _add_item(out: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") not in _TEXT_PARTS for p in content):
                raise InvalidRequestError(f"input[{i}].content: only text parts are supported")
            content = "".join(str(p.get("text", "")) for p in content)
        out.append({"role": item.get("role"), "content": content})
    elif kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
        if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
            out[-1]["tool_calls"].append(call)  # the calls of one turn are one assistant message
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
    elif kind == "reasoning":
        pass  # an earlier answer's thinking, sent back: thinking models' templates leave it out
    else:
        raise InvalidRequestError(f"input[{i}].type: {str(kind)[:50]!r} is not supported "
                                  f"(message, function_call, function_call_output, reasoning)")


def _first_error(e: ValueError) -> str:
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return str(e)
    first = errors()[0]
    loc = error_path(first)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg

"""Request bodies for tool calling on chat completions (pydantic), shaped as OpenAI's."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from inflight.entrypoints.openai.validation import SafeStr

# OpenAI's rule for function names; also keeps names out of template syntax.
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128  # OpenAI's limit per request


class _Model(BaseModel):
    # As OpenAIBaseModel: unknown fields kept, NaN and infinities refused.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class FunctionDefinition(_Model):
    """A function the model may call: its name, description and JSON Schema of its arguments."""

    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: Optional[SafeStr] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ChatCompletionToolsParam(_Model):
    """One entry of ``tools``: only function tools exist in chat completions."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(_Model):
    name: SafeStr


class ChatCompletionNamedToolChoiceParam(_Model):
    """``tool_choice`` naming the function that must be called."""

    type: Literal["function"] = "function"
    function: ChatCompletionNamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], ChatCompletionNamedToolChoiceParam]


class FunctionCallParam(_Model):
    """A call an assistant turn made, as the client sends it back."""

    name: SafeStr
    arguments: SafeStr = "{}"


class ToolCallParam(_Model):
    """One entry of an assistant message's ``tool_calls``."""

    id: SafeStr
    type: Literal["function"] = "function"
    function: FunctionCallParam

    def template_dict(self) -> dict[str, Any]:
        """The call as chat templates read it: arguments as an object (transformers'
        convention; templates ``tojson`` them), kept as text if they are not one."""
        try:
            arguments: Any = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        if not isinstance(arguments, dict):
            arguments = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": arguments}}


class ToolRequestFields(_Model):
    """The tool fields of a chat completion request (mixed into ChatCompletionRequest)."""

    tools: Optional[list[ChatCompletionToolsParam]] = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None


def check_tool_message(role: str, tool_calls: Optional[list[ToolCallParam]], tool_call_id: Optional[str]) -> None:
    """Only assistant turns carry tool_calls; a tool turn names the call it answers."""
    if tool_calls and role != "assistant":
        raise ValueError(f"tool_calls: only assistant messages carry tool calls, not {role} messages")
    if role == "tool" and not tool_call_id:
        raise ValueError("tool_call_id: a tool message needs the id of the call it answers")

"""Tool calling on chat completions: what ``tools`` and ``tool_choice`` change.

- the prompt: the tools go to the chat template (tool_render.py);
- the sampling: ``"required"`` and a named function are enforced by structured
  output, as vLLM does: the output is constrained by a JSON schema to a bare JSON
  array of ``{"name", "arguments"}`` objects (required) or to the named
  function's arguments object. A JSON schema is the one constraint every
  grammar backend compiles, and the output needs no tags the model might not
  use; the tool's own schema shapes the arguments;
- the output: parsed into ``tool_calls`` (``--tool-call-parser``: hermes by
  default, llama3_json, mistral, pythonic) for ``"auto"``; ``"none"`` parses
  nothing. As in vLLM, ``"none"`` still shows the tools to the model unless
  ``--exclude-tools-when-tool-choice-none``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from inflight.entrypoints.openai.responses import (DeltaFunctionCall, DeltaMessage, DeltaToolCall, FunctionCall,
                                                   ToolCall)
from inflight.entrypoints.openai.tool_parsers import (DEFAULT_TOOL_PARSER, ExtractedToolCalls,
                                                      NamedToolCallStream, ParsedDelta, RequiredToolCallStream,
                                                      ToolCallStream, ToolParser, ToolParserManager, collect)
from inflight.errors import InvalidRequestError
from inflight.sampling_params import SamplingParams


@dataclass
class ToolPlan:
    """How one request uses tools: ``mode`` is none, auto, required or named."""

    mode: str = "none"
    tools: list[dict[str, Any]] = field(default_factory=list)  # what the template is given
    function: Optional[str] = None  # the named function
    parser_name: str = DEFAULT_TOOL_PARSER
    parallel_tool_calls: bool = True  # False: at most one call

    def parser(self) -> ToolParser:
        """The ``--tool-call-parser`` that reads calls in ``auto`` mode."""
        return ToolParserManager.get_tool_parser(self.parser_name)(tools=self.tools)

    def stream(self) -> Optional[ToolCallStream]:
        """A fresh parsing state for one choice (None: the output is plain content)."""
        if self.mode == "auto":
            s = self.parser().stream()
            return s if self.parallel_tool_calls else FirstCallOnly(s)
        if self.mode == "required":
            return RequiredToolCallStream()
        if self.mode == "named":
            return NamedToolCallStream(self.function or "")
        return None

    def extract(self, text: str) -> Optional[ExtractedToolCalls]:
        """The calls in a complete output, parsed exactly as a stream would parse it."""
        s = self.stream()
        return None if s is None else collect([s.feed(text), s.finish()])

    def schema(self) -> Optional[dict[str, Any]]:
        """The JSON schema structured output enforces (required and named only)."""
        params = {t["function"]["name"]: _arguments_schema(t["function"]) for t in self.tools}
        if self.mode == "named":
            return params[self.function]
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "arguments": schema},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for name, schema in params.items()]
        schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel_tool_calls:
            schema["maxItems"] = 1
        return schema


class FirstCallOnly(ToolCallStream):
    """``parallel_tool_calls: false``: calls after the first are dropped (their text is no content either)."""

    def __init__(self, inner: ToolCallStream) -> None:
        self.inner = inner

    @property
    def tools_called(self) -> bool:
        return self.inner.tools_called

    def _first(self, parsed: ParsedDelta) -> ParsedDelta:
        out = ParsedDelta()
        for part in parsed.parts:
            if isinstance(part, str):
                out.add_text(part)
            elif part.index == 0:
                out.add_call(part)
        return out

    def feed(self, text: str) -> ParsedDelta:
        return self._first(self.inner.feed(text))

    def finish(self) -> ParsedDelta:
        return self._first(self.inner.finish())


def _arguments_schema(function: dict[str, Any]) -> dict[str, Any]:
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")  # arguments are always an object
    return schema


def finish_reason(called: bool, reason: Optional[str]) -> Optional[str]:
    """``tool_calls`` when the model ended its turn with calls (a cut-off turn keeps ``length``)."""
    return "tool_calls" if called and reason == "stop" else reason


def plan_tools(req: Any, limits: Any, renderer: Any = None) -> ToolPlan:
    """Check ``tools`` and ``tool_choice`` together (``limits``: the server's
    ``tool_call_parser`` and ``exclude_tools_when_tool_choice_none``); raises
    InvalidRequestError naming the field."""
    tools = [t.model_dump(exclude_none=True) for t in (req.tools or [])]
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice != "none" and not tools:
        raise InvalidRequestError("tool_choice: needs tools; none were given")
    names = [t["function"]["name"] for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InvalidRequestError(f"tools: function names must be unique; {dup!r} appears more than once")
    if renderer is not None and tools and renderer.has_special_text(str(tools)):
        raise InvalidRequestError("tools: special-token text is not allowed in tool definitions")
    plan = ToolPlan(tools=tools, parser_name=limits.tool_call_parser,
                    parallel_tool_calls=getattr(req, "parallel_tool_calls", None) is not False)
    if isinstance(choice, str):
        plan.mode = choice
    else:
        plan.mode, plan.function = "named", choice.function.name
        if plan.function not in names:
            raise InvalidRequestError(f"tool_choice: no function named {plan.function!r} in tools "
                                      f"(known: {', '.join(names)})"[:300])
    if plan.mode == "none" and limits.exclude_tools_when_tool_choice_none:
        plan.tools = []
    return plan


def constrain(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    """The sampling params with the structured output that makes ``required`` and named choices
    hold, or as the parser of an ``auto`` choice needs them (e.g. special tokens kept)."""
    if plan.mode == "auto":
        return plan.parser().adjust_request(params)
    schema = plan.schema()
    if schema is None:
        return params
    try:
        from inflight.structured_output import StructuredOutputsParams
    except ImportError:
        raise InvalidRequestError(f"tool_choice: {plan.mode!r} needs structured output, "
                                  f"which this server does not support") from None
    if getattr(params, "structured_outputs", None) is not None:
        raise InvalidRequestError("tool_choice: a required or named tool choice cannot be combined "
                                  "with response_format or structured_outputs")
    return dataclasses.replace(params, structured_outputs=StructuredOutputsParams(json=schema))


def message_fields(extracted: ExtractedToolCalls) -> dict[str, Any]:
    """``content`` and ``tool_calls`` of a non-streamed message."""
    calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
             for c in extracted.tool_calls]
    return {"content": extracted.content, "tool_calls": calls}


def delta_messages(parsed: ParsedDelta) -> list[DeltaMessage]:
    """The chunks' deltas of a parsed piece of output: text as content; each call
    as OpenAI streams it (id, type and name with empty arguments, then the arguments)."""
    out = []
    for part in parsed.parts:
        if isinstance(part, str):
            out.append(DeltaMessage(content=part))
        elif part.id is not None:
            out.append(DeltaMessage(tool_calls=[DeltaToolCall(
                index=part.index, id=part.id, type="function",
                function=DeltaFunctionCall(name=part.name, arguments=part.arguments))]))
        else:
            out.append(DeltaMessage(tool_calls=[DeltaToolCall(index=part.index,
                                                              function=DeltaFunctionCall(arguments=part.arguments))]))
    return out


async def render_chat_with_tools(state: Any, req: Any, plan: ToolPlan) -> dict[str, Any]:
    """The engine prompt of a conversation with its tools and tool turns, rendered on the tokenizer pool."""
    from inflight.entrypoints.openai.errors import bad_request
    from inflight.entrypoints.openai.tool_render import prepare_messages, template_takes

    renderer = state.renderer
    template = renderer.chat_template or getattr(state.tokenizer, "chat_template", None)
    dicts = [m.template_dict() for m in req.messages]
    if template_takes(template, "tool_calls") and any(
            renderer.has_special_text(str(m.get("tool_calls") or "")) for m in dicts):
        raise bad_request("messages: special-token text is not allowed in tool calls", "messages")
    dicts, extra = prepare_messages(dicts, plan.tools, template)
    kwargs = {**(req.chat_template_kwargs or {}), **extra}
    try:
        return await state.pool.run(renderer.render, dicts, req.add_generation_prompt, kwargs,
                                    req.continue_final_message)
    except InvalidRequestError as e:
        raise bad_request(str(e), "messages") from None


async def compile_tool_grammar(state: Any, params: SamplingParams, plan: ToolPlan) -> None:
    """Compile the grammar a required or named choice adds now, so a tool schema
    it cannot enforce is a 400 naming ``tools`` (adding the request finds it cached)."""
    from inflight.entrypoints.openai.errors import OpenAIError, bad_request
    from inflight.entrypoints.openai.serving_common import compile_grammar

    if plan.schema() is None:
        return
    try:
        await compile_grammar(state, params, "tools")
    except OpenAIError as e:
        if e.status != 400:
            raise
        raise bad_request(f"tools: the function parameters cannot be enforced for tool_choice "
                          f"{plan.mode!r}: {e.message.removeprefix('tools: ')}", "tools") from None

"""Parsing of output that structured output forced into calls (``tool_choice``
"required" or a named function): no tags, only JSON, as vLLM constrains it.

- a named function: the output is that function's arguments object, streamed
  as it is generated (the call is known from the first token);
- "required": the output is a JSON array of ``{"name", "arguments"}`` objects,
  parsed once it is complete (an array cut short by the length limit gives
  the calls it completed).
"""
from __future__ import annotations

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.utils import calls_of, complete_array_items, parse_call_objects


class NamedToolCallStream(ToolCallStream):
    """The whole output is the arguments of one call to ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._started = False

    @property
    def tools_called(self) -> bool:
        return self._started

    def _start(self, out: ParsedDelta) -> None:
        if not self._started:
            self._started = True
            out.add_call(ToolCallDelta(index=0, id=make_tool_call_id(), name=self.name))

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if text:
            self._start(out)
            out.add_call(ToolCallDelta(index=0, arguments=text))
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        self._start(out)
        return out


class RequiredToolCallStream(ToolCallStream):
    """The whole output is a JSON array of calls; content if it is not (e.g. cut by the length limit)."""

    def __init__(self) -> None:
        self._buf: list[str] = []
        self._calls = 0

    @property
    def tools_called(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> ParsedDelta:
        self._buf.append(text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text = "".join(self._buf)
        # An array cut short by the length limit still holds the calls it completed.
        calls = parse_call_objects(text) or calls_of(complete_array_items(text))
        if calls is None:
            out = ParsedDelta()
            out.add_text(text)
            return out
        out = ParsedDelta()
        for i, (name, arguments) in enumerate(calls):
            out.add_call(ToolCallDelta(index=i, id=make_tool_call_id(), name=name))
            out.add_call(ToolCallDelta(index=i, arguments=arguments))
        self._calls = len(calls)
        return out

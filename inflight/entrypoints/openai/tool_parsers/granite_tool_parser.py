"""Granite 3.x tool calls (``--tool-call-parser granite``): the output is a JSON list
of ``{"name", "arguments"}`` objects, after ``<|tool_call|>`` (3.0) or ``<tool_call>``
(3.1), as vLLM reads it; anything else is content. Calls stream as generated."""
from __future__ import annotations

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolCallStream, ToolParser
from inflight.entrypoints.openai.tool_parsers.llama_tool_parser import LeadingJsonCallsStream
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager


class GraniteToolCallStream(LeadingJsonCallsStream):
    """A JSON list of calls after the optional tags."""

    prefixes = ("<|tool_call|>", "<tool_call>")
    starts = ("[",)
    separator = ","


@ToolParserManager.register_module("granite")
class GraniteToolParser(ToolParser):
    """``--tool-call-parser granite``."""

    def stream(self) -> ToolCallStream:
        return GraniteToolCallStream()

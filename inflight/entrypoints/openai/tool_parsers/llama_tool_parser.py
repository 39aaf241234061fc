"""Llama 3.1 / 3.2 / 4 JSON tool calls (``--tool-call-parser llama3_json`` or ``llama4_json``).

The model answers with calls instead of text: ``{"name": ..., "parameters": {...}}``
(``arguments`` too), several separated by ``;``, optionally after
``<|python_tag|>`` (seen only with ``skip_special_tokens: false``). As in vLLM's
streaming parser, an output is read as calls only if it begins with the tag or
``{``; anything else is content. Calls stream as they are generated
(json_calls.py); text after them is content.
"""
from __future__ import annotations

from typing import Optional

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser,
                                                                           make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.content import ContentText
from inflight.entrypoints.openai.tool_parsers.json_calls import JsonCallsScanner
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager
from inflight.entrypoints.openai.tool_parsers.utils import parse_separated_calls

BOT = "<|python_tag|>"


class LeadingJsonCallsStream(ToolCallStream):
    """An output that is calls when it begins with one of ``starts`` (after optional
    ``prefixes``, in order) and content otherwise; the result does not depend on how
    the text is split."""

    prefixes: tuple[str, ...] = (BOT,)
    starts: tuple[str, ...] = ("{",)
    separator = ";"  # between calls outside a list

    def __init__(self) -> None:
        self._head = ""  # the text before the calls are decided on (whitespace, the tag)
        self._calls: Optional[JsonCallsScanner] = None
        self._content = ContentText()
        self._plain = False  # decided: the output is content
        self._called = 0

    @property
    def tools_called(self) -> bool:
        return self._called > 0 or (self._calls is not None and self._calls.emitted > 0)

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if self._plain:
            self._content.add(text, out)
        elif self._calls is not None:
            self._feed_calls(text, out)
        else:
            self._decide(text, out)
        return out

    def _decide(self, text: str, out: ParsedDelta) -> None:
        self._head += text
        body = self._head.lstrip()
        for prefix in self.prefixes:
            if body.startswith(prefix):
                body = body[len(prefix):].lstrip()
            elif prefix.startswith(body):  # the prefix may still be arriving
                return
        if not body:
            return
        if not body.startswith(self.starts):
            self._plain = True
            self._content.add(self._head, out)
            return
        self._head = self._head[:len(self._head) - len(body)]
        self._calls = JsonCallsScanner(0, make_tool_call_id, separator=self.separator)
        self._feed_calls(body, out)

    def _feed_calls(self, text: str, out: ParsedDelta) -> None:
        self._calls.feed(text, out)
        if self._calls.done:  # what follows the calls is content
            self._called, rest = self._calls.emitted, self._calls.rest
            self._calls, self._plain = None, True
            self._content.call_made()
            self._content.add(rest, out)

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._calls is None and not self._plain:
            self._content.add(self._head, out)
        elif self._calls is not None and self._calls.emitted:
            self._called = self._calls.emitted
        elif self._calls is not None:  # nothing streamed: the whole text, read at once
            calls = parse_separated_calls(self._calls.text, self.separator)
            if calls is None:
                self._content.add(self._head + self._calls.text, out)
            for i, (name, arguments) in enumerate(calls or []):
                out.add_call(ToolCallDelta(index=i, id=make_tool_call_id(), name=name))
                out.add_call(ToolCallDelta(index=i, arguments=arguments))
            self._called = len(calls or [])
        self._calls = None
        self._content.finish(self._called > 0, out)
        return out


@ToolParserManager.register_module("llama3_json")
@ToolParserManager.register_module("llama4_json")
class Llama3JsonToolParser(ToolParser):
    """``--tool-call-parser llama3_json`` (``llama4_json``)."""

    def stream(self) -> ToolCallStream:
        return LeadingJsonCallsStream()

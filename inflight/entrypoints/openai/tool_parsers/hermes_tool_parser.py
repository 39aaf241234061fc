"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The format of Hermes, Qwen 2.5 / 3 and SmolLM2-Instruct (which may also put a
list of calls in one tag). Text outside the tags is content. A call is streamed
as it is generated: its name once the ``{`` of its arguments arrives, then the
arguments as the model writes them (json_calls.py). A tag whose JSON cannot
begin a call is read whole once it closes (keys in another order, arguments as
a string) and, if it is no call, returned as content, unchanged.
"""
from __future__ import annotations

from typing import Optional

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser,
                                                                           make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.content import ContentText
from inflight.entrypoints.openai.tool_parsers.json_calls import JsonCallsScanner
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager
from inflight.entrypoints.openai.tool_parsers.utils import parse_call_objects, partial_prefix_len

START, END = "<tool_call>", "</tool_call>"


class HermesToolCallStream(ToolCallStream):
    """Incremental hermes parsing; the result does not depend on how the text is split."""

    def __init__(self) -> None:
        self._buf = ""  # outside a tag: maybe a START arriving; inside: maybe an END arriving
        self._tag: Optional[JsonCallsScanner] = None  # the open tag's body
        self._ws_before_tag = ""
        self._content = ContentText()
        self._calls = 0

    @property
    def tools_called(self) -> bool:
        return self._calls > 0 or (self._tag is not None and self._tag.emitted > 0)

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        while True:
            if self._tag is not None:
                end = self._buf.find(END)
                if end < 0:
                    cut = len(self._buf) - partial_prefix_len(self._buf, END)
                    self._tag.feed(self._buf[:cut], out)
                    self._buf = self._buf[cut:]
                    break
                self._tag.feed(self._buf[:end], out)
                self._buf = self._buf[end + len(END):]
                self._close(True, out)
                continue
            start = self._buf.find(START)
            if start < 0:
                cut = len(self._buf) - partial_prefix_len(self._buf, START)
                self._content.add(self._buf[:cut], out)
                self._buf = self._buf[cut:]
                break
            self._content.add(self._buf[:start], out)
            self._ws_before_tag = self._content.take_held()
            self._buf = self._buf[start + len(START):]
            self._tag = JsonCallsScanner(self._calls, make_tool_call_id)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._tag is not None:  # a tag cut short by a stop or the length limit
            self._tag.feed(self._buf, out)
            self._close(False, out)
        else:
            self._content.add(self._buf, out)
        self._buf = ""
        self._content.finish(self._calls > 0, out)
        return out

    def _close(self, closed: bool, out: ParsedDelta) -> None:
        tag, self._tag = self._tag, None
        if tag.emitted:  # text after the calls inside the tag is markup, dropped
            self._calls += tag.emitted
            self._content.call_made()
            return
        calls = parse_call_objects(tag.text)
        if calls is None:
            self._content.add(self._ws_before_tag + START + tag.text + (END if closed else ""), out)
            return
        for name, arguments in calls:
            out.add_call(ToolCallDelta(index=self._calls, id=make_tool_call_id(), name=name))
            out.add_call(ToolCallDelta(index=self._calls, arguments=arguments))
            self._calls += 1
        self._content.call_made()


@ToolParserManager.register_module("hermes")
class Hermes2ProToolParser(ToolParser):
    """``--tool-call-parser hermes`` (the default)."""

    def stream(self) -> ToolCallStream:
        return HermesToolCallStream()

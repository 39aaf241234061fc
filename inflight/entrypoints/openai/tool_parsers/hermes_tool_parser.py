"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The format of Hermes, Qwen 2.5 and SmolLM2-Instruct (which may also put a list
of calls in one tag). Text outside the tags is content; a tag whose JSON is not a
call is returned as content, unchanged. Whitespace between the content and a
call, or between calls, is layout and is dropped, so a reply made only of calls
has no content.
"""
from __future__ import annotations

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser,
                                                                           make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager
from inflight.entrypoints.openai.tool_parsers.utils import parse_call_objects, partial_prefix_len

START, END = "<tool_call>", "</tool_call>"


class HermesToolCallStream(ToolCallStream):
    """Incremental hermes parsing; the result does not depend on how the text is split."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._held_ws = ""  # trailing whitespace of the content: layout if a call follows
        self._ws_before_call = ""
        self._after_call = False
        self._calls = 0

    @property
    def tools_called(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        while True:
            if self._inside:
                end = self._buf.find(END)
                if end < 0:
                    break
                inner, self._buf = self._buf[:end], self._buf[end + len(END):]
                self._inside = False
                self._close(inner, True, out)
                continue
            start = self._buf.find(START)
            if start < 0:
                keep = partial_prefix_len(self._buf, START)
                self._text(self._buf[:len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep:]
                break
            self._text(self._buf[:start], out)
            self._ws_before_call, self._held_ws = self._held_ws, ""
            self._buf = self._buf[start + len(START):]
            self._inside = True
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._inside:  # a call cut short by a stop or the length limit: kept if its JSON is whole
            self._inside = False
            self._close(self._buf, False, out)
        else:
            self._text(self._buf, out)
        self._buf = ""
        if not self._calls:
            out.add_text(self._held_ws)  # plain text keeps its trailing whitespace
        self._held_ws = ""
        return out

    def _text(self, text: str, out: ParsedDelta) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        if body:
            out.add_text(self._held_ws + body)
            self._held_ws = text[len(body):]
        else:
            self._held_ws += text

    def _close(self, inner: str, closed: bool, out: ParsedDelta) -> None:
        calls = parse_call_objects(inner)
        if calls is None:
            self._text(self._ws_before_call + START + inner + (END if closed else ""), out)
            return
        for name, arguments in calls:
            out.add_call(ToolCallDelta(index=self._calls, id=make_tool_call_id(), name=name))
            out.add_call(ToolCallDelta(index=self._calls, arguments=arguments))
            self._calls += 1
        self._after_call = True


@ToolParserManager.register_module("hermes")
class Hermes2ProToolParser(ToolParser):
    """``--tool-call-parser hermes`` (the default)."""

    def stream(self) -> ToolCallStream:
        return HermesToolCallStream()

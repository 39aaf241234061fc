"""Qwen3-Coder tool calls (``--tool-call-parser qwen3_coder``)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value is raw text, typed by the tool's schema as vLLM does (a string stays as
written, integers, numbers, booleans and JSON objects or arrays are parsed, a
parameter the schema does not name stays a string). The call is emitted once
``<function=NAME>`` has arrived, its arguments ``{`` with it, then each parameter
as it closes and ``}`` at ``</function>``: the same text as ``json.dumps`` of the
whole object. A tag with no function in it is content, unchanged.
"""
from __future__ import annotations

import ast
import json
import math
from typing import Any, Optional

import regex

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser,
                                                                           make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.content import ContentText
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager
from inflight.entrypoints.openai.tool_parsers.utils import partial_prefix_len

START, END = "<tool_call>", "</tool_call>"
FUNCTION = regex.compile(r"\s*<function=([^>\n]+)>")
PARAMETER = regex.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", regex.DOTALL)
FUNCTION_END = regex.compile(r"\s*</function>")


def convert_value(value: str, schema: Any) -> Any:
    """A parameter's raw text as the type its schema gives (vLLM's rules); the text
    itself where it does not parse as that type."""
    if value.lower() == "null":
        return None
    if not isinstance(schema, dict):
        return value
    kind = str(schema.get("type", "object" if "anyOf" in schema else "string")).strip().lower()
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    try:
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(value)
        if kind.startswith(("num", "float")):
            number = float(value)
            if not math.isfinite(number):
                return value
            return int(number) if number.is_integer() else number
        if kind.startswith("bool"):
            return value.strip().lower() == "true"
    except ValueError:
        return value
    for parse in (json.loads, ast.literal_eval):  # objects, arrays, anything else: never evaluated
        try:
            parsed = parse(value)
            json.dumps(parsed)
            return parsed
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return value


class Qwen3CoderToolCallStream(ToolCallStream):
    """Incremental qwen3_coder parsing; the result does not depend on how the text is split."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self._schemas = {t["function"]["name"]: (t["function"].get("parameters") or {}).get("properties") or {}
                         for t in tools if isinstance(t, dict) and "function" in t}
        self._buf = ""
        self._tag: Optional[str] = None  # the open tag's body so far
        self._pos = 0  # how much of it is read
        self._function: Optional[str] = None  # the open function (its arguments not yet closed)
        self._params = 0
        self._emitted = 0  # calls emitted in the open tag
        self._ws_before_tag = ""
        self._content = ContentText()
        self._calls = 0

    @property
    def tools_called(self) -> bool:
        return self._calls > 0 or self._emitted > 0

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        while True:
            marker = END if self._tag is not None else START
            at = self._buf.find(marker)
            if at < 0:
                cut = len(self._buf) - partial_prefix_len(self._buf, marker)
                self._take(self._buf[:cut], out)
                self._buf = self._buf[cut:]
                return out
            self._take(self._buf[:at], out)
            self._buf = self._buf[at + len(marker):]
            if self._tag is None:
                self._ws_before_tag, self._tag, self._pos = self._content.take_held(), "", 0
            else:
                self._close(True, out)

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._tag is not None:
            self._take(self._buf, out)
            self._close(False, out)
        else:
            self._content.add(self._buf, out)
        self._buf = ""
        self._content.finish(self._calls > 0, out)
        return out

    def _take(self, text: str, out: ParsedDelta) -> None:
        if self._tag is None:
            self._content.add(text, out)
            return
        self._tag += text
        while self._step(out):
            pass

    def _step(self, out: ParsedDelta) -> bool:
        if self._function is None:
            m = FUNCTION.match(self._tag, self._pos, partial=True)
            if m is None or m.partial:
                return False
            self._function, self._params, self._pos = m.group(1).strip(), 0, m.end()
            index = self._calls + self._emitted
            out.add_call(ToolCallDelta(index=index, id=make_tool_call_id(), name=self._function))
            out.add_call(ToolCallDelta(index=index, arguments="{"))
            self._emitted += 1
            return True
        m = PARAMETER.match(self._tag, self._pos, partial=True)
        if m is not None and not m.partial:
            name = m.group(1).strip()
            value = convert_value(m.group(2), self._schemas.get(self._function, {}).get(name))
            piece = (", " if self._params else "") + json.dumps(name, ensure_ascii=False) + ": " + \
                json.dumps(value, ensure_ascii=False)
            out.add_call(ToolCallDelta(index=self._calls + self._emitted - 1, arguments=piece))
            self._params, self._pos = self._params + 1, m.end()
            return True
        end = FUNCTION_END.match(self._tag, self._pos, partial=True)
        if end is not None and not end.partial:
            self._close_function(out)
            self._pos = end.end()
            return True
        return False

    def _close_function(self, out: ParsedDelta) -> None:
        out.add_call(ToolCallDelta(index=self._calls + self._emitted - 1, arguments="}"))
        self._function = None

    def _close(self, closed: bool, out: ParsedDelta) -> None:
        if self._function is not None:  # cut short: the arguments read so far, closed
            self._close_function(out)
        tag, self._tag = self._tag, None
        if self._emitted:
            self._calls += self._emitted
            self._emitted = 0
            self._content.call_made()
        else:
            self._content.add(self._ws_before_tag + START + tag + (END if closed else ""), out)


@ToolParserManager.register_module("qwen3_coder")
class Qwen3CoderToolParser(ToolParser):
    """``--tool-call-parser qwen3_coder``: needs the request's tools to type the values."""

    def stream(self) -> ToolCallStream:
        return Qwen3CoderToolCallStream(self.tools)

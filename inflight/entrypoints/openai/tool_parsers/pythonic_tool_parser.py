"""Pythonic tool calls (``--tool-call-parser pythonic``): Llama 3.2 and 4,
ToolACE: the output is a Python list of calls, ``[f(a=1), g(b="x")]``.

Read with ``ast`` (never evaluated): every item must be a call of a plain name
with keyword arguments whose values are literals; the arguments become a JSON
object. An output is read as calls only if it begins with ``[`` (after an
optional ``<|python_start|>``); anything else is content. A call is emitted as
soon as the text up to its closing parenthesis, closed with ``]``, is a valid
list of calls, so calls stream one whole call at a time. An item that is not a
call ends the calls: before any call was emitted, the whole output is content;
after one, the rest of the output is dropped. Text after the list is content.
"""
from __future__ import annotations

import ast
import json
from typing import Optional

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser,
                                                                           make_tool_call_id)
from inflight.entrypoints.openai.tool_parsers.content import ContentText
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager

PY_START = "<|python_start|>"
_INVALID = object()


def calls_of_list(source: str) -> object:
    """The ``(name, arguments JSON)`` calls of a Python list expression; None if
    ``source`` is not valid Python (yet), ``_INVALID`` if it is, but is no list of calls."""
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting too: not a call list (yet)
        return None
    if not isinstance(tree, ast.List):
        return _INVALID
    calls = []
    for item in tree.elts:
        if not isinstance(item, ast.Call) or not isinstance(item.func, ast.Name) or item.args:
            return _INVALID
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in item.keywords if kw.arg is not None}
            if len(arguments) != len(item.keywords):
                return _INVALID
            calls.append((item.func.id, json.dumps(arguments, ensure_ascii=False)))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return _INVALID
    return calls


class PythonicToolCallStream(ToolCallStream):
    """Incremental pythonic parsing; the result does not depend on how the text is split."""

    def __init__(self) -> None:
        self._head = ""  # the text before the calls are decided on
        self._list: Optional[str] = None  # the list's text so far, from its "["
        self._checked = 0  # the list's text examined for the end of a call
        self._mode = "undecided"  # undecided | calls | content | dropped
        self._content = ContentText()
        self._called = 0

    @property
    def tools_called(self) -> bool:
        return self._called > 0

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if self._mode == "content":
            self._content.add(text, out)
        elif self._mode == "calls":
            self._list += text
            self._scan(out)
        elif self._mode == "undecided":
            self._decide(text, out)
        return out

    def _decide(self, text: str, out: ParsedDelta) -> None:
        self._head += text
        body = self._head.lstrip()
        if body.startswith(PY_START):
            body = body[len(PY_START):].lstrip()
        elif len(body) < len(PY_START) and PY_START.startswith(body):
            return
        if not body:
            return
        if not body.startswith("["):
            self._mode = "content"
            self._content.add(self._head, out)
            return
        self._head, self._list, self._mode = self._head[:len(self._head) - len(body)], body, "calls"
        self._scan(out)

    def _scan(self, out: ParsedDelta) -> None:
        """Try each ``)`` and ``]`` not yet tried as the end of the latest call or of the list."""
        text = self._list
        for i in range(self._checked, len(text)):
            if text[i] not in ")]" or self._mode != "calls":
                continue
            self._checked = i + 1
            closes_list = text[i] == "]"
            calls = calls_of_list(text[:i + 1] if closes_list else text[:i + 1] + "]")
            if calls is None:
                continue
            if calls is _INVALID:
                self._invalid(out)
                return
            self._emit(calls, out)
            if closes_list:  # what follows the list is content
                self._mode = "content"
                self._content.add(text[i + 1:], out)
                return
        self._checked = len(text)

    def _emit(self, calls: list, out: ParsedDelta) -> None:
        for name, arguments in calls[self._called:]:
            out.add_call(ToolCallDelta(index=self._called, id=make_tool_call_id(), name=name))
            out.add_call(ToolCallDelta(index=self._called, arguments=arguments))
            self._called += 1
        if calls:
            self._content.call_made()

    def _invalid(self, out: ParsedDelta) -> None:
        if self._called:
            self._mode = "dropped"
        else:
            self._mode = "content"
            self._content.add(self._head + self._list, out)

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._mode == "undecided":
            self._content.add(self._head, out)
        elif self._mode == "calls" and not self._called:  # never became a list of calls
            self._content.add(self._head + self._list, out)
        self._mode = "dropped"
        self._content.finish(self._called > 0, out)
        return out


@ToolParserManager.register_module("pythonic")
class PythonicToolParser(ToolParser):
    """``--tool-call-parser pythonic``."""

    def stream(self) -> ToolCallStream:
        return PythonicToolCallStream()

"""Calls written as JSON, read as they are generated.

``{"name": "f", "arguments": {...}}`` (``parameters`` for ``arguments``, an
optional leading ``"type": "function"``), a list of such objects, or several
separated by ``;`` (Llama). Once a call's name and the ``{`` of its arguments
have arrived, the call is emitted: its name first, then the arguments object
exactly as the model writes it, a fragment per piece of text, so a streamed
call concatenates to the non-streamed one.

A call that is emitted cannot be taken back, so the decisions are made only on
what has arrived: text that cannot begin a call before any call was emitted
``failed`` (the caller reads the whole text once it has ended, as JSON that
may put the keys in another order, or returns it as content); text that stops
being calls after one was emitted ends the calls (``done``, the rest is in
``rest``).
"""
from __future__ import annotations

import json
from typing import Callable

import regex

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedDelta, ToolCallDelta

# Up to the "{" that opens the arguments, or the "}" of a call without arguments;
# matched with partial=True so a header still arriving is told from one that cannot be.
HEADER = regex.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*'
                       r'(?:,\s*"(?:arguments|parameters)"\s*:\s*(\{)|(\}))')
_SPECIAL = regex.compile(r'[\\"{}\[\]]')


class JsonValueEnd:
    """Finds where a JSON object or array ends, fed its text a piece at a time from its first bracket."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> int:
        """The index just past the value's closing bracket in ``text``, or -1 if it has not closed yet."""
        i = 0
        if self._escape and text:  # the previous piece ended on a backslash inside a string
            self._escape, i = False, 1
        while True:
            m = _SPECIAL.search(text, i)
            if m is None:
                return -1
            i, ch = m.start(), m.group()
            if self._in_string:
                if ch == "\\":
                    if i + 1 == len(text):
                        self._escape = True
                        return -1
                    i += 1
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            i += 1


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i``."""
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


class JsonCallsScanner:
    """Reads one body of JSON calls a piece at a time (see the module docstring)."""

    def __init__(self, first_index: int, new_id: Callable[[], str], separator: str = ",") -> None:
        self.text = ""
        self.pos = 0
        self.state = "start"
        self.emitted = 0
        self._first_index = first_index
        self._new_id = new_id
        self._separator = separator  # between objects outside a list
        self._list = False
        self._value = JsonValueEnd()

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def rest(self) -> str:
        """The text after the calls (once done)."""
        return self.text[self.pos:]

    def feed(self, text: str, out: ParsedDelta) -> None:
        """Read the next piece of the body; what it completes goes to ``out``."""
        self.text += text
        while self.state not in ("failed", "done") and getattr(self, "_" + self.state)(out):
            pass

    def _fail(self) -> bool:
        self.state = "failed" if not self.emitted else "done"
        return False

    def _start(self, out: ParsedDelta) -> bool:
        i = skip_ws(self.text, self.pos)
        if i == len(self.text):
            return False
        self._list = self.text[i] == "["
        self.pos, self.state = i + self._list, "header"
        return True

    def _header(self, out: ParsedDelta) -> bool:
        i = skip_ws(self.text, self.pos)
        if i == len(self.text):
            return False
        m = HEADER.match(self.text, i, partial=True)
        if m is None:
            return self._fail()
        if m.partial:
            return False
        name = json.loads(m.group(1))
        if not name:
            return self._fail()
        index = self._first_index + self.emitted
        self.emitted += 1
        out.add_call(ToolCallDelta(index=index, id=self._new_id(), name=name))
        if m.group(2):
            self.pos, self.state, self._value = m.start(2), "args", JsonValueEnd()
        else:
            out.add_call(ToolCallDelta(index=index, arguments="{}"))
            self.pos, self.state = m.end(), "between"
        return True

    def _args(self, out: ParsedDelta) -> bool:
        chunk = self.text[self.pos:]
        if not chunk:
            return False
        end = self._value.feed(chunk)
        piece = chunk if end < 0 else chunk[:end]
        out.add_call(ToolCallDelta(index=self._first_index + self.emitted - 1, arguments=piece))
        self.pos += len(piece)
        if end < 0:
            return False
        self.state = "obj_end"
        return True

    def _obj_end(self, out: ParsedDelta) -> bool:
        i = skip_ws(self.text, self.pos)
        if i == len(self.text):
            return False
        if self.text[i] == "}":
            self.pos, self.state = i + 1, "between"
        elif self.text[i] == ",":  # more keys after the arguments: skipped to the end of the object
            self.pos, self.state, self._value = i + 1, "skip", JsonValueEnd(depth=1)
        else:
            return self._fail()
        return True

    def _skip(self, out: ParsedDelta) -> bool:
        end = self._value.feed(self.text[self.pos:])
        if end < 0:
            self.pos = len(self.text)
            return False
        self.pos, self.state = self.pos + end, "between"
        return True

    def _between(self, out: ParsedDelta) -> bool:
        i = skip_ws(self.text, self.pos)
        if i == len(self.text):
            return False
        ch = self.text[i]
        if ch == ("," if self._list else self._separator):
            self.pos, self.state = i + 1, "header"
        elif self._list and ch == "]":
            self.pos, self.state = i + 1, "done"
        else:
            self.pos, self.state = i, "done"
        return True

"""The content around tool calls, as every parser returns it.

Whitespace between the content and a call, or between calls, is layout and is
dropped, so a reply made only of calls has no content; plain text keeps its
whitespace. The decisions depend only on the text seen so far, so they are the
same however the output is split into pieces.
"""
from __future__ import annotations

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import ParsedDelta


class ContentText:
    """Content text of one choice, with the layout whitespace around calls held back and dropped."""

    def __init__(self) -> None:
        self._held_ws = ""  # trailing whitespace of the content: layout if a call follows
        self._after_call = False

    def add(self, text: str, out: ParsedDelta) -> None:
        """Content text, in output order."""
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

    def take_held(self) -> str:
        """The held whitespace, now that something that may be a call begins (given back
        through ``add`` if it turns out to be content)."""
        held, self._held_ws = self._held_ws, ""
        return held

    def call_made(self) -> None:
        """A call was emitted: whitespace that follows it is layout."""
        self._after_call = True

    def finish(self, tools_called: bool, out: ParsedDelta) -> None:
        """The end of the output: plain text keeps its trailing whitespace."""
        if not tools_called:
            out.add_text(self._held_ws)
        self._held_ws = ""

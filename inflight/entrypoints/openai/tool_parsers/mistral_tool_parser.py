"""Mistral tool calls (``--tool-call-parser mistral``).

Content, then ``[TOOL_CALLS]`` and either a JSON list of calls
(``[{"name": ..., "arguments": {...}}]``, Mistral 7B v0.3, Nemo) or, in the
newer form, ``name[ARGS]{...}`` (or ``name{...}``), a ``[TOOL_CALLS]`` per
call (Mistral Small 3.2, Devstral, Magistral). ``[TOOL_CALLS]`` is a special
token, so requests that may call tools keep special tokens in the output
(``adjust_request``, as vLLM does). Calls stream as they are generated; ids
are 9 letters and digits, the only form Mistral's chat templates accept back.
"""
from __future__ import annotations

import dataclasses
import random
import string
from typing import Optional

import regex

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ParsedDelta, ToolCallDelta,
                                                                           ToolCallStream, ToolParser)
from inflight.entrypoints.openai.tool_parsers.content import ContentText
from inflight.entrypoints.openai.tool_parsers.json_calls import JsonCallsScanner, JsonValueEnd, skip_ws
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager
from inflight.entrypoints.openai.tool_parsers.utils import (calls_of, complete_array_items, parse_call_objects,
                                                            partial_prefix_len)
from inflight.sampling_params import SamplingParams

BOT = "[TOOL_CALLS]"
NAME_FORM = regex.compile(r"([A-Za-z0-9_.\-]+)(?:\[ARGS\])?\{")
_ALNUM = string.ascii_letters + string.digits


def mistral_tool_call_id() -> str:
    """A Mistral tool call id: 9 letters and digits."""
    return "".join(random.choices(_ALNUM, k=9))


class MistralToolCallStream(ToolCallStream):
    """Incremental mistral parsing; the result does not depend on how the text is split."""

    def __init__(self) -> None:
        self._buf = ""
        self._mode = "content"  # content | start (after BOT) | json | args | fallback
        self._list: Optional[JsonCallsScanner] = None
        self._args = JsonValueEnd()
        self._ws_before = ""
        self._content = ContentText()
        self._called = 0

    @property
    def tools_called(self) -> bool:
        return self._called > 0 or self._mode == "args" or (self._list is not None and self._list.emitted > 0)

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        while getattr(self, "_step_" + self._mode)(out):
            pass
        return out

    def _step_content(self, out: ParsedDelta) -> bool:
        start = self._buf.find(BOT)
        if start < 0:
            cut = len(self._buf) - partial_prefix_len(self._buf, BOT)
            self._content.add(self._buf[:cut], out)
            self._buf = self._buf[cut:]
            return False
        self._content.add(self._buf[:start], out)
        self._ws_before, self._buf, self._mode = self._content.take_held(), self._buf[start + len(BOT):], "start"
        return True

    def _step_start(self, out: ParsedDelta) -> bool:
        i = skip_ws(self._buf, 0)
        if i == len(self._buf):
            return False
        if self._buf[i] in "[{":
            self._list, self._mode = JsonCallsScanner(self._called, mistral_tool_call_id), "json"
            return True
        m = NAME_FORM.match(self._buf, i, partial=True)
        if m is None:  # not a call after all: the token is content
            self._content.add(self._ws_before + BOT, out)
            self._mode = "content"
            return True
        if m.partial:
            return False
        out.add_call(ToolCallDelta(index=self._called, id=mistral_tool_call_id(), name=m.group(1)))
        self._buf, self._mode, self._args = self._buf[m.end() - 1:], "args", JsonValueEnd()
        return True

    def _step_args(self, out: ParsedDelta) -> bool:
        end = self._args.feed(self._buf)
        piece = self._buf if end < 0 else self._buf[:end]
        if piece:
            out.add_call(ToolCallDelta(index=self._called, arguments=piece))
        self._buf = self._buf[len(piece):]
        if end < 0:
            return False
        self._called += 1
        self._content.call_made()
        self._mode = "content"
        return True

    def _step_json(self, out: ParsedDelta) -> bool:
        self._list.feed(self._buf, out)
        self._buf = ""
        if self._list.failed:
            self._mode = "fallback"
        elif self._list.done:  # what follows the list is content (or the next BOT)
            self._called += self._list.emitted
            self._buf, self._list, self._mode = self._list.rest, None, "content"
            self._content.call_made()
            return True
        return False

    def _step_fallback(self, out: ParsedDelta) -> bool:
        self._list.feed(self._buf, out)  # kept whole, read when the output ends
        self._buf = ""
        return False

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._mode == "content":
            self._content.add(self._buf, out)
        elif self._mode == "start":
            self._content.add(self._ws_before + BOT + self._buf, out)
        elif self._mode == "args":
            self._called += 1
        elif self._list is not None and self._list.emitted:
            self._called += self._list.emitted
        elif self._list is not None:
            self._finish_whole(self._list.text, out)
        self._buf, self._list, self._mode = "", None, "content"
        self._content.finish(self._called > 0, out)
        return out

    def _finish_whole(self, text: str, out: ParsedDelta) -> None:
        calls = parse_call_objects(text) or calls_of(complete_array_items(text))
        if calls is None:
            self._content.add(self._ws_before + BOT + text, out)
            return
        for name, arguments in calls:
            out.add_call(ToolCallDelta(index=self._called, id=mistral_tool_call_id(), name=name))
            out.add_call(ToolCallDelta(index=self._called, arguments=arguments))
            self._called += 1


@ToolParserManager.register_module("mistral")
class MistralToolParser(ToolParser):
    """``--tool-call-parser mistral``."""

    def stream(self) -> ToolCallStream:
        return MistralToolCallStream()

    def adjust_request(self, params: SamplingParams) -> SamplingParams:
        return dataclasses.replace(params, skip_special_tokens=False)

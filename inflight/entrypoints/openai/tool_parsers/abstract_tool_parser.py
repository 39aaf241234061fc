"""The interface every tool-call parser implements, and what they return.

A parser turns model output into OpenAI tool calls. It works incrementally
(``ToolCallStream.feed`` per piece of text, ``finish`` at the end); the
non-streamed result is the same stream fed the whole text at once, so a
streamed answer always concatenates to exactly the non-streamed one.
"""
from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union


def make_tool_call_id() -> str:
    """An OpenAI-style tool call id, e.g. ``call_9f2c...``."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallDelta:
    """A piece of one tool call: the first piece of a call carries its id and
    name, the following ones fragments of its arguments (a JSON string)."""

    index: int
    id: Optional[str] = None
    name: Optional[str] = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    """What a piece of model output turned into: content text and tool-call pieces, in output order."""

    parts: list[Union[str, ToolCallDelta]] = field(default_factory=list)

    def add_text(self, text: str) -> None:
        if not text:
            return
        if self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += text
        else:
            self.parts.append(text)

    def add_call(self, piece: ToolCallDelta) -> None:
        self.parts.append(piece)

    def extend(self, other: "ParsedDelta") -> None:
        for part in other.parts:
            self.add_text(part) if isinstance(part, str) else self.add_call(part)

    @property
    def content(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        return [p for p in self.parts if isinstance(p, ToolCallDelta)]

    def __bool__(self) -> bool:
        return bool(self.parts)


@dataclass
class ParsedToolCall:
    """One complete tool call."""

    id: str
    name: str
    arguments: str


@dataclass
class ExtractedToolCalls:
    """The non-streamed result: the calls, and the text outside them (None when empty and calls were made)."""

    tool_calls: list[ParsedToolCall]
    content: Optional[str]

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


def collect(deltas: Iterable[ParsedDelta]) -> ExtractedToolCalls:
    """Join streamed pieces into the calls and content they add up to."""
    content: list[str] = []
    calls: dict[int, ParsedToolCall] = {}
    for delta in deltas:
        content.append(delta.content)
        for piece in delta.tool_calls:
            call = calls.setdefault(piece.index, ParsedToolCall(id=piece.id or "", name=piece.name or "",
                                                                arguments=""))
            call.arguments += piece.arguments
    text = "".join(content)
    ordered = [calls[i] for i in sorted(calls)]
    return ExtractedToolCalls(tool_calls=ordered, content=text if text or not ordered else None)


class ToolCallStream(ABC):
    """The parsing state of one choice's output."""

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """What the next piece of output text adds (text that may still turn
        out to be part of a call is held back)."""

    @abstractmethod
    def finish(self) -> ParsedDelta:
        """What is left once the output has ended."""

    @property
    @abstractmethod
    def tools_called(self) -> bool:
        """True once at least one call was emitted."""


class ToolParser(ABC):
    """Parses one model family's tool-call syntax (vLLM's ``--tool-call-parser``)."""

    def __init__(self, tokenizer: Any = None, tools: Optional[list[dict[str, Any]]] = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or []  # the request's tools, as dicts (a parser may type values by their schema)

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh parsing state for one choice."""

    def adjust_request(self, params: Any) -> Any:
        """The sampling params of a request that may call tools, changed as the
        format needs (e.g. special tokens kept when a call begins with one)."""
        return params

    def extract_tool_calls(self, model_output: str) -> ExtractedToolCalls:
        """The calls in a complete output (the same parsing as streaming)."""
        s = self.stream()
        return collect([s.feed(model_output), s.finish()])

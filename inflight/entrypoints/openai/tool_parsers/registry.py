"""Tool-call parsers by name, as vLLM's ``--tool-call-parser`` chooses them."""
from __future__ import annotations

from typing import Callable

from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolParser


class ToolParserManager:
    """The registry of tool-call parsers."""

    tool_parsers: dict[str, type[ToolParser]] = {}

    @classmethod
    def register_module(cls, name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
        """Class decorator: register a parser under ``name``."""

        def register(parser: type[ToolParser]) -> type[ToolParser]:
            cls.tool_parsers[name] = parser
            return parser

        return register

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        """The parser class registered as ``name``; KeyError naming the known ones otherwise."""
        try:
            return cls.tool_parsers[name]
        except KeyError:
            raise KeyError(f"unknown tool call parser {name!r}; known: {', '.join(sorted(cls.tool_parsers))}") from None

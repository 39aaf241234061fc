"""Tool-call parsers: model output to OpenAI ``tool_calls`` (``--tool-call-parser``)."""
from inflight.entrypoints.openai.tool_parsers.abstract_tool_parser import (ExtractedToolCalls, ParsedDelta,
                                                                           ParsedToolCall, ToolCallDelta,
                                                                           ToolCallStream, ToolParser, collect)
from inflight.entrypoints.openai.tool_parsers.forced import NamedToolCallStream, RequiredToolCallStream
from inflight.entrypoints.openai.tool_parsers.granite_tool_parser import GraniteToolParser
from inflight.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from inflight.entrypoints.openai.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from inflight.entrypoints.openai.tool_parsers.mistral_tool_parser import MistralToolParser
from inflight.entrypoints.openai.tool_parsers.pythonic_tool_parser import PythonicToolParser
from inflight.entrypoints.openai.tool_parsers.qwen3coder_tool_parser import Qwen3CoderToolParser
from inflight.entrypoints.openai.tool_parsers.registry import ToolParserManager

DEFAULT_TOOL_PARSER = "hermes"

__all__ = ["DEFAULT_TOOL_PARSER", "ExtractedToolCalls", "GraniteToolParser", "Hermes2ProToolParser",
           "Llama3JsonToolParser", "MistralToolParser", "NamedToolCallStream", "ParsedDelta", "ParsedToolCall",
           "PythonicToolParser", "Qwen3CoderToolParser", "RequiredToolCallStream", "ToolCallDelta", "ToolCallStream",
           "ToolParser", "ToolParserManager", "collect"]

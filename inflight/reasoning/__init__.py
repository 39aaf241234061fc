"""Reasoning outputs: a thinking model's ``<think>...</think>`` text split from its answer
(vLLM's ``--reasoning-parser``), and structured output held back until the thinking ends."""
from inflight.reasoning.parser import REASONING_PARSERS, ReasoningParser, ReasoningStream, get_reasoning_parser

__all__ = ["REASONING_PARSERS", "ReasoningParser", "ReasoningStream", "get_reasoning_parser"]

"""A thinking model's chat answers under ``--reasoning-parser``: the thinking split from the
content (``message.reasoning``, and ``reasoning_content`` as older vLLM and DeepSeek's API
name it), and structured output (response_format, required or named tools) held back
until the thinking ends, as vLLM does."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from inflight.reasoning import ReasoningStream
from inflight.reasoning.parser import END, START
from inflight.sampling_params import SamplingParams


def gate_grammar(state: Any, params: SamplingParams, prompt_text: str) -> SamplingParams:
    """``params`` with its grammar set to start after the thinking, where the server parses
    reasoning, the model has one-token think tags and the prompt has not already ended the
    thinking (a template asked not to think writes ``<think></think>`` into the prompt)."""
    so, parser, tags = params.structured_outputs, state.reasoning, state.reasoning_tags
    if so is None or parser is None or tags is None or prompt_text.rstrip().endswith(END):
        return params
    start_id, end_id = tags
    thinks_first = parser.reasoning_first or prompt_text.rstrip().endswith(START)
    gated = dataclasses.replace(so, after_reasoning=end_id, optional_reasoning_start=None if thinks_first else start_id)
    return dataclasses.replace(params, structured_outputs=gated)


def split_thinking(stream: Optional[ReasoningStream], text: str, done: bool) -> tuple[str, str]:
    """(thinking, content) of the next piece of a choice's output (all content without a parser);
    ``done``: the output has ended, so text held back for a tag is flushed."""
    if stream is None:
        return "", text
    piece = stream.feed(text)
    thinking, content = piece.reasoning, piece.content
    if done:
        end = stream.finish()
        thinking, content = thinking + end.reasoning, content + end.content
    return thinking, content

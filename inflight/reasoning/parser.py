"""Splits a thinking model's output into reasoning and content, streamed or whole.

Both parsers read ``<think>`` ... ``</think>``; they differ in where thinking starts:

- ``deepseek_r1``: the output is reasoning until ``</think>`` (DeepSeek-R1's template
  ends the prompt with ``<think>``, so the output rarely repeats it); an output that
  never closes its thinking is all reasoning.
- ``qwen3``: the output is reasoning if it opens with ``<think>``, or if the prompt
  ends inside an open ``<think>`` (templates that write it for the model); otherwise
  it is all content (``enable_thinking=False`` renders ``<think></think>`` in the prompt).

A whole output is parsed by streaming it in one piece, so the two always agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

START, END = "<think>", "</think>"


@dataclass
class ReasoningDelta:
    """What a piece of output adds to the reasoning and to the content."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """The split state of one choice's output.

    ``mode`` is "start" until the output shows whether it opens with ``<think>``,
    then "reasoning" until ``</think>``, then "content". Text that may be the
    start of a tag is held back until the next piece decides it.
    """

    def __init__(self, reasoning_first: bool) -> None:
        self._first = "reasoning" if reasoning_first else "content"
        self.mode = "start"
        self._held = ""

    def feed(self, text: str) -> ReasoningDelta:
        """What ``text``, the next piece of output, adds."""
        out = ReasoningDelta()
        buf = self._held + text
        self._held = ""
        while buf:
            if self.mode == "start":
                stripped = buf.lstrip()
                if stripped.startswith(START):
                    buf, self.mode = stripped[len(START):], "reasoning"
                elif START.startswith(stripped):
                    self._held = buf  # "<th...": the next piece decides
                    return out
                else:
                    self.mode = self._first
            elif self.mode == "reasoning":
                end = buf.find(END)
                if end < 0:
                    keep = _partial_tag(buf, END)
                    out.reasoning += buf[:len(buf) - keep]
                    self._held = buf[len(buf) - keep:]
                    return out
                out.reasoning += buf[:end]
                buf, self.mode = buf[end + len(END):], "content"
            else:
                out.content += buf
                buf = ""
        return out

    def finish(self) -> ReasoningDelta:
        """The text held back when the output ended (a tag that never completed is text)."""
        held, self._held = self._held, ""
        if self.mode == "start":
            self.mode = self._first
        return ReasoningDelta(reasoning=held) if self.mode == "reasoning" else ReasoningDelta(content=held)


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass(frozen=True)
class ReasoningParser:
    """One model family's thinking format (vLLM's ``--reasoning-parser`` names)."""

    name: str
    reasoning_first: bool  # the output is reasoning before any tag (the prompt opened the thinking)

    def stream(self, prompt: str = "") -> ReasoningStream:
        """A fresh split state for one choice of a request whose prompt text is ``prompt``."""
        open_in_prompt = prompt.rstrip().endswith(START)
        return ReasoningStream(self.reasoning_first or open_in_prompt)

    def extract(self, output: str, prompt: str = "") -> tuple[Optional[str], Optional[str]]:
        """(reasoning, content) of a whole output; None where there is none."""
        s = self.stream(prompt)
        a, b = s.feed(output), s.finish()
        reasoning, content = a.reasoning + b.reasoning, a.content + b.content
        return reasoning or None, content or None

    def tag_token_ids(self, tokenizer: Any) -> Optional[tuple[int, int]]:
        """The ids of ``<think>`` and ``</think>`` where each is one token of ``tokenizer``, else None."""
        ids = [tokenizer(tag, add_special_tokens=False).input_ids for tag in (START, END)]
        return (ids[0][0], ids[1][0]) if all(len(i) == 1 for i in ids) else None


REASONING_PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", reasoning_first=True),
                     "qwen3": ReasoningParser("qwen3", reasoning_first=False)}


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser named ``name``; ValueError listing the known names otherwise."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}")
    return REASONING_PARSERS[name]

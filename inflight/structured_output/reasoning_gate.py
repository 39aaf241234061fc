"""A grammar that starts once a reasoning model's thinking ends (vLLM's structured output
with a reasoning parser): the tokens up to and including the end-of-thinking token are
free, the grammar constrains the rest. No torch, no grammar library: it wraps any state.

Where the model may answer without thinking (a Qwen3 that does not open with
``<think>``), the first token is the grammar's or the start-of-thinking token: the
grammar then starts at once or after the thinking.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

CLOSED, UNDECIDED, OPEN = "closed", "undecided", "open"


class ReasoningGate:
    """A :class:`GrammarState` (``inner``) that constrains only the tokens after ``end_id``;
    with ``start_id``, only if the output opens with it (else from the first token)."""

    __slots__ = ("inner", "end_id", "start_id", "state")

    def __init__(self, inner: Any, end_id: int, start_id: Optional[int] = None) -> None:
        self.inner = inner
        self.end_id = end_id
        self.start_id = start_id
        self.state = CLOSED if start_id is None else UNDECIDED

    @property
    def is_terminated(self) -> bool:
        return self.state == OPEN and self.inner.is_terminated

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance by sampled tokens: those after the end of thinking advance the grammar."""
        tokens = list(tokens)
        if self.state == UNDECIDED and tokens:
            self.state = CLOSED if tokens[0] == self.start_id else OPEN
        if self.state == CLOSED:
            if self.end_id not in tokens:
                return True
            self.state = OPEN
            tokens = tokens[tokens.index(self.end_id) + 1:]
        return self.inner.accept_tokens(tokens)

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many draft tokens may be verified: while thinking, those before its end (the
        rows after it would need the grammar's masks, filled before it opens); none undecided."""
        if self.state == OPEN:
            return self.inner.validate_tokens(tokens)
        if self.state == UNDECIDED:
            return 0
        tokens = list(tokens)
        return tokens.index(self.end_id) if self.end_id in tokens else len(tokens)

    def fill_rows(self, bitmask: Any, row: int, drafts: Sequence[int]) -> None:
        """The grammar's masks once open; all-allowed rows while thinking; undecided, the
        grammar's first mask with the start-of-thinking token allowed too."""
        if self.state == CLOSED:
            return
        self.inner.fill_rows(bitmask, row, drafts)
        if self.state == UNDECIDED:
            word, bit = divmod(self.start_id, 32)
            value = (int(bitmask[row, word]) | (1 << bit)) & 0xFFFFFFFF
            bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value  # int32 words

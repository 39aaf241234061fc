"""Incremental detokenization and stop strings for one sequence."""
from __future__ import annotations

from typing import Any, Optional


def rust_decoder(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` under a transformers fast tokenizer whose ``decode`` adds
    nothing to it (no clean-up of tokenization spaces), else None.

    NOTE: transformers' ``decode`` converts and checks its arguments in Python around the Rust
    decode, and the detokenizer calls it twice a token for every sequence."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if getattr(tokenizer, "clean_up_tokenization_spaces", True) or not hasattr(backend, "decode_batch"):
        return None
    return backend


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas.

    Decodes a small window ``ids[prefix_offset:]`` each step and emits only the
    part past ``ids[prefix_offset:read_offset]``; a trailing U+FFFD means an
    incomplete UTF-8 sequence, so the delta waits for the next token.
    """

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 stop: Optional[list[str]] = None, include_stop_str_in_output: bool = False,
                 min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self._rust = rust_decoder(tokenizer)
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        # Seed the window with the prompt's tail so the first token's leading space decodes right.
        tail = list(prompt_ids[-6:])
        self.ids = tail
        self.prefix_offset = 0
        self.read_offset = len(tail)
        self.num_prompt_tail = len(tail)
        self.text = ""
        self.stop = stop or []
        self.include_stop = include_stop_str_in_output
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._emitted = 0  # characters of ``text`` already handed out
        # As vLLM: stop strings are looked for only once more than min_tokens tokens are out;
        # one may still begin in the text of the first ones.
        self.min_tokens = min_tokens
        self._num_tokens = 0

    def _decode(self, ids: list[int]) -> str:
        if self._rust is not None:
            return self._rust.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> Optional[str]:
        """Append a token; returns the stop string if the text now contains one."""
        self.ids.append(token_id)
        self._num_tokens += 1
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new = self._decode(self.ids[self.prefix_offset:])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            delta = new[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            start = max(len(self.text) - self._hold, 0)
            self.text += delta
            return self._find_stop(start) if self._num_tokens > self.min_tokens else None
        return None

    def _find_stop(self, start: int) -> Optional[str]:
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0:
                self.text = self.text[: i + len(s) if self.include_stop else i]
                return s
        return None

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, hold back what could start a stop string."""
        end = len(self.text) if finished or not self.stop else max(len(self.text) - self._hold, self._emitted)
        delta = self.text[self._emitted:end]
        self._emitted = end
        return delta

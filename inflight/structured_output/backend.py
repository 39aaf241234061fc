"""The grammar library behind structured output: xgrammar (chosen by measurement
on the CPU, see benchmarks/README.md). Compiles a request's constraint once and
gives each request its own matcher, which the model runner and the scheduler
drive through :class:`GrammarState`."""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

import torch
import xgrammar as xgr

from inflight.errors import InvalidRequestError
from inflight.structured_output.params import StructuredOutputsParams

_LOG_PREFIX = re.compile(r"^\[[\d:.]+\] \S+:\d+: ")  # xgrammar's "[time] file.cc:line: " before the message
MAX_ERROR_CHARS = 300
_DESCRIPTIONS = {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
                 "structural_tag": "structural tag",
                 "choice": "choice list", "grammar": "grammar"}


class GrammarBackend:
    """Compiles constraints for one tokenizer and vocabulary (the model's, which may
    be larger than the tokenizer's: the padding ids are never allowed)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        # The end of the grammar allows exactly the model's EOS ids, which end the request.
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(eos_token_ids) or None)
        # One compile thread each: compiles already run on their own pool, beside the step thread.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size

    def compile(self, p: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar; InvalidRequestError naming the problem if it cannot be."""
        kind = p.kind
        try:
            if kind == "json":
                schema = p.json if isinstance(p.json, str) else json.dumps(p.json)
                # NOTE: no free whitespace between tokens: a sampled model could pad a
                # value with blanks until max_tokens; the JSON is the same value.
                return self._compiler.compile_json_schema(schema, any_whitespace=False)
            if kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(p.regex)
            if kind == "choice":
                # EBNF string literals take JSON's escapes
                alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in p.choice)
                return self._compiler.compile_grammar(f"root ::= {alts}")
            if kind == "structural_tag":
                return self._structural_tag(p.structural_tag)
            if "::=" in p.grammar:
                return self._compiler.compile_grammar(p.grammar)
            return self._compiler.compile_lark(p.grammar)
        except Exception as e:  # xgrammar raises RuntimeError (and a few others) for a bad grammar
            raise InvalidRequestError(f"invalid {_DESCRIPTIONS[kind]}: {_message(e)}") from None

    def _structural_tag(self, text: str) -> xgr.CompiledGrammar:
        """xgrammar's structural tag, or the older begin/schema/end structures with triggers (vLLM takes both)."""
        tag = json.loads(text)
        if "structures" not in tag:
            return self._compiler.compile_structural_tag(text)
        items = [xgr.StructuralTagItem(begin=s["begin"], end=s["end"],
                                       schema=s["schema"] if isinstance(s["schema"], str) else json.dumps(s["schema"]))
                 for s in tag["structures"]]
        return self._compiler.compile_structural_tag(items, list(tag.get("triggers", [])))

    @staticmethod
    def new_state(compiled: xgr.CompiledGrammar) -> "GrammarState":
        return GrammarState(xgr.GrammarMatcher(compiled))


def _message(e: Exception) -> str:
    text = " ".join(_LOG_PREFIX.sub("", str(e)).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


class GrammarState:
    """One request's position in its grammar: advanced by each accepted token, asked
    for the next token's mask and for how many draft tokens the grammar allows.

    Output tokens are kept through preemption (recompute and swap alike), so the
    state stays the one of the request's output so far; it is dropped when the request finishes.
    """

    __slots__ = ("matcher",)

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    @property
    def is_terminated(self) -> bool:
        """True once the grammar ended with an EOS token."""
        return self.matcher.is_terminated()

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance by sampled tokens; False if one breaks the grammar. Tokens after the
        grammar's end (an ignore_eos request goes on) are not constrained."""
        for t in tokens:
            if self.matcher.is_terminated():
                return True
            if not self.matcher.accept_token(t):
                return False
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (draft tokens) the grammar accepts in a row; the state is unchanged."""
        n = 0
        for t in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def fill_rows(self, bitmask: torch.Tensor, row: int, drafts: Sequence[int]) -> None:
        """Write the masks of rows ``row`` .. ``row + len(drafts)``: the next token's,
        then the one after each draft. Rows after a draft the grammar rejects stay
        all-allowed: the verification rejects that draft, so they are never used."""
        accepted = 0
        for i in range(len(drafts) + 1):
            if self.matcher.is_terminated():
                break  # nothing left to constrain: the row stays all-allowed
            self.matcher.fill_next_token_bitmask(bitmask, row + i)
            if i == len(drafts) or not self.matcher.accept_token(drafts[i]):
                break
            accepted += 1
        if accepted:
            self.matcher.rollback(accepted)

"""Beam search as vLLM runs it: outside the engine, one round per generated token.

Each round asks the engine, for every live beam, for one token's top ``2 * beam_width``
raw logprobs: a request of ``max_tokens=1`` whose prompt is the beam. The prefix cache
keeps what earlier rounds computed, so a round recomputes only each beam's last partial
block. All beams' extensions are ranked by cumulative logprob; an EOS extension
finishes, the best ``beam_width`` others live on. ``LLM.beam_search`` runs the rounds
offline, the server's ``use_beam_search`` through the async engine.

Unlike vLLM, the search ends as soon as no live beam can still beat the ``beam_width``
finished ones (``BeamSearch.settled``) instead of always running ``max_tokens`` rounds;
the answer is the same.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Collection, Optional, Sequence, Union

from inflight.errors import InvalidRequestError
from inflight.outputs import Logprob, RequestOutput
from inflight.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One hypothesis (vLLM's): ``tokens`` include the prompt, and the EOS of a sequence
    that finished on one; ``logprobs`` holds each generated token's top logprobs."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class BeamSearchOutput:
    """A prompt's best sequences, best first (vLLM's ``BeamSearchOutput``)."""

    sequences: list[BeamSearchSequence]


def over_length(value: float, length: int, penalty: float) -> float:
    """``value / length ** penalty``, at its limit where a large ``|penalty|`` makes the power
    overflow (0) or round to 0 (an infinity of value's sign), instead of raising."""
    try:
        return value / (max(length, 1) ** penalty)
    except OverflowError:
        return value * 0.0
    except ZeroDivisionError:
        return math.copysign(math.inf, value) if value else 0.0


def beam_score(tokens: Sequence[int], cum_logprob: float, eos_token_ids: Collection[int],
               length_penalty: float) -> float:
    """vLLM's (and transformers') score: cumulative logprob over length ** length_penalty,
    the length counting the prompt but not a final EOS."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_token_ids else 0)
    return over_length(cum_logprob, length, length_penalty)


class BeamSearch:
    """One prompt's search: the live beams, the finished ones, and the rounds run.

    ``num_logprobs`` asks each round for more top logprobs than the search needs
    (a client's ``logprobs``); only the top ``2 * beam_width`` become candidates.
    """

    def __init__(self, prompt_token_ids: Sequence[int], params: BeamSearchParams,
                 eos_token_ids: Collection[int], num_logprobs: Optional[int] = None) -> None:
        self.params = params
        self.prompt_len = len(prompt_token_ids)
        self.eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_token_ids), [])]
        self.completed: list[BeamSearchSequence] = []
        self.rounds = 0
        self.num_logprobs_asked = num_logprobs
        self.num_logprobs = max(2 * params.beam_width, num_logprobs or 0)

    def score(self, seq: BeamSearchSequence) -> float:
        return beam_score(seq.tokens, seq.cum_logprob, self.eos, self.params.length_penalty)

    @property
    def done(self) -> bool:
        return not self.beams or self.rounds >= self.params.max_tokens or self.settled()

    def settled(self) -> bool:
        """True once ``beam_width`` finished sequences all score at least what any live
        beam's continuation could: logprobs are never positive, so a continuation's
        cumulative logprob is at most the beam's, and its score at most that over the
        longest length it may reach (length_penalty > 0) or its length now (<= 0)."""
        width, penalty = self.params.beam_width, self.params.length_penalty
        if len(self.completed) < width:
            return False
        worst_kept = sorted((self.score(s) for s in self.completed), reverse=True)[width - 1]
        longest = self.prompt_len + self.params.max_tokens
        best_live = max(over_length(b.cum_logprob, longest if penalty > 0 else len(b.tokens), penalty)
                        for b in self.beams)
        return worst_kept >= best_live

    def step_params(self) -> SamplingParams:
        """What each round's engine requests run with: one greedy token and its top logprobs."""
        return SamplingParams(temperature=0.0, max_tokens=1, logprobs=self.num_logprobs, ignore_eos=True,
                              skip_special_tokens=self.params.skip_special_tokens)

    def step_prompts(self) -> list[dict]:
        """One engine prompt per live beam, in ``self.beams`` order."""
        return [{"prompt_token_ids": list(b.tokens)} for b in self.beams]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Extend the beams from their round's outputs (one per beam, in order)."""
        width = self.params.beam_width
        candidates: list[BeamSearchSequence] = []
        for beam, out in zip(self.beams, outputs, strict=True):
            if out.error is not None:  # a round that failed would otherwise just drop its beam
                raise (InvalidRequestError if out.error_is_bad_input else RuntimeError)(
                    f"beam search round failed: {out.error}")
            entry = (out.outputs[0].logprobs or [{}])[0]
            for tok, lp in sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:2 * width]:
                seq = BeamSearchSequence(beam.tokens + [tok], beam.logprobs + [entry], beam.cum_logprob + lp.logprob)
                if tok in self.eos:
                    seq.finish_reason, seq.stop_reason = "stop", tok
                    self.completed.append(seq)
                else:
                    candidates.append(seq)
        # NOTE: a stable sort: among equal cumulative logprobs the earlier beam's extension wins.
        candidates.sort(key=lambda s: -s.cum_logprob)
        self.beams = candidates[:width]
        self.rounds += 1

    def best(self) -> list[BeamSearchSequence]:
        """The ``beam_width`` best of the finished and live sequences, best first; a live
        one finishes with ``length``."""
        ranked = sorted(self.completed + self.beams, key=self.score, reverse=True)[:self.params.beam_width]
        for seq in ranked:
            seq.finish_reason = seq.finish_reason or "length"
        return ranked

    def generated(self, seq: BeamSearchSequence) -> tuple[list[int], list[dict[int, Logprob]]]:
        """A sequence's generated tokens and their logprobs as an API answer shows them:
        a final EOS only with ``include_stop_str_in_output``."""
        tokens, logprobs = seq.tokens[self.prompt_len:], seq.logprobs
        if seq.finish_reason == "stop" and not self.params.include_stop_str_in_output:
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        return tokens, logprobs

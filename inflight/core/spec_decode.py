"""Speculative decoding by n-gram prompt lookup: draft tokens from a request's
own history, and the greedy rule that accepts them.

A request whose last ``n`` tokens occurred earlier in its prompt or output is
likely to continue as it did then (code, quotes, lists, and the loops a small
model falls into). The drafts ride along in the next step as extra query rows
of that request; the step computes the model's greedy token after every row, and
the drafts are kept up to the first one the model disagrees with, plus the
model's own token there. So a step yields 1 to ``k + 1`` tokens, each the
model's greedy choice: the output is the one plain greedy decoding gives (up to
floating-point rounding, as the verifying rows run through the prefill path).
"""
from __future__ import annotations

from array import array
from inflight.config import SpeculativeConfig
from inflight.core.request import Request


class NgramProposer:
    """Prompt lookup decoding (vLLM's ``method="ngram"``)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the
        longest suffix (``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens)
        seen before; [] when none recurs."""
        n_tokens = len(token_ids)
        if k <= 0 or n_tokens < 2:
            return []
        # NOTE: tokens as 4-byte words: bytes.rfind does the scan in C; a hit at an
        # offset that is not a multiple of 4 straddles tokens and is skipped.
        buf = array("I", token_ids).tobytes()
        for n in range(min(self.config.prompt_lookup_max, n_tokens - 1), self.config.prompt_lookup_min - 1, -1):
            pattern = buf[4 * (n_tokens - n):]
            end = 4 * (n_tokens - 1)  # the match must end before the last token: one token must follow
            while True:
                at = buf.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % 4 == 0:
                    start = at // 4 + n
                    return token_ids[start:start + k]
                end = at + len(pattern) - 1
        return []

    def propose_for(self, req: Request, max_model_len: int) -> list[int]:
        """Drafts for a request that just sampled; [] when it may not speculate."""
        if not can_speculate(req):
            return []
        # The step yields up to k + 1 tokens: stay within max_tokens and max_model_len.
        k = min(self.config.num_speculative_tokens, req.max_tokens - req.num_output_tokens - 1,
                max_model_len - req.num_tokens - 1)
        return self.propose(req.all_token_ids, k)


def can_speculate(req: Request) -> bool:
    """Plain greedy requests only: argmax of the raw logits at every draft position.

    Penalties and min_tokens depend on the tokens before each position, and
    logprobs are reported per step, so requests using them decode one token a step."""
    p = req.sampling_params
    return (p.greedy and not p.needs_penalties and p.logprobs is None
            and req.num_output_tokens >= p.min_tokens)


def accept_greedy(drafts: tuple[int, ...], targets: list[int]) -> list[int]:
    """Tokens a step yields: ``targets[i]`` is the model's greedy token after the
    request's last token (i = 0) and after draft i - 1; drafts count while they
    match, then the model's own token follows."""
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    return targets[:n + 1]


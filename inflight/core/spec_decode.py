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
from typing import Callable, Sequence

from inflight.config import SpeculativeConfig
from inflight.core.outputs import ScheduledRequest
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

    Penalties, bad words and min_tokens depend on the tokens before each position, and
    logprobs are reported per step, so requests using them decode one token a step."""
    p = req.sampling_params
    return (p.greedy and not p.needs_penalties and p.logprobs is None and not p.bad_words
            and req.num_output_tokens >= p.min_tokens)


def accept_greedy(drafts: tuple[int, ...], targets: list[int]) -> list[int]:
    """Tokens a step yields: ``targets[i]`` is the model's greedy token after the
    request's last token (i = 0) and after draft i - 1; drafts count while they
    match, then the model's own token follows."""
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    return targets[:n + 1]


class DraftPlanner:
    """The scheduler's side of speculative decoding: drafts are proposed after a
    request samples, get the token budget left after every decode and prefill
    chunk, and are counted for the metrics."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.proposer = NgramProposer(config)
        self.num_spec_drafts = 0  # request steps that verified drafts
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def propose(self, req: Request, num_running: int) -> list[int]:
        """Drafts for the request's next step, unless the batch is too large to gain from them."""
        limit = self.config.disable_by_batch_size
        if limit is not None and num_running >= limit:
            return []
        drafts = self.proposer.propose_for(req, self.max_model_len)
        if drafts and req.structured_output is not None:
            # drafts the grammar rejects could never be accepted: do not compute them
            drafts = drafts[:req.structured_output.validate_tokens(drafts)]
        return drafts

    def add_drafts(self, batch: list[ScheduledRequest], budget: int,
                   reserve: Callable[[Request, int], bool],
                   block_ids: Callable[[str], tuple[list[int], ...]]) -> None:
        """Add drafts to this step's decodes in ``batch``, in batch order, while the budget
        lasts; ``reserve(req, n)`` takes the KV slots for n tokens (False: no room).

        NOTE: drafts come last, after every prefill chunk: they are guesses, so they
        must not delay a prompt's first token. A request whose drafts would take a
        block from under the watermark decodes its one token."""
        for i, s in enumerate(batch):
            if budget <= 0:
                break
            req = s.request
            if not req.spec_token_ids or s.num_new_tokens != 1 or not s.samples:
                continue
            drafts = tuple(req.spec_token_ids[:budget])
            n = 1 + len(drafts)
            if not reserve(req, n):
                continue
            batch[i] = ScheduledRequest(req, n, block_ids(req.request_id), drafts)
            budget -= len(drafts)

    def count(self, drafts: Sequence[int], tokens: list[int]) -> None:
        """Count one request step's verified drafts and the accepted ones."""
        if drafts:
            self.num_spec_drafts += 1
            self.num_draft_tokens += len(drafts)
            self.num_accepted_tokens += len(tokens) - 1

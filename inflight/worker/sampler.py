"""Turns one step's logits into next tokens, following vLLM's V1 sampler.

Per step: logits -> float32 -> logit_bias -> min_tokens suppression -> repetition penalty ->
frequency/presence penalties -> greedy argmax, or temperature -> top-k ->
top-p -> min-p -> inverse-CDF sampling (one uniform draw per row). Logprobs come
from the raw logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from inflight.errors import InvalidRequestError
from inflight.sampling_params import SamplingParams
from inflight.structured_output.masks import GrammarBitmask
from inflight.worker.logit_bias import LogitBias

_NEG_INF = float("-inf")
NOTHING_TO_SAMPLE = ("no token is left to sample: the request's allowed_token_ids, bad_words, logit_bias and "
                     "structured output exclude every one, or its penalties made every logit infinite")


@dataclass
class SamplingRow:
    """One row of logits that samples a token this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far: penalties and min_tokens
    eos_token_ids: list[int]  # empty when ignore_eos
    generator: Optional[torch.Generator] = None  # set when params.seed is set


@dataclass
class SamplerOutput:
    """Tokens sampled this step and, when any row asked, their logprobs.

    ``logprobs[i]`` is ``[(sampled_id, logprob, rank)]`` followed by the top-N
    ``(id, logprob, rank)`` for N = ``params.logprobs``; it is ``[]`` for a row
    that did not ask while another row did.
    """

    sampled_token_ids: list[int]
    logprobs: Optional[list[list[tuple[int, float, int]]]] = None


def _padded(lists: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """[rows, longest] long tensor; ``pad`` (= vocab size) lands in a spare column."""
    width = max(1, max((len(x) for x in lists), default=0))
    data = [x + [pad] * (width - len(x)) for x in lists]
    return torch.tensor(data, dtype=torch.long, device=device)


def _in_vocab(ids: list[int], vocab_size: int) -> list[int]:
    # Tokenizer ids beyond the model's vocabulary cannot be sampled anyway.
    return [t for t in ids if 0 <= t < vocab_size]


@dataclass
class SamplingMetadata:
    """Batched per-step sampling tensors; a field is None when no row needs it.

    Tensors named per "random row" have one entry per non-greedy row, in the
    order of ``random_rows``; the others have one entry per row.
    """

    num_rows: int
    vocab_size: int
    greedy_only: bool  # fast path: argmax (over the tokens ``grammar`` allows, if set) and nothing else
    random_rows: Optional[torch.Tensor]  # [R] indices of non-greedy rows
    temperature: Optional[torch.Tensor]  # [R]
    top_k: Optional[torch.Tensor]  # [R]; 0 = off
    max_top_k: int
    top_p: Optional[torch.Tensor]  # [R]; inf = off
    min_p: Optional[torch.Tensor]  # [R]
    generators: list[Optional[torch.Generator]]  # [R]
    unseeded: Optional[torch.Tensor]  # positions within R drawing from the sampler's generator
    suppressed: Optional[torch.Tensor]  # [B, S] ids banned by min_tokens, padded
    repetition_penalty: Optional[torch.Tensor]  # [B]
    seen_tokens: Optional[torch.Tensor]  # [B, L] prompt + output ids, padded
    frequency_penalty: Optional[torch.Tensor]  # [B]
    presence_penalty: Optional[torch.Tensor]  # [B]
    output_tokens: Optional[torch.Tensor]  # [B, L] output ids, padded
    num_logprobs: Optional[list[Optional[int]]]  # None when no row asked
    max_num_logprobs: int
    grammar: Optional[GrammarBitmask] = None  # structured output's allowed tokens; set by the runner
    logit_bias: Optional[LogitBias] = None

    @classmethod
    def from_rows(cls, rows: list[SamplingRow], vocab_size: int,
                  device: torch.device) -> "SamplingMetadata":
        """Gather the rows' settings into batched tensors on ``device``."""
        V, f32 = vocab_size, torch.float32
        ps = [r.params for r in rows]
        banned = [_in_vocab(r.eos_token_ids + r.params.stop_token_ids, V)
                  if len(r.output_token_ids) < r.params.min_tokens else [] for r in rows]
        any_banned = any(banned)
        want_lp = any(p.logprobs is not None for p in ps)
        rand = [i for i, p in enumerate(ps) if not p.greedy]
        md = cls(num_rows=len(rows), vocab_size=V, greedy_only=False, random_rows=None,
                 temperature=None, top_k=None, max_top_k=0, top_p=None, min_p=None,
                 generators=[rows[i].generator for i in rand], unseeded=None,
                 suppressed=_padded(banned, V, device) if any_banned else None,
                 repetition_penalty=None, seen_tokens=None, frequency_penalty=None,
                 presence_penalty=None, output_tokens=None,
                 num_logprobs=[p.logprobs for p in ps] if want_lp else None,
                 max_num_logprobs=min(V, max((p.logprobs or 0 for p in ps), default=0)),
                 logit_bias=LogitBias.from_params(ps, device, V, [r.output_token_ids for r in rows]))
        if any(p.repetition_penalty != 1.0 for p in ps):
            md.repetition_penalty = torch.tensor([p.repetition_penalty for p in ps], dtype=f32, device=device)
            md.seen_tokens = _padded([_in_vocab(r.prompt_token_ids + r.output_token_ids, V)
                                      for r in rows], V, device)
        if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in ps):
            md.frequency_penalty = torch.tensor([p.frequency_penalty for p in ps], dtype=f32, device=device)
            md.presence_penalty = torch.tensor([p.presence_penalty for p in ps], dtype=f32, device=device)
            md.output_tokens = _padded([_in_vocab(r.output_token_ids, V) for r in rows], V, device)
        md.greedy_only = not (rand or any_banned or want_lp or md.seen_tokens is not None
                              or md.output_tokens is not None or md.logit_bias is not None)
        if rand:
            md._set_random_fields([ps[i] for i in rand], rand, device)
        return md

    def _set_random_fields(self, ps: list[SamplingParams], rand: list[int],
                           device: torch.device) -> None:
        V, f32 = self.vocab_size, torch.float32
        self.random_rows = torch.tensor(rand, dtype=torch.long, device=device)
        self.temperature = torch.tensor([p.temperature for p in ps], dtype=f32, device=device)
        ks = [p.top_k if 0 < p.top_k < V else 0 for p in ps]
        if any(ks):
            self.top_k = torch.tensor(ks, dtype=torch.long, device=device)
            self.max_top_k = max(ks)
        if any(p.top_p < 1.0 for p in ps):
            # inf rather than 1.0: float rounding may make the cumulative sum
            # reach 1.0 early and would drop tail tokens of rows without top-p.
            self.top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in ps],
                                      dtype=f32, device=device)
        if any(p.min_p > 0.0 for p in ps):
            self.min_p = torch.tensor([p.min_p for p in ps], dtype=f32, device=device)
        unseeded = [j for j, g in enumerate(self.generators) if g is None]
        if unseeded:
            self.unseeded = torch.tensor(unseeded, dtype=torch.long, device=device)


def _apply_penalties(x: torch.Tensor, md: SamplingMetadata) -> None:
    """min_tokens bans, repetition and frequency/presence penalties, in place."""
    B, V = x.shape
    if md.suppressed is not None:
        ban = torch.zeros(B, V + 1, dtype=torch.bool, device=x.device)
        ban.scatter_(1, md.suppressed, True)
        ban = ban[:, :V]
        # As vLLM: where the ban would leave nothing to sample (a grammar that has ended
        # allows only stop tokens), the stop tokens stay and the request ends there.
        leaves_some = (x > _NEG_INF).logical_and_(~ban).any(dim=1, keepdim=True)
        x.masked_fill_(ban.logical_and_(leaves_some), _NEG_INF)
    if md.seen_tokens is not None:
        seen = torch.zeros(B, V + 1, dtype=torch.bool, device=x.device)
        seen.scatter_(1, md.seen_tokens, True)
        pen = md.repetition_penalty.unsqueeze(1)
        x.copy_(torch.where(seen[:, :V], torch.where(x > 0, x / pen, x * pen), x))
    if md.output_tokens is not None:
        counts = torch.zeros(B, V + 1, dtype=x.dtype, device=x.device)
        counts.scatter_add_(1, md.output_tokens, torch.ones_like(md.output_tokens, dtype=x.dtype))
        counts = counts[:, :V]
        x.sub_(md.frequency_penalty.unsqueeze(1) * counts
               + md.presence_penalty.unsqueeze(1) * (counts > 0).to(x.dtype))


def _kth_largest(values_desc: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per-row threshold of top-k given values sorted descending; -inf where k is 0."""
    kth = values_desc.gather(1, (k - 1).clamp(min=0).unsqueeze(1))
    return kth.masked_fill_((k == 0).unsqueeze(1), _NEG_INF)


def _apply_top_k_top_p(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Mask logits outside each row's top-k then top-p set; ties at the k-th value stay."""
    if md.top_p is None:
        # top-k alone needs only the largest max_top_k values, not a full sort.
        kth = _kth_largest(x.topk(md.max_top_k, dim=-1).values, md.top_k)
        return x.masked_fill_(x < kth, _NEG_INF)
    s, idx = x.sort(dim=-1, descending=True)
    if md.top_k is not None:
        s.masked_fill_(s < _kth_largest(s, md.top_k), _NEG_INF)
    probs = s.softmax(dim=-1)
    # Mass strictly before each token; a token is kept while that is below
    # top_p, so the first token always survives and the set just reaches top_p.
    before = torch.cumsum(probs, dim=-1) - probs
    s.masked_fill_(before >= md.top_p.unsqueeze(1), _NEG_INF)
    return x.scatter_(1, idx, s)


def _uniform(n: int, gen: Optional[torch.Generator], device: torch.device) -> torch.Tensor:
    # Draw on the generator's own device so a CPU generator also serves CUDA logits.
    where = gen.device if gen is not None else device
    return torch.rand(n, generator=gen, device=where, dtype=torch.float64).to(device)


class _NothingToSample(Exception):
    """A row has no finite logit left: the sampler tells whose fault it is."""


class Sampler:
    """Samples one token per row of logits; see the module docstring for the order."""

    def __init__(self, generator: Optional[torch.Generator] = None) -> None:
        self.generator = generator  # for rows without a seed; None = torch's default

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        """Sample ``logits`` [num_rows, vocab] according to ``md``."""
        assert logits.shape == (md.num_rows, md.vocab_size), (logits.shape, md.num_rows, md.vocab_size)
        if md.greedy_only and md.grammar is None:
            # NOTE: argmax on bfloat16 CPU tensors is slower than a float32 copy + argmax.
            return SamplerOutput(logits.float().argmax(dim=-1).tolist(), None)
        x = logits.to(torch.float32, copy=True)  # copy: the raw logits feed logprobs
        if md.grammar is not None:
            md.grammar.apply(x)
        if md.logit_bias is not None:
            md.logit_bias.apply(x)  # before the penalties, as vLLM's logits processors
        _apply_penalties(x, md)
        try:
            tokens = self._tokens(x, md)
        except _NothingToSample:  # the request's own settings, unless the model gave NaN
            if bool(logits.isnan().any()):
                raise RuntimeError("the model's logits for this request are NaN") from None
            raise InvalidRequestError(NOTHING_TO_SAMPLE) from None
        logprobs = _logprobs(logits, tokens, md) if md.num_logprobs is not None else None
        return SamplerOutput(tokens.tolist(), logprobs)

    def _tokens(self, x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if len(md.generators) == md.num_rows:
            return self._sample(x, md)
        tokens = x.argmax(dim=-1)
        # NOTE: before any random draw, so a batch that fails here and is retried request
        # by request leaves the seeded rows' generators where they were.
        if not bool((x.gather(1, tokens.unsqueeze(1)) > _NEG_INF).all()):  # all -inf, or NaN
            raise _NothingToSample
        if md.random_rows is not None:
            tokens[md.random_rows] = self._sample(x[md.random_rows], md)
        return tokens

    def _sample(self, x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Sample the non-greedy rows ``x`` [R, vocab] (modified in place)."""
        x.div_(md.temperature.unsqueeze(1))
        if md.top_k is not None or md.top_p is not None:
            x = _apply_top_k_top_p(x, md)
        probs = x.softmax(dim=-1)
        if md.min_p is not None:
            top = probs.amax(dim=-1, keepdim=True)
            probs.masked_fill_(probs < md.min_p.unsqueeze(1) * top, 0.0)
        # NOTE: inverse-CDF sampling: one uniform per row picks the first token whose
        # cumulative probability exceeds it. An exponential race (argmax p / Exp(1))
        # needs a random draw per vocabulary entry, an order of magnitude slower on the
        # CPU at 49k entries a row. Filtered tokens have p = 0, so the
        # cumulative sum is flat there and they are never picked.
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1]
        if not bool((total > 0).all()):  # NaN: a row of -inf only, or of several +inf
            raise _NothingToSample
        # strictly below the total (in the cdf's own precision), so the search always
        # lands on a token with p > 0
        target = (self._draws(md, probs.shape[0], probs.device) * total.double()).to(cdf.dtype)
        target = torch.minimum(target, total.nextafter(torch.zeros_like(total)))
        idx = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
        return idx.clamp_(max=probs.shape[1] - 1)

    def _draws(self, md: SamplingMetadata, R: int, device: torch.device) -> torch.Tensor:
        """One uniform in [0, 1) per random row: seeded rows from their own generator
        (one draw per token, so a row's tokens do not depend on its batch)."""
        if md.unseeded is not None and len(md.unseeded) == R:
            return _uniform(R, self.generator, device)
        u = torch.empty(R, dtype=torch.float64, device=device)
        if md.unseeded is not None:
            u[md.unseeded] = _uniform(len(md.unseeded), self.generator, device)
        for j, gen in enumerate(md.generators):
            if gen is not None:
                u[j] = _uniform(1, gen, device)[0]
        return u


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor,
              md: SamplingMetadata) -> list[list[tuple[int, float, int]]]:
    """Sampled and top-N logprobs from the raw logits, as vLLM V1 reports by default."""
    lp = logits.to(torch.float32).log_softmax(dim=-1)
    tok_lp = lp.gather(1, tokens.unsqueeze(1))
    # vLLM's rank: how many tokens are at least as likely, so ties share the worse rank.
    ranks = (lp >= tok_lp).sum(dim=-1).tolist()
    tok_ids, tok_vals = tokens.tolist(), tok_lp.squeeze(1).tolist()
    top_vals: list[list[float]] = [[] for _ in tok_ids]
    top_ids: list[list[int]] = [[] for _ in tok_ids]
    if md.max_num_logprobs > 0:
        vals, ids = lp.topk(md.max_num_logprobs, dim=-1)
        top_vals, top_ids = vals.tolist(), ids.tolist()
    out: list[list[tuple[int, float, int]]] = []
    for i, n in enumerate(md.num_logprobs):
        if n is None:
            out.append([])
            continue
        row = [(tok_ids[i], tok_vals[i], ranks[i])]
        row += [(top_ids[i][r], top_vals[i][r], r + 1) for r in range(min(n, md.vocab_size))]
        out.append(row)
    return out

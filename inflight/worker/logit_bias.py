"""OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids`` and ``bad_words`` for a whole batch
of sampling rows at once.

Every row's (token id, bias) pairs go into two padded [rows, longest] tensors;
one ``scatter_add_`` adds them all to the float32 logits. Padding adds 0.0 to
token 0, which changes nothing (and leaves a banned -inf at -inf). The rows with
allowed ids get a mask from one ``scatter_`` (padding lands in a spare column),
and every other token of theirs goes to -inf. A bad word's last token goes to -inf in
the rows whose output ends with the word's other tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from inflight.sampling_params import SamplingParams


@dataclass
class LogitBias:
    """The batch's biases (``token_ids[i, j]`` gets ``values[i, j]`` added in row ``i``) and
    allowed ids (row ``allowed_rows[a]`` may sample only ``allowed_ids[a]``)."""

    token_ids: Optional[torch.Tensor]  # [B, L] long, padded with 0; None when no row has a bias
    values: Optional[torch.Tensor]  # [B, L] float32, padded with 0.0
    allowed_rows: Optional[torch.Tensor] = None  # [A] the rows with allowed_token_ids
    allowed_ids: Optional[torch.Tensor] = None  # [A, L] long, padded with the vocabulary size
    banned: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (rows, token ids) that bad words ban now

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device, vocab_size: int,
                    outputs: Optional[list[list[int]]] = None) -> Optional["LogitBias"]:
        """None when no row has a bias, allowed ids or a bad word to ban after its output
        (``outputs``, the rows' tokens so far) (the sampler then skips the step)."""
        biased = any(p.logit_bias for p in params)
        allowed = [i for i, p in enumerate(params) if p.allowed_token_ids]
        bans = [(i, t) for i, p in enumerate(params) if p.bad_words_token_ids and outputs is not None
                for t in _bad_word_bans(p.bad_words_token_ids, outputs[i]) if 0 <= t < vocab_size]
        if not (biased or allowed or bans):
            return None
        out = cls(None, None)
        if bans:
            rows, toks = zip(*bans)
            out.banned = (torch.tensor(rows, dtype=torch.long, device=device),
                          torch.tensor(toks, dtype=torch.long, device=device))
        if biased:
            width = max(len(p.logit_bias or ()) for p in params)
            ids = [[0] * width for _ in params]
            vals = [[0.0] * width for _ in params]
            for i, p in enumerate(params):
                for j, (t, v) in enumerate((p.logit_bias or {}).items()):
                    ids[i][j], vals[i][j] = t, float(v)
            out.token_ids = torch.tensor(ids, dtype=torch.long, device=device)
            out.values = torch.tensor(vals, dtype=torch.float32, device=device)
        if allowed:
            lists = [params[i].allowed_token_ids for i in allowed]
            width = max(len(ids) for ids in lists)
            out.allowed_rows = torch.tensor(allowed, dtype=torch.long, device=device)
            out.allowed_ids = torch.tensor([ids + [vocab_size] * (width - len(ids)) for ids in lists],
                                           dtype=torch.long, device=device)
        return out

    def apply(self, logits: torch.Tensor) -> None:
        """Mask the tokens outside each row's allowed ids and those bad words ban, then add
        the biases; float32 ``logits`` [B, vocab], in place."""
        if self.allowed_rows is not None:
            V = logits.shape[1]
            keep = torch.zeros(len(self.allowed_rows), V + 1, dtype=torch.bool, device=logits.device)
            keep.scatter_(1, self.allowed_ids, True)
            logits[self.allowed_rows] = logits[self.allowed_rows].masked_fill_(~keep[:, :V], float("-inf"))
        if self.banned is not None:
            logits[self.banned] = float("-inf")
        if self.token_ids is not None:
            logits.scatter_add_(1, self.token_ids, self.values)


def _bad_word_bans(words: list[list[int]], output: list[int]) -> list[int]:
    """The last token of each bad word whose other tokens end ``output`` (a one-token word: always)."""
    n = len(output)
    return [w[-1] for w in words if len(w) - 1 <= n and list(output[n - len(w) + 1:]) == w[:-1]]

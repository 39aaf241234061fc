"""OpenAI's ``logit_bias`` for a whole batch of sampling rows at once.

Every row's (token id, bias) pairs go into two padded [rows, longest] tensors;
one ``scatter_add_`` adds them all to the float32 logits. Padding adds 0.0 to
token 0, which changes nothing (and leaves a banned -inf at -inf).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from inflight.sampling_params import SamplingParams


@dataclass
class LogitBias:
    """The batch's biases: ``token_ids[i, j]`` gets ``values[i, j]`` added in row ``i``."""

    token_ids: torch.Tensor  # [B, L] long, padded with 0
    values: torch.Tensor  # [B, L] float32, padded with 0.0

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device) -> Optional["LogitBias"]:
        """None when no row has a bias (the sampler then skips the step)."""
        if not any(p.logit_bias for p in params):
            return None
        width = max(len(p.logit_bias or ()) for p in params)
        ids = [[0] * width for _ in params]
        vals = [[0.0] * width for _ in params]
        for i, p in enumerate(params):
            for j, (t, v) in enumerate((p.logit_bias or {}).items()):
                ids[i][j], vals[i][j] = t, float(v)
        return cls(torch.tensor(ids, dtype=torch.long, device=device),
                   torch.tensor(vals, dtype=torch.float32, device=device))

    def apply(self, logits: torch.Tensor) -> None:
        """Add the biases to float32 ``logits`` [B, vocab], in place."""
        logits.scatter_add_(1, self.token_ids, self.values)

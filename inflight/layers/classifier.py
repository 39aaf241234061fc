"""The heads of sequence-classification checkpoints: a decoder's ``score`` projection (hidden ->
labels, no bias) and an encoder's (dense, tanh, out_proj, with biases: RoBERTa's ``classifier``,
BERT's pooler and ``classifier``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ClassifierHead(nn.Module):
    """Applied by the pooler to a few pooled rows, in float32. Not an ``nn.Linear``, so the
    platform's packing leaves it alone (a GEMM panel for a handful of labels would not pay)."""

    def __init__(self, hidden_size: int, num_labels: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_labels, hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_labels), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(torch.float32)
        return F.linear(x.to(torch.float32), self.weight.to(torch.float32), bias)


class EncoderClassificationHead(nn.Module):
    """An encoder cross-encoder's head over the first token's hidden state: dense, tanh,
    out_proj. RoBERTa's (bge-reranker) has these names; BERT's next-sentence pooler and
    classifier (ms-marco) are the same two projections under other names, which the model maps
    here. Not linear, so it is for CLS pooling only (the pooler applies it to one row per request)."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.dense = ClassifierHead(hidden_size, hidden_size, bias=True)
        self.out_proj = ClassifierHead(hidden_size, num_labels, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(x)))

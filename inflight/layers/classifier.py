"""The ``score`` projection of a sequence-classification checkpoint (hidden -> labels, no bias)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ClassifierHead(nn.Module):
    """Applied by the pooler to a few pooled rows, in float32. Not an ``nn.Linear``, so the
    platform's packing leaves it alone (a GEMM panel for a handful of labels would not pay)."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_labels, hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.float32), self.weight.to(torch.float32))

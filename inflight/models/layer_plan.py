"""What a decoder-only model exports for a fused layer loop: its dimensions and,
per layer, the weights in the order one layer uses them. A kernel that runs the
whole stack reads this plan, never the model's module internals."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn


class DecoderLayerPlan(NamedTuple):
    """One pre-norm decoder layer: norm -> qkv -> attention -> o -> norm -> gate_up -> SiLU*up -> down."""

    input_norm: torch.Tensor
    qkv_proj: nn.Module
    o_proj: nn.Module
    post_norm: torch.Tensor
    gate_up_proj: nn.Module
    down_proj: nn.Module
    attention: nn.Module  # holds the attention backend
    q_norm: Optional[torch.Tensor] = None  # per-head RMSNorm weights of q and k before RoPE (Qwen3)
    k_norm: Optional[torch.Tensor] = None


class LayerPlan(NamedTuple):
    """A Llama-shaped decoder stack."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    scale: float
    layers: list[DecoderLayerPlan]
    qkv_bias: Optional[bool] = None

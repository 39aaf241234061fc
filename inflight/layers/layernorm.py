"""RMSNorm with the residual add fused in (vLLM's ``fused_add_rms_norm``), and LayerNorm with the same call."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from inflight.kernels.cpu.ops import cpu_fused_ops
from inflight.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    """RMSNorm computed in float32, as transformers does, then cast back; adds the
    residual first when given one."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward_native(self, x: torch.Tensor,
                       residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype), x

    def forward_cpu(self, x: torch.Tensor,
                    residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``forward_native``; NOTE: the C kernel writes x + residual into ``residual``."""
        ops = cpu_fused_ops(x.dtype)
        if ops is None:
            return self.forward_native(x, residual)
        return ops.add_rmsnorm(x, residual, self.weight, self.eps)


class GemmaRMSNorm(CustomOp):
    """Gemma's RMSNorm: the weight is stored as an offset from one and the product is taken
    in float32 before the cast back (transformers' Gemma2RMSNorm / Gemma3RMSNorm); adds the
    residual first when given one."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward_native(self, x: torch.Tensor,
                       residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype), x

    def forward_cpu(self, x: torch.Tensor,
                    residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``forward_native``; float32 through the C kernel (the product is then the same),
        other dtypes natively. NOTE: the C kernel writes x + residual into ``residual``."""
        ops = cpu_fused_ops(x.dtype)
        if ops is None or x.dtype != torch.float32:
            return self.forward_native(x, residual)
        return ops.add_rmsnorm(x, residual, 1.0 + self.weight, self.eps)


class QKNorm(CustomOp):
    """Per-head norms of the q and k heads of fused qkv rows ``[T, (nh + 2 nkv) * hd]`` before
    RoPE (Qwen3's; Gemma 3's); v passes through. The norms (over ``hd``) stay the attention
    module's, so their checkpoint names are unchanged; they come in with each call."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = num_heads, num_kv_heads, head_dim

    def forward_native(self, qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module) -> torch.Tensor:
        """The normalised rows, a new tensor."""
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q_norm(q.reshape(-1, self.nh, self.hd))[0].view(q.shape)
        k = k_norm(k.reshape(-1, self.nkv, self.hd))[0].view(k.shape)
        return torch.cat([q, k, v], dim=-1)

    def forward_cpu(self, qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module) -> torch.Tensor:
        """As ``forward_native``, in place in ``qkv`` for plain RMSNorms (one C call; each head
        exactly as ``RMSNorm.forward_cpu`` normalises it); other norms (Gemma's) natively."""
        ops = cpu_fused_ops(qkv.dtype)
        if ops is None or not _plain_norms(qkv, q_norm, k_norm) or qkv.dim() != 2 or qkv.stride(-1) != 1:
            return self.forward_native(qkv, q_norm, k_norm)
        ops.rmsnorm_heads_(qkv, self.nh, self.nkv, self.hd, q_norm.weight, k_norm.weight, q_norm.eps)
        return qkv


def _plain_norms(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module) -> bool:
    """Both norms are RMSNorms of qkv's dtype with one eps: what rmsnorm_heads_* computes."""
    return (type(q_norm) is RMSNorm and type(k_norm) is RMSNorm and q_norm.eps == k_norm.eps
            and q_norm.weight.dtype == qkv.dtype == k_norm.weight.dtype)


class LayerNorm(CustomOp):
    """LayerNorm, with a bias (StableLM) or without (Cohere), computed in float32 and cast
    back; adds the residual first when given one, with RMSNorm's (normed, sum) return."""

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward_native(self, x: torch.Tensor,
                       residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        bias = None if self.bias is None else self.bias.float()
        out = torch.nn.functional.layer_norm(x.float(), x.shape[-1:], self.weight.float(), bias, self.eps)
        return out.to(x.dtype), x

    def forward_cpu(self, x: torch.Tensor,
                    residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``forward_native``; bf16 with a bias through one C pass (the sum, the row's mean
        and variance, the affine map), other cases natively. NOTE: the C kernel writes
        x + residual into ``residual``."""
        ops = cpu_fused_ops(x.dtype)
        if ops is None or x.dtype != torch.bfloat16 or self.bias is None or self.weight.dtype != torch.bfloat16:
            return self.forward_native(x, residual)
        return ops.add_layernorm_bf16(x, residual, self.weight, self.bias, self.eps)

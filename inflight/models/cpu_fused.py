"""Fused element-wise ops of a Llama layer for bfloat16 on the CPU (csrc/fused_ops.c).

A decode step runs about thirty small torch ops per layer (RMSNorm's float32
round trip, RoPE's rotate-half, SiLU times up, the residual adds); at the batch
sizes of a CPU server their dispatch costs as much as their arithmetic. Each op
here does one such chain in one pass, rounding to bf16 where torch does.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Optional

import torch
from torch import nn

from inflight.attention.cpu_kernels import load_library, ptr

logger = logging.getLogger(__name__)


class CpuFusedOps:
    """ctypes front of the fused kernels; every tensor is bf16 and row-contiguous."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def add_rmsnorm(self, x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(x + residual) * weight, x + residual); the sum is written into ``residual``."""
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.numel() // x.shape[-1], x.shape[-1]
        self.lib.add_rmsnorm_bf16(ptr(x), ptr(residual if residual is not None else x), ptr(weight), ptr(out),
                                  ctypes.c_int64(rows), ctypes.c_int64(dim), ctypes.c_float(eps),
                                  ctypes.c_int(residual is not None))
        return out, (residual if residual is not None else x)

    def rope_(self, qkv: torch.Tensor, nh: int, nkv: int, d: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate the q and k heads of the fused qkv rows in place; cos/sin: [T, 1, d] bf16."""
        self.lib.rope_bf16(ptr(qkv), ctypes.c_int64(qkv.shape[0]), ctypes.c_int64(qkv.stride(0)), ctypes.c_int(nh),
                           ctypes.c_int(nkv), ctypes.c_int(d), ptr(cos.contiguous()), ptr(sin.contiguous()))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for rows [gate | up]."""
        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        out = gate_up.new_empty(*gate_up.shape[:-1], inter)
        self.lib.silu_mul_bf16(ptr(gate_up), ptr(out), ctypes.c_int64(gate_up.numel() // gate_up.shape[-1]),
                               ctypes.c_int64(inter))
        return out


def load_fused_ops() -> Optional[CpuFusedOps]:
    lib = load_library("fused_ops")
    return None if lib is None else CpuFusedOps(lib)


def enable_fused_ops(model: nn.Module, ops: CpuFusedOps) -> int:
    """Hand ``ops`` to every module with a ``fused`` slot (RMSNorm, attention, MLP); returns how many."""
    count = 0
    for module in model.modules():
        if hasattr(module, "fused"):
            module.fused = ops
            count += 1
    logger.info("fused CPU element-wise ops in %d modules", count)
    return count

"""The CPU kernels as the model's ops see them: one cached handle per kernel family,
None where the kernel cannot run for a dtype (the op then runs plain torch)."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from inflight.kernels.cpu.encoder_attention import CpuEncoderAttention, load_encoder_attention
from inflight.kernels.cpu.fused import CpuFusedOps, load_fused_ops

# The symbol that must exist in the fused-ops library for each dtype.
_FUSED_SYMBOL = {torch.bfloat16: "add_rmsnorm_bf16", torch.float32: "add_rmsnorm_f32"}


@functools.lru_cache(maxsize=None)
def _fused() -> Optional[CpuFusedOps]:
    return load_fused_ops()


def cpu_fused_ops(dtype: torch.dtype) -> Optional[CpuFusedOps]:
    """The fused element-wise kernels (RMSNorm, RoPE, SiLU-times-up) for ``dtype``, or None."""
    ops = _fused()
    symbol = _FUSED_SYMBOL.get(dtype)
    if ops is None or symbol is None or not hasattr(ops.lib, symbol):
        return None
    return ops


@functools.lru_cache(maxsize=None)
def cpu_encoder_attention() -> Optional[CpuEncoderAttention]:
    """The encoder-attention kernel (both ways over each request's rows, bfloat16), or None."""
    return load_encoder_attention()

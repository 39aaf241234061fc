"""Fused element-wise ops of a Llama layer on the CPU (csrc/fused_ops.c), bfloat16 and float32.

A decode step runs about thirty small torch ops per layer (RMSNorm's float32
round trip, RoPE's rotate-half, SiLU times up, the residual adds); at the batch
sizes of a CPU server their dispatch costs as much as their arithmetic. Each op
here does one such chain in one pass, rounding to bf16 where torch does. Each method
dispatches on the tensor dtype: bf16 to the ``*_bf16`` kernels (AVX-512-BF16 or scalar),
float32 to the ``*_f32`` ones (vec.h: every ISA level).
"""
from __future__ import annotations

import ctypes
import logging
from typing import Optional

import torch
from torch import nn

from inflight.kernels.cpu.build import load_library

logger = logging.getLogger(__name__)


_i32, _i64, _f32, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


class CpuFusedOps:
    """ctypes front of the fused kernels; the tensors of a call share one dtype (bf16 or
    float32) and are row-contiguous."""

    dtypes = tuple(_SUFFIX)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        # Declared argument types: the ~90 calls a step pass plain ints, no wrapper objects.
        self._add_rmsnorm, self._rmsnorm_heads, self._rope, self._silu_mul = {}, {}, {}, {}
        self._add_layernorm_bf16 = fn = lib.add_layernorm_bf16  # BERT's post-norm (bf16 only)
        fn.argtypes = [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32, _i32]
        for dtype, sfx in _SUFFIX.items():
            self._add_rmsnorm[dtype] = fn = getattr(lib, f"add_rmsnorm_{sfx}")
            fn.argtypes = [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32, _i32]
            self._rmsnorm_heads[dtype] = fn = getattr(lib, f"rmsnorm_heads_{sfx}")
            fn.argtypes = [_ptr, _i64, _i64, _i32, _i32, _i32, _ptr, _ptr, _f32]
            self._rope[dtype] = fn = getattr(lib, f"rope_{sfx}")
            fn.argtypes = [_ptr, _i64, _i64, _i32, _i32, _i32, _ptr, _ptr]
            self._silu_mul[dtype] = fn = getattr(lib, f"silu_mul_{sfx}")
            fn.argtypes = [_ptr, _ptr, _i64, _i64]

    def add_rmsnorm(self, x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(x + residual) * weight, x + residual); the sum is written into ``residual``."""
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.numel() // x.shape[-1], x.shape[-1]
        self._add_rmsnorm[x.dtype](x.data_ptr(), (residual if residual is not None else x).data_ptr(),
                                   weight.data_ptr(), out.data_ptr(), rows, dim, eps, residual is not None)
        return out, (residual if residual is not None else x)

    def add_layernorm_bf16(self, x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                           bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(layernorm(x + residual) * weight + bias, x + residual) for bf16 rows; the sum is
        written into ``residual``."""
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.numel() // x.shape[-1], x.shape[-1]
        self._add_layernorm_bf16(x.data_ptr(), (residual if residual is not None else x).data_ptr(),
                                 weight.data_ptr(), bias.data_ptr(), out.data_ptr(), rows, dim, eps,
                                 residual is not None)
        return out, (residual if residual is not None else x)

    def rmsnorm_heads_(self, qkv: torch.Tensor, nh: int, nkv: int, d: int, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, eps: float) -> None:
        """RMS-normalise each q head (weight ``q_weight`` [d]) and k head (``k_weight``) of the fused
        qkv rows in place, v untouched; each head exactly as ``add_rmsnorm`` of that head alone."""
        qw, kw = q_weight.contiguous(), k_weight.contiguous()  # alive until the call returns
        self._rmsnorm_heads[qkv.dtype](qkv.data_ptr(), qkv.shape[0], qkv.stride(0), nh, nkv, d, qw.data_ptr(),
                                       kw.data_ptr(), eps)

    def rope_(self, qkv: torch.Tensor, nh: int, nkv: int, d: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate the q and k heads of the fused qkv rows in place; cos/sin: [T, 1, d] of qkv's dtype."""
        # NOTE: the contiguous copies are held by name until the call returns
        cos, sin = cos.contiguous(), sin.contiguous()
        self._rope[qkv.dtype](qkv.data_ptr(), qkv.shape[0], qkv.stride(0), nh, nkv, d, cos.data_ptr(), sin.data_ptr())

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for rows [gate | up]."""
        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        out = gate_up.new_empty(*gate_up.shape[:-1], inter)
        self._silu_mul[gate_up.dtype](gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // gate_up.shape[-1],
                                      inter)
        return out


def load_fused_ops(level=None) -> Optional[CpuFusedOps]:
    """The fused ops built for ``level`` (an isa.IsaLevel; the CPU's by default)."""
    lib = load_library("fused_ops", level)
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

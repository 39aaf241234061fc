"""bf16 linears through our own AVX-512-BF16 kernel (csrc/gemm_bf16.c).

Each weight is packed once into panels of 32 output columns, K pairs interleaved:
the operand layout of the bf16 dot-product instruction, so a decode step streams
every weight byte once at close to DRAM speed and a prefill step keeps a panel in
L2 for all its rows (measured against oneDNN's prepacked linear by
``benchmarks/linear_kernels.py``; figures in benchmarks/README.md).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch
from torch import nn

from inflight.kernels.cpu.build import load_library

_c_i64, _c_ptr = ctypes.c_int64, ctypes.c_void_p


@functools.lru_cache(maxsize=None)
def load_gemm() -> Optional[ctypes.CDLL]:
    """The kernel library when this CPU and compiler can run it, else None."""
    lib = load_library("gemm_bf16")
    if lib is None or not lib.gemm_bf16_supported():
        return None
    lib.gemm_bf16.argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_ptr, _c_i64]
    lib.gemm_bf16.restype = ctypes.c_int
    lib.gemm_bf16_silu.argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_i64]
    lib.gemm_bf16_silu.restype = ctypes.c_int
    lib.gemm_bf16_argmax.argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr]
    lib.gemm_bf16_argmax.restype = ctypes.c_int
    return lib


def pack_panels(weight: torch.Tensor, panel: int) -> torch.Tensor:
    """[N, K] -> [ceil(N/panel), ceil(K/2), panel, 2], zero-padded: each K pair of a
    panel's columns is one contiguous vector."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // panel) * panel, k + k % 2
    w = torch.zeros(n_pad, k_pad, dtype=torch.bfloat16)
    w[:n, :k] = weight.detach()
    return w.view(n_pad // panel, panel, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()


class PanelLinear(nn.Module):
    """Drop-in for a bf16 ``nn.Linear`` on the CPU, holding the weight packed in panels."""

    packed_dtype = torch.bfloat16  # what the C layer loop checks before it takes the weights

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.lib = load_gemm()
        if self.lib is None:
            raise RuntimeError("the bf16 GEMM kernel is not available on this machine")
        self.out_features, self.in_features = weight.shape
        self.panel = self.lib.gemm_bf16_panel()
        self.register_buffer("packed", pack_panels(weight, self.panel), persistent=False)
        b = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.register_buffer("bias", b, persistent=False)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as [M, in] bf16 rows with unit column stride (the kernels take a row stride)."""
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.bfloat16:
            raise TypeError(f"PanelLinear takes bfloat16 input, got {x2.dtype}")
        return x2 if x2.stride(-1) == 1 else x2.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = self._rows(x)
        out = torch.empty(x2.shape[0], self.out_features, dtype=torch.bfloat16)
        rc = self.lib.gemm_bf16(x2.data_ptr(), x2.shape[0], self.in_features, x2.stride(0), self.packed.data_ptr(),
                                self.out_features, None if self.bias is None else self.bias.data_ptr(),
                                out.data_ptr(), self.out_features)
        if rc != 0:
            raise RuntimeError(f"gemm_bf16 failed ({rc})")
        return out.view(*lead, self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this gate_up projection's output [gate | up], without
        materializing it: bit-identical to ``silu_mul`` (cpu_fused.py) of ``self(x)``."""
        x2 = self._rows(x)
        inter = self.out_features // 2
        out = torch.empty(x2.shape[0], inter, dtype=torch.bfloat16)
        rc = self.lib.gemm_bf16_silu(x2.data_ptr(), x2.shape[0], self.in_features, x2.stride(0),
                                     self.packed.data_ptr(), self.out_features, out.data_ptr(), inter)
        if rc != 0:
            raise RuntimeError(f"gemm_bf16_silu failed ({rc})")
        return out.view(*x.shape[:-1], inter)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """Per row of ``x`` [M, in], the index of the largest output, as
        ``self(x).float().argmax(-1)`` gives it (first index on ties), without writing
        the outputs: greedy sampling from the logits projection. No bias."""
        if self.bias is not None:
            raise ValueError("argmax of a projection with a bias")
        x2 = self._rows(x)
        tokens = torch.empty(x2.shape[0], dtype=torch.int64)
        rc = self.lib.gemm_bf16_argmax(x2.data_ptr(), x2.shape[0], self.in_features, x2.stride(0),
                                       self.packed.data_ptr(), self.out_features, tokens.data_ptr())
        if rc != 0:
            raise RuntimeError(f"gemm_bf16_argmax failed ({rc})")
        return tokens

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=panels"

"""bf16 linears through our own panel GEMM (csrc/gemm_bf16.c), on every ISA level: the
bf16 dot product at avx512_bf16, bf16 widened to fp32 in registers with fp32 FMAs at
every other level (avx512, avx2, neon, scalar).

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

from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import IsaLevel
from inflight.kernels.cpu.panel_linear import PanelLinearBase, bind


@functools.lru_cache(maxsize=None)
def load_gemm(level: Optional[IsaLevel] = None) -> Optional[ctypes.CDLL]:
    """The kernel library built for ``level`` (default: this CPU's, or
    ``INFLIGHT_CPU_ISA``) when this CPU and compiler can run it, else None."""
    lib = load_library("gemm_bf16", level)
    if lib is None or not lib.gemm_bf16_supported():
        return None
    return bind(lib, "gemm_bf16")


def pack_panels(weight: torch.Tensor, panel: int) -> torch.Tensor:
    """[N, K] -> [ceil(N/panel), ceil(K/2), panel, 2], zero-padded: each K pair of a
    panel's columns is one contiguous vector."""
    n, k = weight.shape
    if n % panel == 0 and k % 2 == 0:  # one pass into the result: no padded copy, no second buffer
        out = torch.empty(n // panel, k // 2, panel, 2, dtype=torch.bfloat16)
        return out.copy_(weight.detach().reshape(n // panel, panel, k // 2, 2).permute(0, 2, 1, 3))
    n_pad, k_pad = -(-n // panel) * panel, k + k % 2
    w = torch.zeros(n_pad, k_pad, dtype=torch.bfloat16)
    w[:n, :k] = weight.detach()
    return w.view(n_pad // panel, panel, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()


class PanelLinear(PanelLinearBase):
    """Drop-in for a bf16 ``nn.Linear`` on the CPU, holding the weight packed in panels:
    ``forward``, ``silu_mul`` (gate_up projections: bit-identical to ``silu_mul`` of
    fused.py applied to ``self(x)``) and ``argmax`` (logits)."""

    kernel = "gemm_bf16"
    packed_dtype = torch.bfloat16
    load = staticmethod(load_gemm)

    @staticmethod
    def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
        return pack_panels(weight, panel)

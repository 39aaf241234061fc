"""fp32 linears through our own panel GEMM (csrc/gemm_f32.c), built for every vector
ISA level from one source.

Each weight is packed once into panels of NR output columns (NR per ISA level:
``gemm_f32_panel()``), K-major inside a panel: a register-blocked microkernel reads
NR contiguous floats per k. A decode step streams every weight byte once; a prefill
step keeps a chunk of a panel in L1 while a block of rows passes over it. A row's
result does not depend on the batch it is in (same sums, same order at any M).
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
def load_gemm_f32(level: Optional[IsaLevel] = None) -> Optional[ctypes.CDLL]:
    """The kernel library built for ``level`` (default: this CPU's, or
    ``INFLIGHT_CPU_ISA``), None where it cannot be built."""
    lib = load_library("gemm_f32", level)
    if lib is None:
        return None
    lib.gemm_f32_isa.restype = ctypes.c_char_p
    return bind(lib, "gemm_f32")


def pack_panels_f32(weight: torch.Tensor, panel: int) -> torch.Tensor:
    """[N, K] -> [ceil(N/panel), K, panel] fp32, zero-padded past N: for each k, a
    panel's columns are contiguous."""
    n, k = weight.shape
    if n % panel == 0:  # one pass into the result: no padded copy, no second buffer
        out = torch.empty(n // panel, k, panel, dtype=torch.float32)
        return out.copy_(weight.reshape(n // panel, panel, k).transpose(1, 2))
    n_pad = -(-n // panel) * panel
    w = torch.zeros(n_pad, k, dtype=torch.float32)
    w[:n] = weight
    return w.view(n_pad // panel, panel, k).transpose(1, 2).contiguous()


class PanelLinearF32(PanelLinearBase):
    """Drop-in for an fp32 ``nn.Linear`` on the CPU, holding the weight packed in
    panels: ``forward``, ``silu_mul`` (gate_up projections) and ``argmax`` (logits).
    ``level`` picks the ISA build (tests run every one the CPU has)."""

    kernel = "gemm_f32"
    packed_dtype = torch.float32
    load = staticmethod(load_gemm_f32)

    @staticmethod
    def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
        return pack_panels_f32(weight, panel)

    @property
    def isa(self) -> str:
        return self.lib.gemm_f32_isa().decode()

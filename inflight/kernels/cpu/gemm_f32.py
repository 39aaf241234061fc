"""fp32 linears through our own panel GEMM (csrc/gemm_f32.c), built for every vector
ISA level from one source.

Each weight is packed once into panels of NR output columns (NR per ISA level:
``gemm_f32_panel()``), K-major inside a panel: a register-blocked microkernel reads
NR contiguous floats per k. A decode step streams every weight byte once; a prefill
step keeps a chunk of a panel in L1 while a block of rows passes over it. A row's
result does not depend on the batch it is in (same sums, same order at any M).

A weight that is 4-bit underneath (a GGUF Q4_0 / Q4_1 tensor) also gets 4-bit panels
(panel_q4.py): calls of up to ``Q4_MAX_ROWS`` rows read those, with the same results.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import IsaLevel
from inflight.kernels.cpu.panel_linear import PanelLinearBase, bind
from inflight.kernels.cpu.panel_q4 import Q4_MAX_ROWS, pack_panels_q4

_c_i64, _c_ptr = ctypes.c_int64, ctypes.c_void_p


@functools.lru_cache(maxsize=None)
def load_gemm_f32(level: Optional[IsaLevel] = None) -> Optional[ctypes.CDLL]:
    """The kernel library built for ``level`` (default: this CPU's, or
    ``INFLIGHT_CPU_ISA``), None where it cannot be built."""
    lib = load_library("gemm_f32", level)
    if lib is None:
        return None
    lib.gemm_f32_isa.restype = ctypes.c_char_p
    lib.gemm_f32_q4.argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_ptr, _c_i64]
    lib.gemm_f32_q4_silu.argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_i64]
    lib.gemm_f32_q4_dequant.argtypes = [_c_ptr, _c_i64, _c_i64, _c_ptr]
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
    ``level`` picks the ISA build (tests run every one the CPU has). ``q4=False`` keeps
    a 4-bit weight in fp32 panels only."""

    kernel = "gemm_f32"
    packed_dtype = torch.float32
    load = staticmethod(load_gemm_f32)

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], level: Optional[IsaLevel] = None,
                 q4: bool = True) -> None:
        super().__init__(weight, bias, level)
        q = pack_panels_q4(weight.detach(), self.packed, self.panel, self.lib) if q4 else None
        self.register_buffer("q4", q, persistent=False)

    def _call(self, suffix: str, *args) -> int:
        # args: x, M, K, lda, packed, ...: a few rows read the 4-bit panels instead
        if self.q4 is not None and suffix in ("", "_silu") and args[1] <= Q4_MAX_ROWS:
            return getattr(self.lib, f"gemm_f32_q4{suffix}")(*args[:4], self.q4.data_ptr(), *args[5:])
        return super()._call(suffix, *args)

    @staticmethod
    def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
        return pack_panels_f32(weight, panel)

    @property
    def isa(self) -> str:
        return self.lib.gemm_f32_isa().decode()

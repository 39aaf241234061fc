"""fp32 linears through our own panel GEMM (csrc/gemm_f32.c), built for every vector
ISA level from one source.

Each weight is packed once into panels of NR output columns (NR per ISA level:
``gemm_f32_panel()``), K-major inside a panel: a register-blocked microkernel reads
NR contiguous floats per k. A decode step streams every weight byte once; a prefill
step keeps a chunk of a panel in L1 while a block of rows passes over it. A row's
result does not depend on the batch it is in (same sums, same order at any M).

A weight that is low-bit underneath (a GGUF Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 or K-quant tensor) also gets
low-bit panels (panel_lowbit.py): calls of up to ``lowbit_max_rows`` rows read those,
with the same results (the limit is measured per machine: lowbit_rows.py).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import IsaLevel
from inflight.kernels.cpu.panel_linear import PanelLinearBase, bind
from inflight.kernels.cpu.panel_lowbit import LOWBIT_FORMS, LOWBIT_MAX_ROWS, pack_panels_lowbit

_c_i64, _c_ptr = ctypes.c_int64, ctypes.c_void_p


@functools.lru_cache(maxsize=None)
def load_gemm_f32(level: Optional[IsaLevel] = None) -> Optional[ctypes.CDLL]:
    """The kernel library built for ``level`` (default: this CPU's, or
    ``INFLIGHT_CPU_ISA``), None where it cannot be built."""
    lib = load_library("gemm_f32", level)
    if lib is None:
        return None
    lib.gemm_f32_isa.restype = ctypes.c_char_p
    lib.gemm_f32_lowbit_panel_bytes.argtypes, lib.gemm_f32_lowbit_panel_bytes.restype = [ctypes.c_int, _c_i64], _c_i64
    lib.gemm_f32_lowbit_dequant.argtypes = [_c_ptr, ctypes.c_int, _c_i64, _c_i64, _c_ptr]
    lib.gemm_f32_lowbit_pack.argtypes = [_c_ptr, _c_i64, _c_i64, ctypes.c_int, _c_ptr]
    lib.gemm_f32_lowbit_matches.argtypes = [_c_ptr, ctypes.c_int, _c_i64, _c_i64, _c_ptr]
    bind(lib, "gemm_f32")
    for bits in LOWBIT_FORMS:  # the same signatures over low-bit panels
        for suffix in ("", "_silu", "_argmax", "_argmax_masked"):
            low, full = getattr(lib, f"gemm_f32_q{bits}{suffix}"), getattr(lib, f"gemm_f32{suffix}")
            low.argtypes, low.restype = full.argtypes, ctypes.c_int
    return lib


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
    ``level`` picks the ISA build (tests run every one the CPU has). ``lowbit=False``
    keeps a 4- or 8-bit weight in fp32 panels only."""

    kernel = "gemm_f32"
    packed_dtype = torch.float32
    load = staticmethod(load_gemm_f32)

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], level: Optional[IsaLevel] = None,
                 lowbit: bool = True) -> None:
        super().__init__(weight, bias, level)
        found = pack_panels_lowbit(weight.detach(), self.packed, self.panel, self.lib) if lowbit else None
        self.lowbit_bits = 0 if found is None else found[1]  # 4, 8 or 6; 0: fp32 panels only
        self.register_buffer("lowbit", None if found is None else found[0], persistent=False)
        self.lowbit_max_rows = LOWBIT_MAX_ROWS  # lowbit_rows.py sets this machine's

    def _call(self, suffix: str, *args) -> int:
        # args: x, M, K, lda, packed, ...: a few rows read the low-bit panels instead
        if self.lowbit is not None and args[1] <= self.lowbit_max_rows:
            fn = getattr(self.lib, f"gemm_f32_q{self.lowbit_bits}{suffix}")
            return fn(*args[:4], self.lowbit.data_ptr(), *args[5:])
        return super()._call(suffix, *args)

    @staticmethod
    def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
        return pack_panels_f32(weight, panel)

    @property
    def isa(self) -> str:
        return self.lib.gemm_f32_isa().decode()

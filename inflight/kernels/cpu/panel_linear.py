"""What the panel GEMMs' Python fronts share (gemm_bf16.py, gemm_f32.py): the ctypes
signatures of the three entry points and an ``nn.Linear`` drop-in that holds the
weight packed in panels and calls them.

Every panel GEMM library ``<name>`` exports, with ``T`` its element type:

    int <name>(const T* x, int64 M, int64 K, int64 lda, const T* packed, int64 N,
               const T* bias, T* out, int64 ldc)
    int <name>_silu(const T* x, int64 M, int64 K, int64 lda, const T* packed, int64 N,
                    T* out, int64 ldc)          -2: N/2 is not on a panel boundary
    int <name>_argmax(const T* x, int64 M, int64 K, int64 lda, const T* packed, int64 N,
                      int64* tokens)
    int <name>_argmax_masked(const T* x, int64 M, int64 K, int64 lda, const T* packed, int64 N,
                             const int32* bitmask, int64 words, const int64* mask_rows,
                             int64* tokens)   row m's argmax over the tokens set in
                                              bitmask row mask_rows[m] (all: -1)
    int <name>_panel(void)                      output columns per panel
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.kernels.cpu.isa import IsaLevel

if TYPE_CHECKING:
    from inflight.structured_output.masks import GrammarBitmask

_c_i64, _c_ptr = ctypes.c_int64, ctypes.c_void_p


def bind(lib: ctypes.CDLL, name: str) -> ctypes.CDLL:
    """Set the ctypes signatures of ``lib``'s panel GEMM entry points called ``name``*."""
    getattr(lib, name).argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_ptr, _c_i64]
    getattr(lib, f"{name}_silu").argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr, _c_i64]
    getattr(lib, f"{name}_argmax").argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64, _c_ptr]
    getattr(lib, f"{name}_argmax_masked").argtypes = [_c_ptr, _c_i64, _c_i64, _c_i64, _c_ptr, _c_i64,
                                                      _c_ptr, _c_i64, _c_ptr, _c_ptr]
    for fn in (name, f"{name}_silu", f"{name}_argmax", f"{name}_argmax_masked", f"{name}_panel"):
        getattr(lib, fn).restype = ctypes.c_int
    return lib


class PanelLinearBase(nn.Module):
    """Drop-in for an ``nn.Linear`` on the CPU whose weight is packed once in panels
    for the kernel library ``lib`` (entry points ``kernel``*, element type ``packed_dtype``).
    Subclasses set ``kernel`` and ``packed_dtype`` and say how the library is loaded and
    a weight is packed. ``level`` picks the ISA build (tests run every one the CPU has)."""

    kernel: str
    packed_dtype: torch.dtype  # of the weight, input and output (the C layer loop checks it)

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], level: Optional[IsaLevel] = None) -> None:
        super().__init__()
        lib = self.load(level)
        if lib is None:
            raise RuntimeError(f"the {self.kernel} kernel cannot be built on this machine")
        self.lib = lib
        self.out_features, self.in_features = weight.shape
        self.panel = int(getattr(lib, f"{self.kernel}_panel")())
        self.register_buffer("packed", self.pack(weight.detach(), self.panel), persistent=False)
        b = None if bias is None else bias.detach().to(self.packed_dtype).contiguous()
        self.register_buffer("bias", b, persistent=False)

    @staticmethod
    def load(level: Optional[IsaLevel]) -> Optional[ctypes.CDLL]:
        """The kernel library built for ``level``, None where it cannot be built."""
        raise NotImplementedError

    @staticmethod
    def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
        raise NotImplementedError

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as [M, in] rows with unit column stride (the kernels take a row stride)."""
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != self.packed_dtype:
            raise TypeError(f"{type(self).__name__} takes {self.packed_dtype} input, got {x2.dtype}")
        return x2 if x2.stride(-1) == 1 else x2.contiguous()

    def _call(self, suffix: str, *args) -> int:
        return getattr(self.lib, self.kernel + suffix)(*args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._rows(x)
        out = torch.empty(x2.shape[0], self.out_features, dtype=self.packed_dtype)
        rc = self._call("", x2.data_ptr(), x2.shape[0], self.in_features, x2.stride(0), self.packed.data_ptr(),
                        self.out_features, None if self.bias is None else self.bias.data_ptr(), out.data_ptr(),
                        self.out_features)
        if rc != 0:
            raise RuntimeError(f"{self.kernel} failed ({rc})")
        return out.view(*x.shape[:-1], self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this gate_up projection's output [gate | up], without
        materializing it where the split falls on a panel boundary (else through the
        full output and torch)."""
        if self.bias is not None:
            raise ValueError("silu_mul of a projection with a bias")
        x2 = self._rows(x)
        inter = self.out_features // 2
        out = torch.empty(x2.shape[0], inter, dtype=self.packed_dtype)
        rc = self._call("_silu", x2.data_ptr(), x2.shape[0], self.in_features, x2.stride(0), self.packed.data_ptr(),
                        self.out_features, out.data_ptr(), inter)
        if rc == -2:
            gate_up = self(x2)
            out = F.silu(gate_up[:, :inter]) * gate_up[:, inter:2 * inter]
        elif rc != 0:
            raise RuntimeError(f"{self.kernel}_silu failed ({rc})")
        return out.view(*x.shape[:-1], inter)

    def argmax(self, x: torch.Tensor, grammar: Optional["GrammarBitmask"] = None) -> torch.Tensor:
        """Per row of ``x`` [M, in], the index of the largest output, as
        ``self(x).float().argmax(-1)`` gives it (first index on ties), without writing
        the outputs: greedy sampling from the logits projection. No bias.

        ``grammar`` (structured output's masks of these M rows): a constrained row's
        argmax is over the tokens its mask allows, as the argmax of the logits after
        ``grammar.apply`` gives it (0 where no allowed output is above -inf)."""
        if self.bias is not None:
            raise ValueError("argmax of a projection with a bias")
        x2 = self._rows(x)
        M = x2.shape[0]
        tokens = torch.empty(M, dtype=torch.int64)
        if grammar is None:
            rc = self._call("_argmax", x2.data_ptr(), M, self.in_features, x2.stride(0),
                            self.packed.data_ptr(), self.out_features, tokens.data_ptr())
        else:
            bitmask = grammar.bitmask
            if bitmask.dtype != torch.int32 or bitmask.shape[0] != M or bitmask.shape[1] * 32 < self.out_features:
                raise ValueError(f"grammar bitmask {tuple(bitmask.shape)} {bitmask.dtype} does not cover "
                                 f"{M} rows of {self.out_features} tokens")
            bitmask = bitmask.contiguous()
            mask_rows = torch.full((M,), -1, dtype=torch.int64)
            mask_rows[grammar.rows] = torch.tensor(grammar.rows, dtype=torch.int64)
            rc = self._call("_argmax_masked", x2.data_ptr(), M, self.in_features, x2.stride(0),
                            self.packed.data_ptr(), self.out_features, bitmask.data_ptr(), bitmask.shape[1],
                            mask_rows.data_ptr(), tokens.data_ptr())
        if rc != 0:
            raise RuntimeError(f"{self.kernel}_argmax failed ({rc})")
        return tokens

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=panels of {self.panel}"

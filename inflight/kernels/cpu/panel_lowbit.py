"""Low-bit panels for fp32 weights that are 4-, 6- or 8-bit underneath (csrc/panel_lowbit.h).

A GGUF Q4_0, Q4_1 or Q4_K tensor dequantizes to float32 values that, in each block of
32 inputs of an output row, are ``d * q + m`` with q in 0..15 (d, m half floats; for
Q4_K half floats times 6-bit integers);
a Q8_0 tensor to ``d * q`` with q in -128..127. The rest are kept in the K-quant form
(``bits`` 6: a d and m for every 16 inputs, q in a byte): a Q6_K or Q3_K tensor dequantizes
to ``d * q`` with a d for every 16 inputs (a half float times an 8-bit integer), a Q5_0,
Q5_1, Q5_K or Q2_K one to ``d * q + m`` with q in 0..31; the form also holds the Q4_K rows
fused beside Q6_K ones (a Q4_K_M file's qkv). The fp32 GEMM reads 4 bytes
a weight; a decode step of a few rows waits on those bytes (two FLOPs a row per weight).
Kept as d, m and q (0.75, 1.125 or 1.5 bytes a weight), the same weight streams 2.7-5.3x faster and
the kernel expands each panel to fp32 in L2 before the unchanged microkernel runs over
it: the outputs are the fp32 GEMM's, bit for bit.

Nothing here trusts the file's format: the kernel library's ``gemm_f32_lowbit_pack``
recovers d, m and q from the fp32 values themselves (so it works on the cached,
dequantized weights too), and ``pack_panels_lowbit`` keeps the result only when the
kernel's own expansion gives back the fp32 panels exactly. Any other weight stays fp32 only.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

LB_K = 32  # inputs per block
# the forms, in the order tried (fewest bytes a weight first): 4-bit, 8-bit, K-quant
LOWBIT_FORMS = (4, 8, 6)
# At most this many rows go through the low-bit panels; more rows reuse each panel
# enough that its fp32 bytes stream as fast (benchmarks/lowbit_gemm_rows.py).
LOWBIT_MAX_ROWS = 128


# a cheap no on a sample of rows first, for the (large) weights of another form
_SAMPLE_ROWS = 256


def _pack(lib: ctypes.CDLL, weight: torch.Tensor, bits: int, panel: int) -> Optional[torch.Tensor]:
    """``weight`` in ``bits``-wide panels (uint8), None where a block has no such exact form."""
    n, k = weight.shape
    out = torch.zeros(-(-n // panel) * lib.gemm_f32_lowbit_panel_bytes(bits, k), dtype=torch.uint8)
    rc = lib.gemm_f32_lowbit_pack(ctypes.c_void_p(weight.data_ptr()), n, k, bits, ctypes.c_void_p(out.data_ptr()))
    return out if rc == 0 else None


def pack_panels_lowbit(weight: torch.Tensor, packed: torch.Tensor, panel: int,
                       lib: ctypes.CDLL) -> Optional[tuple[torch.Tensor, int]]:
    """``weight``'s low-bit panels (uint8) and their form (4, 8 or 6: ``LOWBIT_FORMS``), or None
    where it has no exact low-bit form: kept only when the kernel's expansion gives the
    values of ``packed`` (its fp32 panels) exactly (``gemm_f32_lowbit_matches``)."""
    n, k = weight.shape
    if k % LB_K or n == 0 or weight.dtype != torch.float32:
        return None
    weight = weight.contiguous()
    for bits in LOWBIT_FORMS:
        if n > _SAMPLE_ROWS and _pack(lib, weight[:_SAMPLE_ROWS], bits, panel) is None:
            continue
        qp = _pack(lib, weight, bits, panel)
        if qp is None:
            continue
        # NOTE: equal values, not bits: Q4_0's d * (q - 8) is -0.0 where d < 0 and q = 8, which
        # d * q + m gives as +0.0. Every product with it is then a zero of either sign, which
        # leaves any sum unchanged but one that is itself a zero (a bias of -0.0).
        if lib.gemm_f32_lowbit_matches(ctypes.c_void_p(qp.data_ptr()), bits, packed.shape[0], k,
                                       ctypes.c_void_p(packed.data_ptr())) == 1:
            return qp, bits
    return None

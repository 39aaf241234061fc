"""4-bit panels for fp32 weights that are 4-bit underneath (csrc/panel_q4.h).

A GGUF Q4_0 or Q4_1 tensor dequantizes to float32 values that, in each block of
32 inputs of an output row, are ``d * q + m`` with q in 0..15 and d, m half
floats. The fp32 GEMM reads 4 bytes a weight; a decode step of a few rows waits on
those bytes (two FLOPs a row per weight). Kept as d, m and q (0.75 bytes a weight),
the same weight streams 5.3x faster and the kernel expands each panel to fp32 in L2
before the unchanged microkernel runs over it: the outputs are the fp32 GEMM's, bit
for bit.

Nothing here trusts the file's format: ``q4_blocks`` recovers d, m and q from the
fp32 values themselves (so it works on the cached, dequantized weights too), and
``pack_panels_q4`` keeps the result only when the kernel's own expansion gives back
the fp32 panels exactly. Any other weight stays fp32 only.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

Q4_K = 32  # inputs per block
# At most this many rows go through the 4-bit panels; more rows reuse each panel
# enough that expanding it costs more than streaming its fp32 bytes saves.
Q4_MAX_ROWS = 128


def q4_blocks(weight: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(d [N, K/32], m [N, K/32], q [N, K] uint8) with ``d * q + m == weight`` in every
    block of 32 inputs (float32 arithmetic, d a half float, m one end of the block), or
    None where ``weight`` [N, K] has no such form."""
    n, k = weight.shape
    if k % Q4_K or weight.dtype != torch.float32 or n == 0:
        return None
    w = weight.reshape(n, k // Q4_K, Q4_K)
    lo, hi = w.amin(-1), w.amax(-1)
    span = hi - lo
    d, m, q = torch.zeros_like(lo), torch.zeros_like(lo), torch.zeros(w.shape, dtype=torch.uint8)
    fit = torch.zeros(lo.shape, dtype=torch.bool)
    # q = 0 falls on one end of each block (the smallest value when d > 0, as Q4_1 has
    # it; either end in Q4_0), and the other end's q is 15 unless rounding lowered it
    for top, sign in ((t, s) for t in range(15, 0, -1) for s in (1, -1)):
        todo = (~fit).nonzero(as_tuple=True)
        if not todo[0].numel():
            break
        wt, mt = w[todo], (lo if sign > 0 else hi)[todo].unsqueeze(-1)
        dt = (sign * span[todo] / top).half().float().unsqueeze(-1)
        qt = torch.where(dt != 0, (wt - mt) / dt, torch.zeros_like(wt)).round().clamp(0, 15)
        ok = (dt * qt + mt == wt).all(-1)
        rows, blocks = todo[0][ok], todo[1][ok]
        d[rows, blocks], m[rows, blocks], fit[rows, blocks] = dt[ok, 0], mt[ok, 0], True
        q[rows, blocks] = qt[ok].to(torch.uint8)
    return (d, m, q.view(n, k)) if bool(fit.all()) else None


def _panels(t: torch.Tensor, panel: int) -> torch.Tensor:
    """Rows of ``t`` zero-padded to a multiple of ``panel``, as [panels, panel, ...]."""
    n = t.shape[0]
    n_pad = -(-n // panel) * panel
    if n_pad != n:
        t = torch.cat([t, t.new_zeros(n_pad - n, *t.shape[1:])])
    return t.view(n_pad // panel, panel, *t.shape[1:])


def pack_q4(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, panel: int) -> torch.Tensor:
    """The panel_q4.h layout of (d, m, q) for panels of ``panel`` output columns:
    per panel, per block of 32 inputs, d[panel] and m[panel] as float32, then 16 rows of
    ``panel`` bytes (column j's q at inputs 2i and 2i + 1 in byte j of row i, low nibble first)."""
    kb = d.shape[1]
    dp = _panels(d, panel).transpose(1, 2).contiguous()  # [P, KB, panel]
    mp = _panels(m, panel).transpose(1, 2).contiguous()
    qp = _panels(q.view(q.shape[0], kb, Q4_K), panel).permute(0, 2, 3, 1)  # [P, KB, 32, panel]
    nibbles = (qp[:, :, 0::2] | (qp[:, :, 1::2] << 4)).contiguous()  # [P, KB, 16, panel]
    P = dp.shape[0]
    return torch.cat([dp.view(torch.uint8), mp.view(torch.uint8), nibbles.view(P, kb, Q4_K // 2 * panel)], dim=-1).view(-1)


def pack_panels_q4(weight: torch.Tensor, packed: torch.Tensor, panel: int, lib: ctypes.CDLL) -> Optional[torch.Tensor]:
    """``weight``'s 4-bit panels (uint8), or None where it has no exact 4-bit form:
    kept only when ``lib.gemm_f32_q4_dequant`` expands them to ``packed`` (its fp32
    panels) bit for bit."""
    if weight.shape[0] > 256 and q4_blocks(weight[:256]) is None:  # a cheap no for most weights
        return None
    blocks = q4_blocks(weight)
    if blocks is None:
        return None
    q4 = pack_q4(*blocks, panel)
    k = weight.shape[1]
    back = torch.empty_like(packed)
    rc = lib.gemm_f32_q4_dequant(ctypes.c_void_p(q4.data_ptr()), packed.shape[0], k, ctypes.c_void_p(back.data_ptr()))
    if rc != 0 or not torch.equal(back.view(torch.int32), packed.view(torch.int32)):
        return None
    return q4

"""Low-bit panels for fp32 weights that are 4- or 8-bit underneath (csrc/panel_lowbit.h).

A GGUF Q4_0 or Q4_1 tensor dequantizes to float32 values that, in each block of
32 inputs of an output row, are ``d * q + m`` with q in 0..15 and d, m half floats;
a Q8_0 tensor to ``d * q`` with q in -128..127. The fp32 GEMM reads 4 bytes a weight;
a decode step of a few rows waits on those bytes (two FLOPs a row per weight). Kept as
d, m and q (0.75 or 1.125 bytes a weight), the same weight streams 3.6-5.3x faster and
the kernel expands each panel to fp32 in L2 before the unchanged microkernel runs over
it: the outputs are the fp32 GEMM's, bit for bit.

Nothing here trusts the file's format: ``q4_blocks`` and ``q8_blocks`` recover d, m and
q from the fp32 values themselves (so it works on the cached, dequantized weights too),
and ``pack_panels_lowbit`` keeps the result only when the kernel's own expansion gives
back the fp32 panels exactly. Any other weight stays fp32 only.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

LB_K = 32  # inputs per block
# At most this many rows go through the low-bit panels; more rows reuse each panel
# enough that expanding it costs more than streaming its fp32 bytes saves.
LOWBIT_MAX_ROWS = 128


def q4_blocks(weight: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(d [N, K/32], m [N, K/32], q [N, K] uint8) with ``d * q + m == weight`` in every
    block of 32 inputs (float32 arithmetic, d a half float, m one end of the block), or
    None where ``weight`` [N, K] has no such form."""
    n, k = weight.shape
    if k % LB_K or weight.dtype != torch.float32 or n == 0:
        return None
    w = weight.reshape(n, k // LB_K, LB_K)
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


def q8_blocks(weight: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(d [N, K/32], q [N, K] int8) with ``d * q == weight`` in every block of 32 inputs
    (float32 arithmetic, d a half float, the block's largest magnitude at |q| = 127), or
    None where ``weight`` [N, K] has no such form."""
    n, k = weight.shape
    if k % LB_K or weight.dtype != torch.float32 or n == 0:
        return None
    w = weight.reshape(n, k // LB_K, LB_K)
    d = (w.abs().amax(-1) / 127).half().float().unsqueeze(-1)
    q = torch.where(d != 0, w / d, torch.zeros_like(w)).round().clamp(-128, 127)
    if not bool((d * q == w).all()):
        return None
    return d.squeeze(-1), q.to(torch.int8).view(n, k)


def _panels(t: torch.Tensor, panel: int) -> torch.Tensor:
    """Rows of ``t`` zero-padded to a multiple of ``panel``, as [panels, panel, ...]."""
    n = t.shape[0]
    n_pad = -(-n // panel) * panel
    if n_pad != n:
        t = torch.cat([t, t.new_zeros(n_pad - n, *t.shape[1:])])
    return t.view(n_pad // panel, panel, *t.shape[1:])


def _block_major(t: torch.Tensor, panel: int) -> torch.Tensor:
    """[N, KB] per-block values -> [P, KB, panel] as bytes: a panel's columns side by side."""
    return _panels(t, panel).transpose(1, 2).contiguous().view(torch.uint8)


def pack_q4(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, panel: int) -> torch.Tensor:
    """The 4-bit layout of panel_lowbit.h for panels of ``panel`` output columns: per
    panel, per block of 32 inputs, d[panel] and m[panel] as float32, then 16 rows of
    ``panel`` bytes (column j's q at inputs 2i and 2i + 1 in byte j of row i, low nibble first)."""
    kb = d.shape[1]
    qp = _panels(q.view(q.shape[0], kb, LB_K), panel).permute(0, 2, 3, 1)  # [P, KB, 32, panel]
    nibbles = (qp[:, :, 0::2] | (qp[:, :, 1::2] << 4)).contiguous()  # [P, KB, 16, panel]
    P = nibbles.shape[0]
    return torch.cat([_block_major(d, panel), _block_major(m, panel), nibbles.view(P, kb, -1)], dim=-1).view(-1)


def pack_q8(d: torch.Tensor, q: torch.Tensor, panel: int) -> torch.Tensor:
    """The 8-bit layout of panel_lowbit.h: per panel, per block of 32 inputs, d[panel] as
    float32, then 32 rows of ``panel`` int8 q (column j in byte j)."""
    kb = d.shape[1]
    qp = _panels(q.view(q.shape[0], kb, LB_K), panel).permute(0, 2, 3, 1).contiguous()  # [P, KB, 32, panel]
    P = qp.shape[0]
    return torch.cat([_block_major(d, panel), qp.view(torch.uint8).view(P, kb, -1)], dim=-1).view(-1)


def _lowbit_form(weight: torch.Tensor, panel: int) -> Optional[tuple[torch.Tensor, int]]:
    for bits, blocks, pack in ((4, q4_blocks, pack_q4), (8, q8_blocks, pack_q8)):
        # a cheap no on a sample of rows first, for the (large) weights of another form
        if weight.shape[0] > 256 and blocks(weight[:256]) is None:
            continue
        found = blocks(weight)
        if found is not None:
            return pack(*found, panel), bits
    return None


def pack_panels_lowbit(weight: torch.Tensor, packed: torch.Tensor, panel: int,
                       lib: ctypes.CDLL) -> Optional[tuple[torch.Tensor, int]]:
    """``weight``'s low-bit panels (uint8) and their width in bits (4 or 8), or None
    where it has no exact low-bit form: kept only when ``lib.gemm_f32_lowbit_dequant``
    expands them to ``packed`` (its fp32 panels) exactly."""
    form = _lowbit_form(weight, panel)
    if form is None:
        return None
    qp, bits = form
    back = torch.empty_like(packed)
    rc = lib.gemm_f32_lowbit_dequant(ctypes.c_void_p(qp.data_ptr()), bits, packed.shape[0], weight.shape[1],
                                     ctypes.c_void_p(back.data_ptr()))
    # NOTE: equal values, not bits: Q4_0's d * (q - 8) is -0.0 where d < 0 and q = 8, which
    # d * q + m gives as +0.0. No output can tell them apart: each product then is a zero
    # of either sign, and an accumulator that starts at +0.0 (or a bias) is unchanged by it.
    if rc != 0 or not torch.equal(back, packed):
        return None
    return qp, bits

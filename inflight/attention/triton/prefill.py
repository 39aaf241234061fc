"""Kernel (c): prefill / extend attention over a cached prefix plus the new chunk.

The step's new K/V are written into the paged cache first (kernel a), so a
request's whole context, prefix-cache hit, earlier chunks and this chunk, is
read through its block table in one loop; the causal mask is on absolute
positions (query row ``i`` sits at ``seq_len - q_len + i`` and sees keys at
positions ``<=`` its own). One program per (request, query head, BLOCK_M
query rows); a program stops at its last row's position, so the causal upper
triangle is never loaded.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.attention.triton.runtime import dot_precision, next_pow2, upcast_for
from inflight.attention.triton.tiles import load_kv_tile


# first_req and the block table's width change from step to step: no value specialisation.
@triton.jit(do_not_specialize=["first_req", "stride_bt"])
def _prefill_kernel(Q, K_CACHE, V_CACHE, BLOCK_TABLES, SEQ_LENS, QUERY_START, OUT,
                    scale, first_req,
                    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    UPCAST: tl.constexpr, PREC: tl.constexpr):
    req = (first_req + tl.program_id(0)).to(tl.int64)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    q_start = tl.load(QUERY_START + req).to(tl.int32)
    q_len = tl.load(QUERY_START + req + 1).to(tl.int32) - q_start
    if mblk * BLOCK_M >= q_len:
        return
    seq_len = tl.load(SEQ_LENS + req).to(tl.int32)
    prefix = seq_len - q_len
    kvh = h // GROUP
    rows = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < q_len
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    tok_rows = (q_start + rows).to(tl.int64)
    q = tl.load(Q + tok_rows[:, None] * stride_qt + h * stride_qh + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    pos_q = prefix + rows
    kv_end = tl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M)  # last row's position + 1
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tmask = toks < kv_end
        k, v = load_kv_tile(K_CACHE, V_CACHE, BLOCK_TABLES + req * stride_bt, toks, tmask, kvh, d, dmask,
                            stride_cb, stride_cs, stride_ch, PAGE, UPCAST)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PREC) * scale
        visible = tmask[None, :] & (toks[None, :] <= pos_q[:, None])
        s = tl.where(visible, s, float("-inf"))
        # Every real row sees at least key 0, so m_new is finite there; padded rows
        # (rmask false) also see key 0 because pos_q >= 0: no -inf - -inf NaNs.
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    out = acc / l[:, None]
    tl.store(OUT + tok_rows[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(OUT.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      seq_lens: torch.Tensor, query_start_loc: torch.Tensor, first_req: int, num_reqs: int,
                      max_query_len: int, scale: float, out: torch.Tensor) -> torch.Tensor:
    """Attend requests ``first_req .. first_req + num_reqs - 1`` (rows of ``block_tables``,
    ``seq_lens``, ``query_start_loc`` [num_all_reqs + 1]) and write their rows of ``out``.

    q, out: [T, H, D] over the whole flattened batch; K/V of these rows must already be
    in the cache (the backend writes them first)."""
    if num_reqs == 0:
        return out
    _, nh, hd = q.shape
    _, page, kvh, _ = k_cache.shape
    assert nh % kvh == 0 and k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1
    upcast = upcast_for(q)
    prec = "ieee" if upcast else dot_precision(q.dtype)
    block_d = max(next_pow2(hd), 16)
    # Smaller tiles for the interpreter: fewer wasted (masked) rows in numpy on short test chunks.
    block_m = 16 if upcast else (64 if hd <= 128 else 32)
    block_n = 16 if upcast else (64 if hd <= 64 else 32)
    grid = (num_reqs, nh, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale, first_req,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=nh // kvh, HEAD_DIM=hd, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        UPCAST=upcast, PREC=prec, num_warps=4, num_stages=2)
    return out

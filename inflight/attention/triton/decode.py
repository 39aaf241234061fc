"""Kernel (b): paged decode attention (one query token per request) with split-K.

Stage 1 runs one program per (request, KV head, split): the query heads that
share the KV head are stacked into one tile (grouped-query attention reads each
K/V tile once for the whole group), and the split walks its share of the
request's tokens through the block table with an online softmax. With one
split it writes the output directly; otherwise it writes a normalised partial
output and its log-sum-exp, and stage 2 merges the splits per (request, head).
Splitting matters when few requests have long contexts: without it the grid is
``num_seqs * num_kv_heads`` programs, too few to keep the GPU's memory busy.

The kernels read the split count and every length from device tensors, so a
CUDA graph captured once per batch size stays valid for any context length.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from inflight.attention.triton.runtime import dot_precision, next_pow2, upcast_for
from inflight.attention.triton.tiles import load_kv_tile

MAX_SPLITS = 16
MIN_TOKENS_PER_SPLIT = 256  # below this a split costs more in stage 2 than it saves


# Triton specialises integer arguments on their value (== 1, divisible by 16); these change from
# step to step (the block table's width, the split count), so specialising would recompile mid-run.
@triton.jit(do_not_specialize=["num_splits", "stride_bt", "stride_mt", "stride_mh", "stride_lt", "stride_lh"])
def _decode_stage1(Q, K_CACHE, V_CACHE, BLOCK_TABLES, SEQ_LENS, OUT, MID_O, MID_LSE,
                   scale, num_splits,
                   stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                   stride_ot, stride_oh, stride_mt, stride_mh, stride_ms, stride_lt, stride_lh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   DIRECT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    req64 = req.to(tl.int64)
    seq_len = tl.load(SEQ_LENS + req).to(tl.int32)
    g = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + g
    hmask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    q = tl.load(Q + req64 * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # Each split takes a BLOCK_N-aligned share; trailing splits may be empty.
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tmask = toks < end
        k, v = load_kv_tile(K_CACHE, V_CACHE, BLOCK_TABLES + req64 * stride_bt, toks, tmask, kvh, d, dmask,
                            stride_cb, stride_cs, stride_ch, PAGE, UPCAST)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PREC) * scale
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    # An empty split (or a padding row with seq_len 0) has l == 0: write 0 and lse -inf.
    has = l > 0
    out = acc / tl.where(has, l, 1.0)[:, None]
    omask = hmask[:, None] & dmask[None, :]
    if DIRECT:
        tl.store(OUT + req64 * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(OUT.dtype.element_ty), mask=omask)
    else:
        tl.store(MID_O + req64 * stride_mt + heads[:, None] * stride_mh + split * stride_ms + d[None, :],
                 out, mask=omask)
        lse = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf"))
        tl.store(MID_LSE + req64 * stride_lt + heads * stride_lh + split, lse, mask=hmask)


@triton.jit(do_not_specialize=["num_splits", "stride_mt", "stride_mh", "stride_lt", "stride_lh"])
def _decode_stage2(MID_O, MID_LSE, OUT, num_splits,
                   stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of one (request, head): softmax-weight each partial output by its lse."""
    req = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < num_splits
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    lse = tl.load(MID_LSE + req * stride_lt + h * stride_lh + s, mask=smask, other=float("-inf"))
    mx = tl.max(lse, 0)
    valid = lse > float("-inf")
    w = tl.where(valid, tl.exp(lse - tl.where(mx > float("-inf"), mx, 0.0)), 0.0)
    o = tl.load(MID_O + req * stride_mt + h * stride_mh + s[:, None] * stride_ms + d[None, :],
                mask=smask[:, None] & dmask[None, :], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(OUT + req * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int = 132) -> int:
    """Splits per request: enough programs to fill ~2 waves of ``num_sms`` processors,
    but at least MIN_TOKENS_PER_SPLIT tokens each and at most MAX_SPLITS."""
    programs = max(num_seqs * num_kv_heads, 1)
    want = -(-2 * num_sms // programs)
    by_len = -(-max(max_seq_len, 1) // MIN_TOKENS_PER_SPLIT)
    return max(1, min(want, by_len, MAX_SPLITS))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, num_splits: int = 1,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q: [B, H, D] (one token per request); caches [num_blocks, block_size, KVH, D];
    block_tables [B, max_blocks]; seq_lens [B] (0 for padding rows). Returns [B, H, D]."""
    b, nh, hd = q.shape
    _, page, kvh, _ = k_cache.shape
    assert nh % kvh == 0 and k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1
    out = torch.empty_like(q) if out is None else out
    if b == 0:
        return out
    group = nh // kvh
    upcast = upcast_for(q)
    prec = "ieee" if upcast else dot_precision(q.dtype)
    block_d = max(next_pow2(hd), 16)
    # tl.dot needs every tile dimension >= 16 on the GPU: the head group is padded to 16 rows.
    block_h = max(next_pow2(group), 16)
    block_n = 64 if hd <= 128 else 32
    num_splits = max(1, min(int(num_splits), MAX_SPLITS))
    direct = num_splits == 1
    if direct:
        mid_o = mid_lse = out  # unused placeholders
        ms, ls = (0, 0, 0), (0, 0)
    else:
        mid_o = torch.empty((b, nh, num_splits, hd), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((b, nh, num_splits), dtype=torch.float32, device=q.device)
        ms, ls = mid_o.stride()[:3], mid_lse.stride()[:2]
    _decode_stage1[(b, kvh, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, mid_o, mid_lse, scale, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), *ms, *ls,
        GROUP=group, HEAD_DIM=hd, PAGE=page, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n,
        DIRECT=direct, UPCAST=upcast, PREC=prec, num_warps=4)
    if not direct:
        _decode_stage2[(b, nh)](
            mid_o, mid_lse, out, num_splits, *ms, *ls, out.stride(0), out.stride(1),
            HEAD_DIM=hd, BLOCK_D=block_d, BLOCK_S=next_pow2(num_splits), num_warps=4)
    return out

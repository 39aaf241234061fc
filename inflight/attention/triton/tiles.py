"""Device helpers the Triton attention kernels share."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(K_CACHE, V_CACHE, BT_ROW, toks, tmask, kvh, d, dmask, stride_cb, stride_cs, stride_ch,
                 PAGE: tl.constexpr, UPCAST: tl.constexpr):
    """K and V rows [BLOCK_N, BLOCK_D] of the tokens ``toks`` of one request (its block-table
    row starts at ``BT_ROW``) for KV head ``kvh``; masked tokens and dims read as 0."""
    blk = tl.load(BT_ROW + toks // PAGE, mask=tmask, other=0).to(tl.int64)
    off = blk * stride_cb + (toks % PAGE).to(tl.int64) * stride_cs + kvh * stride_ch
    kv_mask = tmask[:, None] & dmask[None, :]
    k = tl.load(K_CACHE + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V_CACHE + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v

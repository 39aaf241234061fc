"""Kernel (a): scatter a step's new K/V rows into the paged cache through ``slot_mapping``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.attention.triton.runtime import next_pow2


@triton.jit
def _write_kv_kernel(K, V, K_CACHE, V_CACHE, SLOTS,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cs, stride_ch,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token: copy its [KVH, D] K and V rows to cache slot ``SLOTS[t]``.

    A negative slot marks a padding row (CUDA-graph batches are padded to a bucket
    size) and is skipped, so padding never overwrites a real request's cache."""
    t = tl.program_id(0)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    t64 = t.to(tl.int64)
    k = tl.load(K + t64 * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(V + t64 * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = slot * stride_cs + h[:, None] * stride_ch + d[None, :]
    tl.store(K_CACHE + dst, k.to(K_CACHE.dtype.element_ty), mask=mask)
    tl.store(V_CACHE + dst, v.to(V_CACHE.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D] (contiguous).
    ``slot_mapping[t]`` is ``block * block_size + offset``; -1 skips row ``t``."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, _, kvh, d = k_cache.shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "paged caches must be contiguous"
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "K/V rows must be contiguous in head_dim"
    # One cache slot holds KVH * D values: the slot stride of a contiguous cache.
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=kvh, HEAD_DIM=d, BLOCK_H=next_pow2(kvh), BLOCK_D=next_pow2(d))

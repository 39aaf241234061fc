"""Allocation of the paged KV pools (device pool and host swap pool), sized from memory budgets."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from inflight.attention.kv_quant import FP8_DTYPE, SCALE_DTYPE, FP8KVCache
from inflight.models.registry import ModelArchConfig

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def bytes_per_block(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """K and V for ``block_size`` tokens in every layer (fp8: values plus a bf16 scale per token and head)."""
    if is_fp8(kv_cache_dtype):
        per_head = cfg.head_dim * FP8_DTYPE.itemsize + SCALE_DTYPE.itemsize
    else:
        per_head = cfg.head_dim * dtype.itemsize
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * per_head


def num_blocks_for_memory(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, memory: int,
                          kv_cache_dtype: str = "auto") -> int:
    per_block = bytes_per_block(cfg, block_size, dtype, kv_cache_dtype)
    n = memory // per_block
    if n < 1:
        raise ValueError(f"kv_cache_memory={memory} bytes is smaller than one KV block ({per_block} bytes)")
    return int(n)


def allocate_kv_cache(cfg: ModelArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device, kv_cache_dtype: str = "auto") -> list[tuple]:
    """One (K, V) pair per layer, each ``[num_blocks, block_size, kv_heads, head_dim]``:
    tensors of ``dtype``, or for fp8 :class:`FP8KVCache` pools that dequantize to ``dtype``.

    NOTE: zero-filled so that padded (masked) slots never hold NaN: a NaN
    value times a zero attention weight would still poison the output."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    if is_fp8(kv_cache_dtype):
        return [(FP8KVCache.zeros(shape, dtype, device), FP8KVCache.zeros(shape, dtype, device))
                for _ in range(cfg.num_hidden_layers)]
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)]


def resolve_num_host_blocks(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str,
                            swap_space_gib: float, override: Optional[int]) -> int:
    """Blocks in the host swap pool: explicit override, else ``swap_space`` GiB of host memory."""
    if override is not None:
        return max(int(override), 0)
    return int(swap_space_gib * 2**30) // bytes_per_block(cfg, block_size, dtype, kv_cache_dtype)


def resolve_num_blocks(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                       kv_cache_memory: Optional[int], gpu_memory_utilization: float,
                       override: Optional[int], kv_cache_dtype: str = "auto") -> int:
    """Number of blocks: explicit override, else the CPU byte budget, else a share of free GPU memory."""
    if override:
        return override
    if device.type == "cuda" and kv_cache_memory is None:
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * gpu_memory_utilization) - used
        return num_blocks_for_memory(cfg, block_size, dtype, max(budget, 0), kv_cache_dtype)
    return num_blocks_for_memory(cfg, block_size, dtype, kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY,
                                 kv_cache_dtype)

"""Allocation of the paged KV pools, sized from a memory budget."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from inflight.models.registry import ModelArchConfig

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30


def bytes_per_block(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V for ``block_size`` tokens in every layer."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


def num_blocks_for_memory(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, memory: int) -> int:
    n = memory // bytes_per_block(cfg, block_size, dtype)
    if n < 1:
        raise ValueError(f"kv_cache_memory={memory} bytes is smaller than one KV block "
                         f"({bytes_per_block(cfg, block_size, dtype)} bytes)")
    return int(n)


def allocate_kv_cache(cfg: ModelArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (K, V) pair per layer, each ``[num_blocks, block_size, kv_heads, head_dim]``.

    NOTE: zero-filled so that padded (masked) slots never hold NaN: a NaN
    value times a zero attention weight would still poison the output."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)]


def resolve_num_blocks(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                       kv_cache_memory: Optional[int], gpu_memory_utilization: float,
                       override: Optional[int]) -> int:
    """Number of blocks: explicit override, else the CPU byte budget, else a share of free GPU memory."""
    if override:
        return override
    if device.type == "cuda" and kv_cache_memory is None:
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * gpu_memory_utilization) - used
        return num_blocks_for_memory(cfg, block_size, dtype, max(budget, 0))
    return num_blocks_for_memory(cfg, block_size, dtype, kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY)

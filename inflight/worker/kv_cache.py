"""Allocation of the paged KV pools (device pool and host swap pool), sized from memory budgets."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from inflight.attention.kv_quant import FP8KVCache, fp8_row_bytes
from inflight.core.hybrid_kv import group_layers
from inflight.models.registry import ModelArchConfig

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def storage_dtype(dtype: torch.dtype, kv_cache_dtype: str) -> torch.dtype:
    """The element type of unquantized pools: the model's dtype ("auto"), or bfloat16
    ("bfloat16": half a float32 model's KV bytes, widened back as the kernels read it)."""
    return torch.bfloat16 if kv_cache_dtype == "bfloat16" else dtype


def bytes_per_block(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto",
                    num_layers: Optional[int] = None) -> int:
    """K and V for ``block_size`` tokens in ``num_layers`` layers (default every layer; a hybrid
    layout's block holds one layer per group) (fp8: values plus a bf16 scale per token and head)."""
    if is_fp8(kv_cache_dtype):
        per_head = fp8_row_bytes(cfg.head_dim)
    else:
        per_head = cfg.head_dim * storage_dtype(dtype, kv_cache_dtype).itemsize
    return 2 * (num_layers or cfg.num_hidden_layers) * block_size * cfg.num_key_value_heads * per_head


def num_blocks_for_memory(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, memory: int,
                          kv_cache_dtype: str = "auto", num_layers: Optional[int] = None) -> int:
    per_block = bytes_per_block(cfg, block_size, dtype, kv_cache_dtype, num_layers)
    n = memory // per_block
    if n < 1:
        raise ValueError(f"kv_cache_memory={memory} bytes is smaller than one KV block ({per_block} bytes)")
    return int(n)


@dataclass(frozen=True)
class HybridLayout:
    """A KV pool in layer groups (core/hybrid_kv.py): each layer's group (whose block tables
    it reads) and pool (its place in that group); a block holds ``group_size`` layers."""

    layer_windows: list[Optional[int]]
    layer_groups: list[int]
    layer_pools: list[int]
    group_size: int


def hybrid_layout(cfg: ModelArchConfig, model: torch.nn.Module) -> Optional[HybridLayout]:
    """The layer-group layout when the layers' windows differ and the model hands each layer its
    own metadata (``supports_hybrid_kv``); None: one block table for every layer."""
    windows = [cfg.layer_sliding_window(i) for i in range(cfg.num_hidden_layers)]
    if len(set(windows)) < 2 or not getattr(model, "supports_hybrid_kv", False):
        return None
    groups = group_layers(windows)
    layer_groups, layer_pools = [0] * len(windows), [0] * len(windows)
    for g, group in enumerate(groups):
        for place, layer in enumerate(group.layers):
            layer_groups[layer], layer_pools[layer] = g, place
    return HybridLayout(windows, layer_groups, layer_pools, len(groups[0].layers))


def allocate_kv_cache(cfg: ModelArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device, kv_cache_dtype: str = "auto",
                      zeros: Optional[Callable[[tuple, torch.dtype], torch.Tensor]] = None,
                      layer_pools: Optional[list[int]] = None) -> list[tuple]:
    """One (K, V) pair per layer, each ``[num_blocks, block_size, kv_heads, head_dim]``:
    tensors of ``dtype``, or for fp8 :class:`FP8KVCache` pools that dequantize to ``dtype``.
    ``layer_pools`` (a hybrid layout): each layer's pool, its place in its KV cache group;
    layers of different groups at the same place share one pair (their block ids differ).

    NOTE: zero-filled so that padded (masked) slots never hold NaN: a NaN
    value times a zero attention weight would still poison the output. ``zeros`` is the
    platform's allocator for the pools (e.g. huge pages on the CPU)."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    layer_pools = layer_pools if layer_pools is not None else list(range(cfg.num_hidden_layers))
    zeros = zeros or (lambda shp, dt: torch.zeros(shp, dtype=dt, device=device))
    if is_fp8(kv_cache_dtype):
        pools = [(FP8KVCache.zeros(shape, dtype, device, zeros), FP8KVCache.zeros(shape, dtype, device, zeros))
                 for _ in range(max(layer_pools) + 1)]
    else:
        kv_dtype = storage_dtype(dtype, kv_cache_dtype)
        pools = [(zeros(shape, kv_dtype), zeros(shape, kv_dtype)) for _ in range(max(layer_pools) + 1)]
    return [pools[p] for p in layer_pools]


def resolve_num_host_blocks(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str,
                            swap_space_gib: float, override: Optional[int]) -> int:
    """Blocks in the host swap pool: explicit override, else ``swap_space`` GiB of host memory."""
    if override is not None:
        return max(int(override), 0)
    return int(swap_space_gib * 2**30) // bytes_per_block(cfg, block_size, dtype, kv_cache_dtype)


def resolve_num_blocks(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                       kv_cache_memory: Optional[int], gpu_memory_utilization: float,
                       override: Optional[int], kv_cache_dtype: str = "auto",
                       profiled_peak_bytes: Optional[int] = None, num_layers: Optional[int] = None) -> int:
    """Number of blocks: explicit override, else the CPU byte budget, else a share of free GPU memory
    (after the peak of a profiled forward pass, when ``profiled_peak_bytes`` is given); a block
    holds ``num_layers`` layers (default every layer)."""
    if override:
        return override
    if device.type == "cuda" and kv_cache_memory is None and profiled_peak_bytes is not None:
        budget = gpu_kv_budget(device, gpu_memory_utilization, profiled_peak_bytes)
        return num_blocks_for_memory(cfg, block_size, dtype, max(budget, 0), kv_cache_dtype, num_layers)
    if device.type == "cuda" and kv_cache_memory is None:
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * gpu_memory_utilization) - used
        return num_blocks_for_memory(cfg, block_size, dtype, max(budget, 0), kv_cache_dtype, num_layers)
    return num_blocks_for_memory(cfg, block_size, dtype, kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY,
                                 kv_cache_dtype, num_layers)


def gpu_kv_budget(device: torch.device, gpu_memory_utilization: float, peak_bytes: int) -> int:
    """Bytes left for the KV pool: ``utilization * total`` minus this process's profiled peak
    (weights + activations) minus memory outside torch's allocator (CUDA context, other processes)."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside_torch = (total - free) - torch.cuda.memory_reserved(device)
    return int(total * gpu_memory_utilization) - peak_bytes - max(outside_torch, 0)


def dummy_prefill_batch(cfg: ModelArchConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                        num_tokens: int, max_model_len: int) -> tuple:
    """(input_ids, positions, kv, md) of ``num_tokens`` prefill tokens in requests of at most
    ``max_model_len``, over a pool of exactly their blocks: one (K, V) pair that every layer
    shares (writes overwrite each other, harmless for profiling)."""
    from inflight.attention.base import AttentionMetadata

    lens = [min(max_model_len, num_tokens - s) for s in range(0, num_tokens, max_model_len)]
    blocks_per = [-(-n // block_size) for n in lens]
    shape = (sum(blocks_per), block_size, cfg.num_key_value_heads, cfg.head_dim)
    kv = (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
    tables = torch.zeros((len(lens), max(blocks_per)), dtype=torch.int64)
    first = 0
    for i, nb in enumerate(blocks_per):
        tables[i, :nb] = torch.arange(first, first + nb)
        first += nb
    positions = torch.cat([torch.arange(n) for n in lens])
    req = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    slots = tables[req, positions // block_size] * block_size + positions % block_size
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    md = AttentionMetadata(slot_mapping=slots.to(device), block_tables=tables.to(device),
                           seq_lens=torch.tensor(lens, device=device), query_start_loc_list=qsl,
                           seq_lens_list=lens, num_decodes=0, block_size=block_size)
    return torch.zeros(num_tokens, dtype=torch.int64, device=device), positions.to(device), kv, md


@torch.inference_mode()
def profile_forward_peak(model: torch.nn.Module, cfg: ModelArchConfig, block_size: int, dtype: torch.dtype,
                         device: torch.device, num_tokens: int, max_model_len: int, num_seqs: int) -> int:
    """Peak bytes allocated (weights included) by one worst-case step: ``num_tokens`` tokens of
    prefill and logits for ``num_seqs`` rows; the dummy KV pool is not counted."""
    ids, positions, kv, md = dummy_prefill_batch(cfg, block_size, dtype, device, num_tokens, max_model_len)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    hidden = model(ids, positions, [kv] * cfg.num_hidden_layers, md)
    if hasattr(model, "compute_logits"):  # an encoder has no logits
        logits = model.compute_logits(hidden[-1:].expand(num_seqs, -1))
        torch.sort(logits.float(), dim=-1, descending=True)  # the sampler's worst case: top-p sorts in float32
    torch.cuda.synchronize(device)
    # The dummy pool is freed before the real pool exists: not part of the steady state.
    return torch.cuda.max_memory_allocated(device) - 2 * kv[0].numel() * kv[0].element_size()

"""Builds the model runner: the platform's dtype and attention backend, the weights,
the platform's model optimizations, and the KV pool. No device branches: what
differs between devices is the platform's (inflight/platforms)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from inflight.config import EngineConfig
from inflight.distributed.parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from inflight.distributed.sharding import local_arch
from inflight.models.registry import ModelArchConfig, get_model_class
from inflight.models.weight_loading import SkipParamInit
from inflight.platforms import Platform, current_platform
from inflight.worker.kv_cache import (allocate_kv_cache, hybrid_layout, is_fp8, resolve_num_blocks,
                                      resolve_num_host_blocks, storage_dtype)
from inflight.worker.model_runner import ModelRunner
from inflight.worker.swap import Swapper

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """The torch device of the ``device`` setting (``auto``: the platform's)."""
    platform = current_platform(name)
    return platform.device() if name == "auto" else torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The model dtype the ``device``'s platform picks for the ``dtype`` setting."""
    return current_platform(device.type).resolve_dtype(name)


@dataclass
class BuiltRunner:
    runner: ModelRunner
    arch: ModelArchConfig
    num_blocks: int
    max_model_len: int
    dtype: torch.dtype
    device: torch.device
    num_host_blocks: int = 0  # host swap pool, for preemption_mode="swap"
    # each layer's window where the KV pool is laid out in layer groups (the scheduler then
    # keeps a block table per group); None: one table for every layer
    layer_windows: Optional[list[Optional[int]]] = None


def _build_model(config: EngineConfig, platform: Platform, arch: ModelArchConfig, weights,
                 device: torch.device, dtype: torch.dtype, max_len: int):
    backend = platform.attention_backend(config.attention_backend)
    with torch.device("meta"), SkipParamInit():
        model = get_model_class(arch.architecture)(arch, backend, max_len)
    # Allocate the parameters in their final dtype, so load_weights casts while it copies
    # (no float32 copy of the model, no second pass). Like Module.to_empty, but its
    # empty_like on meta tensors would run through Python decompositions (importing sympy
    # and symbolic_shapes); plain torch.empty does not. Meta parameters are contiguous.
    model = model._apply(lambda t: torch.empty(t.shape, device=device,
                                               dtype=dtype if t.is_floating_point() else t.dtype))
    if model.rope is not None:  # buffers are not in the checkpoint (None: learned positions)
        model.rope.build_cache(device)
    model.load_weights(weights)  # streams each tensor into its parameter, cast on the way
    model = model.to(dtype).eval()  # casts the rope tables, as before
    return model, backend


def build_runner(config: EngineConfig, hf_config: dict, weights) -> BuiltRunner:
    """Construct the model on its device, load weights and allocate the KV pool."""
    arch = ModelArchConfig.from_hf(hf_config)
    # this rank's heads: its KV pool holds only them (the whole model without tensor parallelism)
    kv_arch = local_arch(arch, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())
    platform = current_platform(config.device)
    platform.check_and_update_config(config)
    device = resolve_device(config.device)
    dtype = platform.resolve_dtype(config.model_config.dtype)
    if device.type != "cpu" and storage_dtype(dtype, config.cache_config.kv_cache_dtype) != dtype:
        raise ValueError(f"kv_cache_dtype='bfloat16' under a {dtype} model runs on the CPU only; "
                         "use the model's dtype ('auto') here")
    positions = arch.max_position_embeddings - arch.position_offset  # RoBERTa's first rows are no position
    max_len = config.model_config.max_model_len or positions
    if max_len > positions:
        logger.warning("max_model_len %d exceeds the model's %d positions", max_len, positions)
    platform.prepare_process()
    model, backend = _build_model(config, platform, arch, weights, device, dtype, max_len)
    # the fused projections' shard rows, read before packing replaces those modules
    shard_rows = model.stacked_shard_rows() if hasattr(model, "stacked_shard_rows") else {}
    done = platform.optimize_model(model, dtype, config)
    logger.info("%s, %s: %s", platform.describe(), dtype, ", ".join(done) or "plain torch")
    cc = config.cache_config
    peak = platform.profile_peak_bytes(model, kv_arch, dtype, max_len, config)
    layout = hybrid_layout(kv_arch, model)  # windowed and global layers: a block per layer group
    num_blocks = resolve_num_blocks(kv_arch, cc.block_size, dtype, device, cc.kv_cache_memory,
                                    cc.gpu_memory_utilization, cc.num_gpu_blocks_override, cc.kv_cache_dtype,
                                    profiled_peak_bytes=peak, num_layers=layout and layout.group_size)
    # NOTE: an encoder keeps no KV (its attention reads the step's own rows): the scheduler still
    # counts num_blocks of tokens in flight, but the pool behind them is one block
    pool_blocks = num_blocks if getattr(model, "uses_kv_cache", True) else 1
    kv = allocate_kv_cache(kv_arch, pool_blocks, cc.block_size, dtype, device, cc.kv_cache_dtype, platform.zeros,
                           layout and layout.layer_pools)
    platform.prefault(kv)
    kv_dtype = "fp8_e4m3 + bf16 scales" if is_fp8(cc.kv_cache_dtype) else str(storage_dtype(dtype, cc.kv_cache_dtype))
    logger.info("KV cache: %d blocks = %d tokens (%s, %s)", num_blocks, num_blocks * cc.block_size, kv_dtype, device)
    if layout is not None:
        logger.info("KV cache in layer groups (windows per layer %s): a block holds %d of the %d layers",
                    layout.layer_windows, layout.group_size, len(layout.layer_windows))
    num_host = 0
    if config.scheduler_config.preemption_mode == "swap":
        num_host = resolve_num_host_blocks(kv_arch, cc.block_size, dtype, cc.kv_cache_dtype, cc.swap_space,
                                           cc.num_cpu_blocks_override)
        logger.info("swap space: %d host blocks = %d tokens", num_host, num_host * cc.block_size)
    runner = ModelRunner(model, kv, cc.block_size, arch.vocab_size, device, config.model_config.seed,
                         swapper=Swapper(kv, num_host, device), layer_groups=layout and layout.layer_groups)
    if config.lora_config is not None:  # after the platform's packing: the LoRA layers wrap the packed linears
        from inflight.lora.manager import LoRAManager
        from inflight.models.registry import arch_spec
        runner.lora = LoRAManager(model, config.lora_config, arch_spec(arch.architecture).stacked, shard_rows,
                                  dtype, device, platform.lora_linear(dtype, config))
        logger.info("LoRA: %d projections adaptable, up to %d adapters a step, rank up to %d",
                    len(runner.lora.targets), config.lora_config.max_loras, config.lora_config.max_lora_rank)
    if layout is None:  # a captured graph holds one block table per request: hybrid layouts run eagerly
        platform.attach_graph_runner(runner, model, kv, backend, max_len, config)
    return BuiltRunner(runner, arch, num_blocks, max_len, dtype, device, num_host,
                       layout and layout.layer_windows)

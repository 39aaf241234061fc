"""Builds the model runner: device and dtype choice, weights, KV pool."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from inflight.attention import get_attention_backend
from inflight.config import EngineConfig
from inflight.kernels.cpu.fused import enable_fused_ops, load_fused_ops
from inflight.kernels.cpu.layer_loop import CpuLayerLoop
from inflight.kernels.cpu.packing import can_pack, pack_linears
from inflight.models.registry import ModelArchConfig, get_model_class
from inflight.worker.cpu_malloc import keep_freed_memory
from inflight.worker.kv_cache import (allocate_kv_cache, profile_forward_peak, resolve_num_blocks,
                                      resolve_num_host_blocks)
from inflight.worker.model_runner import ModelRunner
from inflight.worker.swap import Swapper

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA device is available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 where the hardware runs it fast (CUDA, or a CPU with bf16 units)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        bf16_ok = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()
        return torch.bfloat16 if bf16_ok else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
    return _DTYPES[name]


class _SkipParamInit(TorchFunctionMode):
    """Turns the ``torch.nn.init`` fills that module constructors run into no-ops.

    Used while the model is built on the meta device: those values are never kept
    (``to_empty`` + ``load_weights`` replace every parameter), yet initializing a meta
    tensor goes through torch's Python decompositions, whose first use imports
    torch._dynamo (about 1 s of start-up). Torch function modes are per-thread, so
    modules built by other threads at the same time are unaffected.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@dataclass
class BuiltRunner:
    runner: ModelRunner
    arch: ModelArchConfig
    num_blocks: int
    max_model_len: int
    dtype: torch.dtype
    device: torch.device
    num_host_blocks: int = 0  # host swap pool, for preemption_mode="swap"


def build_runner(config: EngineConfig, hf_config: dict, weights: dict) -> BuiltRunner:
    """Construct the model on its device, load weights and allocate the KV pool."""
    arch = ModelArchConfig.from_hf(hf_config)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.model_config.dtype, device)
    max_len = config.model_config.max_model_len or arch.max_position_embeddings
    if max_len > arch.max_position_embeddings:
        logger.warning("max_model_len %d exceeds the model's max_position_embeddings %d",
                       max_len, arch.max_position_embeddings)
    cls = get_model_class(arch.architecture)
    if device.type == "cpu":
        keep_freed_memory()
    backend = get_attention_backend(config.attention_backend, device)
    with torch.device("meta"), _SkipParamInit():
        model = cls(arch, backend, max_len)
    # Allocate the parameters in their final dtype, so load_weights casts while it copies
    # (no float32 copy of the model, no second pass). Like Module.to_empty, but its
    # empty_like on meta tensors would run through Python decompositions (importing sympy
    # and symbolic_shapes); plain torch.empty does not. Meta parameters are contiguous.
    model = model._apply(lambda t: torch.empty(t.shape, device=device,
                                               dtype=dtype if t.is_floating_point() else t.dtype))
    model.rope.build_cache(device)  # buffers are not in the checkpoint
    model.load_weights(weights.items())
    model = model.to(dtype).eval()  # casts the rope tables, as before
    # NOTE: attention_backend="torch" is the plain-torch reference path everywhere
    # (tests compare the fast path against it), so it skips the CPU fast path too.
    if config.attention_backend != "torch" and can_pack(device, dtype):
        pack_linears(model)
        fused = load_fused_ops()
        if fused is not None:
            enable_fused_ops(model, fused)
            if hasattr(model, "layer_loop"):
                model.layer_loop = CpuLayerLoop.build(model)
                logger.info("decoder layers in one C call: %s", model.layer_loop is not None)
    cc = config.cache_config
    sc = config.scheduler_config
    # --- GPU: size the pool after profiling the worst-case step (issue 8) ---
    peak = None
    if device.type == "cuda" and cc.kv_cache_memory is None and not cc.num_gpu_blocks_override:
        peak = profile_forward_peak(model, arch, cc.block_size, dtype, device, sc.max_num_batched_tokens,
                                    max_len, sc.max_num_seqs)
        logger.info("profiled step of %d tokens: peak %.2f GiB (weights + activations)",
                    sc.max_num_batched_tokens, peak / 2**30)
    # --- end profiling ---
    num_blocks = resolve_num_blocks(arch, cc.block_size, dtype, device, cc.kv_cache_memory,
                                    cc.gpu_memory_utilization, cc.num_gpu_blocks_override, cc.kv_cache_dtype,
                                    profiled_peak_bytes=peak)
    kv = allocate_kv_cache(arch, num_blocks, cc.block_size, dtype, device, cc.kv_cache_dtype)
    kv_dtype = "fp8_e4m3 + bf16 scales" if cc.kv_cache_dtype != "auto" else str(dtype)
    logger.info("KV cache: %d blocks = %d tokens (%s, %s)", num_blocks, num_blocks * cc.block_size, kv_dtype, device)
    num_host = 0
    if config.scheduler_config.preemption_mode == "swap":
        num_host = resolve_num_host_blocks(arch, cc.block_size, dtype, cc.kv_cache_dtype, cc.swap_space,
                                           cc.num_cpu_blocks_override)
        logger.info("swap space: %d host blocks = %d tokens", num_host, num_host * cc.block_size)
    runner = ModelRunner(model, kv, cc.block_size, arch.vocab_size, device, config.model_config.seed,
                         swapper=Swapper(kv, num_host, device))
    # --- CUDA graphs for decode-only steps (issue 8) ---
    if device.type == "cuda" and not config.enforce_eager and hasattr(backend, "fixed_splits") \
            and cc.kv_cache_dtype == "auto":
        from inflight.worker.cuda_graphs import CudaGraphRunner
        runner.graph_runner = CudaGraphRunner(model, kv, backend, cc.block_size, max_len, sc.max_num_seqs, device)
        runner.graph_runner.capture()
    # --- end CUDA graphs ---
    return BuiltRunner(runner, arch, num_blocks, max_len, dtype, device, num_host)

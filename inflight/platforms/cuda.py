"""The CUDA platform: Triton attention, a KV pool sized by profiling, CUDA graphs."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from inflight.attention import AttentionBackend, get_attention_backend
from inflight.layers.custom_op import dispatch_custom_ops
from inflight.platforms.interface import Platform, parse_dtype

if TYPE_CHECKING:
    from inflight.config import EngineConfig
    from inflight.models.registry import ModelArchConfig
    from inflight.platforms.placement import ReplicaPlacement

logger = logging.getLogger(__name__)


class CudaPlatform(Platform):
    """NVIDIA GPUs."""

    device_type = "cuda"
    default_max_num_seqs = 256
    default_max_num_batched_tokens = 2048

    def replica_placements(self, num_replicas: int) -> list["ReplicaPlacement"]:
        """Each data-parallel replica sees its own GPUs (CUDA_VISIBLE_DEVICES), as vLLM's DP ranks do."""
        import os

        from inflight.platforms.placement import split_devices

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        placements = super().replica_placements(num_replicas)
        for placement, devices in zip(placements, split_devices(ids, num_replicas)):
            placement.env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        return placements

    def resolve_dtype(self, name: str) -> torch.dtype:
        return torch.bfloat16 if name == "auto" else parse_dtype(name)

    def attention_backend(self, name: str) -> AttentionBackend:
        return get_attention_backend(name, torch.device("cuda"))

    def optimize_model(self, model: nn.Module, dtype: torch.dtype, config: "EngineConfig") -> list[str]:
        return [f"{dispatch_custom_ops(model, 'cuda')} CUDA ops"]

    def profile_peak_bytes(self, model: nn.Module, arch: "ModelArchConfig", dtype: torch.dtype,
                           max_len: int, config: "EngineConfig") -> Optional[int]:
        """The KV pool gets what a worst-case step leaves of ``gpu_memory_utilization``."""
        cc, sc = config.cache_config, config.scheduler_config
        if cc.kv_cache_memory is not None or cc.num_gpu_blocks_override:
            return None
        from inflight.worker.kv_cache import profile_forward_peak
        device = torch.device(config.device if config.device.startswith("cuda") else "cuda")
        peak = profile_forward_peak(model, arch, cc.block_size, dtype, device, sc.max_num_batched_tokens,
                                    max_len, sc.max_num_seqs)
        logger.info("profiled step of %d tokens: peak %.2f GiB (weights + activations)",
                    sc.max_num_batched_tokens, peak / 2**30)
        return peak

    def attach_graph_runner(self, runner, model: nn.Module, kv: list, backend: AttentionBackend,
                            max_len: int, config: "EngineConfig") -> None:
        """Decode-only steps replay CUDA graphs unless ``enforce_eager`` (as in vLLM); a
        pooling model never decodes."""
        cc = config.cache_config
        if config.enforce_eager or not hasattr(backend, "fixed_splits") or cc.kv_cache_dtype != "auto" \
                or config.model_config.pooler_config is not None:
            return
        from inflight.worker.cuda_graphs import CudaGraphRunner
        runner.graph_runner = CudaGraphRunner(model, kv, backend, cc.block_size, max_len,
                                              config.scheduler_config.max_num_seqs, runner.device)
        runner.graph_runner.capture()

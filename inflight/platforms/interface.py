"""``Platform``: what differs between device kinds, decided in one place.

As vLLM's ``vllm/platforms``: one subclass per device kind, detected once. The
model runner's builder asks the platform for the dtype "auto" means, the attention
backend, the engine defaults that fit the device, and to optimize a loaded model
(weight packing, per-platform ops, a fused layer loop); it has no device branches.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from inflight.attention import AttentionBackend

if TYPE_CHECKING:
    from inflight.config import EngineConfig
    from inflight.models.registry import ModelArchConfig
    from inflight.platforms.placement import ReplicaPlacement

DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "half": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
    return DTYPES[name]


class Platform(abc.ABC):
    """One device kind. Subclasses set ``device_type`` and the defaults below."""

    device_type: str
    # Scheduler defaults where the user sets none: the seats and the per-step token
    # budget that give this device its best throughput at an acceptable TPOT.
    default_max_num_seqs: int = 64
    default_max_num_batched_tokens: int = 512

    def device(self) -> torch.device:
        return torch.device(self.device_type)

    @abc.abstractmethod
    def resolve_dtype(self, name: str) -> torch.dtype:
        """The model dtype for the ``dtype`` setting ("auto": the fastest exact-enough one)."""

    @abc.abstractmethod
    def attention_backend(self, name: str) -> AttentionBackend:
        """The attention backend for the ``attention_backend`` setting."""

    def check_and_update_config(self, config: "EngineConfig") -> None:
        """Fill in the settings left to the platform (vLLM's name for this hook)."""
        sc = config.scheduler_config
        if sc.max_num_seqs is None:
            sc.max_num_seqs = self.default_max_num_seqs
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = self.default_max_num_batched_tokens

    def prepare_process(self) -> None:
        """Process-wide settings before the model is built (allocator tuning...)."""

    def optimize_model(self, model: nn.Module, dtype: torch.dtype, config: "EngineConfig") -> list[str]:
        """Turn a loaded model into its fast form for this device; returns what was done.
        The default keeps the plain-torch model."""
        return []

    def lora_linear(self, dtype: torch.dtype, config: "EngineConfig") -> Optional[type[nn.Module]]:
        """The linear class LoRA adapters' weights are held in (built from a weight and a
        bias, as ``nn.Linear``'s), so they run on the projections' fast kernels; None:
        plain torch matmuls."""
        return None

    def profile_peak_bytes(self, model: nn.Module, arch: "ModelArchConfig", dtype: torch.dtype,
                           max_len: int, config: "EngineConfig") -> Optional[int]:
        """Peak bytes of a worst-case step, where the KV pool is sized from what is left; else None."""
        return None

    def attach_graph_runner(self, runner, model: nn.Module, kv: list, backend: AttentionBackend,
                            max_len: int, config: "EngineConfig") -> None:
        """Capture replayable graphs for decode steps where the device has them."""

    def zeros(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled tensor on this device, for long-lived pools (the KV cache)."""
        return torch.zeros(shape, dtype=dtype, device=self.device())

    def prefault(self, pools: list) -> None:
        """Called once the KV pools are made (``zeros``): bring their pages in off the hot
        path where this device maps them lazily. Nothing by default."""

    def describe(self) -> str:
        return self.device_type

    def replica_placements(self, num_replicas: int) -> list["ReplicaPlacement"]:
        """Where each data-parallel replica runs (engine/dp/): by default an equal slice of
        the host's cores each."""
        from inflight.platforms.placement import split_host_cores

        return split_host_cores(num_replicas)

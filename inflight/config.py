"""Engine settings, grouped as in vLLM (model, cache, scheduler)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional


@dataclass
class ModelConfig:
    """Which weights to load and how: ``model`` is an HF folder or a .gguf file;
    None means the embedded SmolLM2-135M-Instruct."""

    model: Optional[str] = None
    tokenizer: Optional[str] = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: Optional[int] = None
    seed: int = 0
    served_model_name: Optional[str] = None


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory budget and prefix caching."""

    block_size: int = 16
    kv_cache_memory: Optional[int] = None  # bytes for the pool on CPU
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: Optional[int] = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    swap_space: float = 0.0  # GiB of host memory for swap preemption


@dataclass
class SchedulerConfig:
    """Per-step budget and admission limits."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no per-request chunk cap
    scheduling_policy: str = "fcfs"  # fcfs | priority
    preemption_mode: str = "recompute"
    scheduling: str = "continuous"  # continuous | static (request-level batching, for comparison)
    static_padding: bool = True  # static only: finished members keep computing padding rows


@dataclass
class EngineConfig:
    """Everything the engine needs; build it with :meth:`from_kwargs`."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"
    attention_backend: str = "auto"  # auto | torch | cpu
    trace_file: Optional[str] = None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Route flat vLLM-style keyword arguments to the right sub-config."""
        groups: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "sched": {}, "top": {}}
        names = {
            "model": {f.name for f in fields(ModelConfig)},
            "cache": {f.name for f in fields(CacheConfig)},
            "sched": {f.name for f in fields(SchedulerConfig)},
            "top": {"device", "trace_file", "attention_backend"},
        }
        for key, value in kwargs.items():
            for group, known in names.items():
                if key in known:
                    groups[group][key] = value
                    break
            else:
                raise TypeError(f"unknown engine argument: {key!r}")
        cfg = cls(ModelConfig(**groups["model"]), CacheConfig(**groups["cache"]),
                  SchedulerConfig(**groups["sched"]), **groups["top"])
        cfg.validate()
        return cfg

    def validate(self) -> None:
        s, c = self.scheduler_config, self.cache_config
        if s.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {s.max_num_seqs}")
        if s.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {s.max_num_batched_tokens}")
        if c.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {c.block_size}")
        if s.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {s.scheduling_policy!r}")
        if s.scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling must be 'continuous' or 'static', got {s.scheduling!r}")
        if s.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {s.preemption_mode!r}")

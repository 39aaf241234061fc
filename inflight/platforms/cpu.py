"""The CPU platform: kernels compiled for the CPU's vector ISA (kernels/cpu/isa.py)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from inflight.attention import AttentionBackend, get_attention_backend
from inflight.attention.kv_quant import is_quantized
from inflight.distributed.parallel_state import get_tensor_model_parallel_world_size
from inflight.kernels.cpu.isa import current_level
from inflight.layers.custom_op import dispatch_custom_ops
from inflight.platforms.cpu_topology import physical_cores
from inflight.platforms.interface import Platform, parse_dtype
from inflight.worker.cpu_malloc import keep_freed_memory
from inflight.worker.huge_pages import prefault_when_idle, zeros_huge

if TYPE_CHECKING:
    from inflight.config import EngineConfig

logger = logging.getLogger(__name__)


class CpuPlatform(Platform):
    """x86-64 (AVX2, AVX-512, AVX-512-BF16) and aarch64 (NEON) CPUs, and a portable C fallback."""

    device_type = "cpu"
    # Every request of a burst gets a seat at once (a queue behind 64 seats multiplied the
    # decode workload's TTFT p99). 1024 tokens a step rather than 512: with a hundred
    # decodes in every step, 512 left prefills too little budget (a higher chat TTFT p99,
    # and less throughput); measured in benchmarks/README.md.
    default_max_num_seqs = 256
    default_max_num_batched_tokens = 1024

    def __init__(self) -> None:
        self.isa = current_level()

    def resolve_dtype(self, name: str) -> torch.dtype:
        """"auto" is bfloat16 only where the CPU has bf16 dot-product units: elsewhere
        torch's bf16 matmul runs ~100x slower than fp32, and our fp32 kernels run at
        the fp32 peak."""
        if name == "auto":
            return torch.bfloat16 if self.isa is not None and self.isa.has_bf16_dot else torch.float32
        return parse_dtype(name)

    def attention_backend(self, name: str) -> AttentionBackend:
        return get_attention_backend(name, torch.device("cpu"))

    def prepare_process(self) -> None:
        """No more threads than physical cores: two GEMM threads on SMT siblings of one core
        share its vector units and make every parallel region wait for the slower one."""
        keep_freed_memory()
        cores = len(physical_cores())
        if torch.get_num_threads() > cores:
            logger.info("%d threads for %d physical cores: using %d", torch.get_num_threads(), cores, cores)
            torch.set_num_threads(cores)

    def optimize_model(self, model: nn.Module, dtype: torch.dtype, config: "EngineConfig") -> list[str]:
        """Packed linears, the C element-wise ops and the one-call layer loop, where the
        kernels run for ``dtype``. NOTE: attention_backend="torch" is the plain-torch
        reference path everywhere (tests compare the fast path against it): no kernels."""
        if config.attention_backend == "torch" or self.isa is None:
            return []
        from inflight.kernels.cpu.layer_loop import CpuLayerLoop
        from inflight.kernels.cpu.lowbit_rows import tune_lowbit_max_rows
        from inflight.kernels.cpu.packing import pack_linears

        done = []
        packed = pack_linears(model, dtype, logits=config.model_config.pooler_config is None)
        if packed:
            done.append(f"{packed} packed linears")
            rows = tune_lowbit_max_rows(model)
            if rows is not None:
                done.append(f"low-bit panels up to {rows} rows")
        done.append(f"{dispatch_custom_ops(model, 'cpu')} CPU ops")
        # NOTE: the C layer loop has no all-reduce between a layer's halves: tensor-parallel
        # ranks run op by op (packed linears, C element-wise ops and attention).
        plan = model.layer_plan() if hasattr(model, "layer_plan") and hasattr(model, "layer_loop") \
            and get_tensor_model_parallel_world_size() == 1 else None
        if plan is not None:
            model.layer_loop = CpuLayerLoop.build(plan, dtype)
            if model.layer_loop is not None:
                done.append("layers in one C call")
        return done

    def lora_linear(self, dtype: torch.dtype, config: "EngineConfig") -> Optional[type[nn.Module]]:
        """The packed linears of ``optimize_model``: the fused layer loop then runs the
        adapters' GEMMs too."""
        if config.attention_backend == "torch" or self.isa is None:
            return None
        from inflight.kernels.cpu.packing import packed_linear_class

        return packed_linear_class(dtype)

    def zeros(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Huge pages for the pools: decode attention's scattered block reads are bound by
        TLB misses on 4 KiB pages."""
        return zeros_huge(shape, dtype)

    def prefault(self, pools: list) -> None:
        """The huge-page pools would fault in as they fill, inside the first steps' KV
        writes; a thread at idle priority brings them in first where a core is free."""
        prefault_when_idle([t for pair in pools for cache in pair
                            for t in (cache.tensors() if is_quantized(cache) else (cache,))])

    def describe(self) -> str:
        return f"cpu ({self.isa.name if self.isa else 'no kernels'}, {torch.get_num_threads()} threads)"

"""The host swap pool and the block copies of swap preemption.

The scheduler decides which blocks move (core/swap.py) and lists the copies in
``SchedulerOutput.blocks_to_swap_out`` / ``blocks_to_swap_in``; the runner
calls :meth:`Swapper.apply` before the forward pass of the step.
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch

from inflight.attention.kv_quant import FP8KVCache
from inflight.core.outputs import SchedulerOutput

logger = logging.getLogger(__name__)


def _pool_tensors(kv_caches: Iterable[tuple]) -> list[torch.Tensor]:
    """Every device tensor whose first dimension is the block id (K and V; an fp8 pool's
    byte buffer, its values and scales together)."""
    out: list[torch.Tensor] = []
    for layer in kv_caches:
        for cache in layer:
            out.extend(cache.tensors() if isinstance(cache, FP8KVCache) else (cache,))
    return out


class Swapper:
    """Host mirror of the device KV pools with ``num_host_blocks`` blocks.

    On CUDA the host pool is pinned and host -> device copies are non-blocking
    (ordered before the forward pass on the same stream); device -> host copies
    are synchronised before the host pool is written, because the host side of
    a copy is plain CPU memory that the next swap-in may read. On the CPU device
    it is still a separate pool, so the mechanism is exercised everywhere.

    NOTE: every source block of a step is read before any destination is
    written, so a block freed by one copy may be the destination of another
    (the scheduler relies on this; see core/swap.py).
    """

    def __init__(self, kv_caches: list, num_host_blocks: int, device: torch.device) -> None:
        self.device = device
        self.device_tensors = _pool_tensors(kv_caches) if num_host_blocks > 0 else []
        pin = device.type == "cuda"
        self.host_tensors = [torch.zeros((num_host_blocks, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
                             for t in self.device_tensors]
        self.num_host_blocks = num_host_blocks
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host_tensors)

    def apply(self, sched: SchedulerOutput) -> None:
        """Perform this step's swap-out and swap-in copies."""
        outs, ins = sched.blocks_to_swap_out, sched.blocks_to_swap_in
        if not outs and not ins:
            return
        assert self.host_tensors, "the scheduler swapped with no host pool"
        # Read every source first (the snapshot the scheduler assumed) ...
        out_data: list[torch.Tensor] = []
        in_data: list[torch.Tensor] = []
        if outs:
            src = torch.tensor([d for d, _ in outs], dtype=torch.int64, device=self.device)
            out_data = [t.index_select(0, src) for t in self.device_tensors]
        if ins:
            src = torch.tensor([h for h, _ in ins], dtype=torch.int64)
            in_data = [self._staged(t.index_select(0, src)) for t in self.host_tensors]
        # ... then write every destination.
        if outs:
            dst = torch.tensor([h for _, h in outs], dtype=torch.int64)
            on_host = [x.to("cpu", non_blocking=self.device.type == "cuda") for x in out_data]
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            for host, x in zip(self.host_tensors, on_host):
                host.index_copy_(0, dst, x)
            self.num_blocks_swapped_out += len(outs)
        if ins:
            dst = torch.tensor([d for _, d in ins], dtype=torch.int64, device=self.device)
            for dev, x in zip(self.device_tensors, in_data):
                dev.index_copy_(0, dst, x.to(self.device, non_blocking=True))
            self.num_blocks_swapped_in += len(ins)

    def _staged(self, x: torch.Tensor) -> torch.Tensor:
        # Pinned staging (from torch's caching host allocator, which keeps it alive until
        # the asynchronous copy has finished) makes the host -> device copy non-blocking.
        return x.pin_memory() if self.device.type == "cuda" else x

"""A request's KV blocks to and from one contiguous host buffer, the unit a transfer moves.

Layout: for each pool tensor (per layer K then V; an fp8 pool's one byte buffer; the order of
``worker/swap.py``), the request's blocks back to back. A consumer can then copy
any run of the blocks into its own pool with one ``index_copy_`` per tensor.
"""
from __future__ import annotations

import torch

from inflight.worker.swap import _pool_tensors


class BlockCopier:
    """Gathers blocks of every layer of the KV pool into one buffer and scatters them back."""

    def __init__(self, kv_caches: list, device: torch.device) -> None:
        self.tensors = _pool_tensors(kv_caches)
        self.device = device
        self.tensor_block_bytes = [t[0].numel() * t.element_size() for t in self.tensors]
        self.block_bytes = sum(self.tensor_block_bytes)

    def _views(self, buffer: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
        views, offset = [], 0
        for t, per_block in zip(self.tensors, self.tensor_block_bytes):
            nbytes = num_blocks * per_block
            views.append(buffer[offset:offset + nbytes].view(t.dtype).view(num_blocks, *t.shape[1:]))
            offset += nbytes
        return views

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """A uint8 host buffer holding ``block_ids`` of every pool tensor."""
        n = len(block_ids)
        buffer = torch.empty(n * self.block_bytes, dtype=torch.uint8)
        if not n:
            return buffer
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for t, view in zip(self.tensors, self._views(buffer, n)):
            if self.device.type == "cpu":
                torch.index_select(t, 0, index, out=view)
            else:
                view.copy_(t.index_select(0, index))
        return buffer

    def scatter(self, buffer: torch.Tensor, first: int, block_ids: list[int]) -> None:
        """Write the buffer's blocks ``first`` .. ``first + len(block_ids) - 1`` into ``block_ids``."""
        if not block_ids:
            return
        n = buffer.numel() // self.block_bytes
        if first < 0 or first + len(block_ids) > n:
            raise ValueError(f"blocks {first}..{first + len(block_ids) - 1} are not in a buffer of {n}")
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for t, view in zip(self.tensors, self._views(buffer, n)):
            t.index_copy_(0, index, view[first:first + len(block_ids)].to(self.device, non_blocking=True))

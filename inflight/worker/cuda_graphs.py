"""CUDA graphs for decode-only steps.

A decode step of a small model is dominated by kernel-launch overhead on the
host (hundreds of small kernels per step), not by the GPU. Capturing the
forward pass once per batch size and replaying it removes that overhead.

A graph freezes shapes and addresses, so:

- batch sizes are bucketed (1, 2, 4, then multiples of 8, as vLLM does); a step
  of ``n`` decodes runs the smallest bucket ``>= n`` with padding rows;
- inputs are copied into static buffers before each replay; padding rows get
  slot -1 (the Triton write_kv kernel skips them) and context length 0 (the
  decode kernel writes zeros for them), so they touch no real request's cache;
- the decode kernel's split count is frozen per bucket, chosen for
  ``max_model_len`` (the kernel reads the real lengths from device memory);
- mixed steps (any prefill chunk), batches above the largest bucket and block
  tables wider than the static one run eagerly.

``enforce_eager=True`` (engine argument ``--enforce-eager``) turns graphs off.
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch

from inflight.attention.base import AttentionMetadata

logger = logging.getLogger(__name__)

PAD_SLOT = -1
MAX_CAPTURE_SIZE = 256


def capture_sizes(max_num_seqs: int, max_size: int = MAX_CAPTURE_SIZE) -> list[int]:
    """Bucket sizes: 1, 2, 4, then multiples of 8, and ``min(max_num_seqs, max_size)`` itself
    (a batch never exceeds max_num_seqs, so no bucket above it is needed)."""
    top = max(1, min(max_num_seqs, max_size))
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    if sizes[-1] < top:
        sizes.append(top)
    return sizes


def padded_size(n: int, sizes: list[int]) -> Optional[int]:
    """The smallest bucket that holds ``n`` rows, or None when ``n`` is above every bucket."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass
class StaticDecodeInputs:
    """The buffers every captured graph reads; sized for the largest bucket."""

    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    slot_mapping: torch.Tensor  # [B] int64
    block_tables: torch.Tensor  # [B, max_blocks] int64
    seq_lens: torch.Tensor  # [B] int64

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, device: torch.device) -> "StaticDecodeInputs":
        def z(*shape):
            return torch.zeros(shape, dtype=torch.int64, device=device)

        s = cls(z(max_batch), z(max_batch), z(max_batch), z(max_batch, max_blocks), z(max_batch))
        s.slot_mapping.fill_(PAD_SLOT)
        return s

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata, padded: int) -> None:
        """Copy a step's ``n`` decode rows in and turn rows ``n..padded-1`` into padding."""
        n, width = input_ids.shape[0], md.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(md.seq_lens, non_blocking=True)
        # Columns past ``width`` keep stale block ids: never read, as seq_lens bounds every read.
        self.block_tables[:n, :width].copy_(md.block_tables, non_blocking=True)
        if padded > n:
            self.input_ids[n:padded].zero_()
            self.positions[n:padded].zero_()
            self.slot_mapping[n:padded].fill_(PAD_SLOT)
            self.seq_lens[n:padded].zero_()

    def metadata(self, size: int, block_size: int, max_seq_len: int) -> AttentionMetadata:
        """Decode-only metadata over the first ``size`` rows (the lists are only shapes)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size], query_start_loc_list=list(range(size + 1)),
            seq_lens_list=[max_seq_len] * size, num_decodes=size, block_size=block_size,
            max_decode_seq_len=max_seq_len)


def is_decode_only(md: AttentionMetadata) -> bool:
    return md.num_reqs > 0 and md.num_decodes == md.num_reqs


class CudaGraphRunner:
    """Captures ``model(input_ids, positions, kv_caches, md)`` for decode-only batches
    at every bucket size and replays the right one; :meth:`can_run` says when."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, backend, block_size: int, max_model_len: int,
                 max_num_seqs: int, device: torch.device, sizes: Optional[list[int]] = None) -> None:
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.block_size, self.max_model_len, self.device = block_size, max_model_len, device
        self.sizes = sizes or capture_sizes(max_num_seqs)
        self.max_blocks = -(-max_model_len // block_size)
        self.static = StaticDecodeInputs.allocate(self.sizes[-1], self.max_blocks, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0

    def can_run(self, input_ids: torch.Tensor, md: AttentionMetadata) -> bool:
        """Decode-only, one block table for every layer, within the largest captured bucket and
        the static block-table width."""
        return (md.per_layer is None and is_decode_only(md) and md.num_reqs <= self.sizes[-1]
                and md.block_tables.shape[1] <= self.max_blocks
                and padded_size(md.num_reqs, self.sizes) in self.graphs)

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every bucket, largest first (smaller graphs reuse its memory pool); seconds taken."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        num_kv_heads = self.kv_caches[0][0].shape[2]
        for size in sorted(self.sizes, reverse=True):
            md = self.static.metadata(size, self.block_size, self.max_model_len)
            splits = self._splits(size, num_kv_heads)
            ids, pos = self.static.input_ids[:size], self.static.positions[:size]
            with self.backend.fixed_splits(splits):
                self.model(ids, pos, self.kv_caches, md)  # warm-up: compiles kernels, sizes workspaces
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = self.model(ids, pos, self.kv_caches, md)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        logger.info("CUDA graphs: captured %d decode batch sizes (%d..%d) in %.1f s",
                    len(self.graphs), self.sizes[0], self.sizes[-1], seconds)
        return seconds

    def _splits(self, size: int, num_kv_heads: int) -> int:
        if hasattr(self.backend, "num_splits_for"):
            q = self.static.input_ids  # only its device matters
            return self.backend.num_splits_for(q, size, num_kv_heads, self.max_model_len)
        return 1

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """Replay the bucket that holds this decode batch; hidden states of its real rows."""
        n = md.num_reqs
        size = padded_size(n, self.sizes)
        self.static.fill(input_ids, positions, md, size)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:n]

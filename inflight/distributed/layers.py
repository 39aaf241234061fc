"""Tensor-parallel layers, named as vLLM's (``vllm/model_executor/layers/linear.py``,
``vocab_parallel_embedding.py``).

Column-parallel linears split their output features (fused q/k/v and gate/up:
each shard split on its own, so each rank holds its heads' q, k and v rows), row-
parallel linears split their input features and sum the partial products with one
all-reduce. The embedding and the logits projection split the vocabulary. With a
world of one every layer is exactly the ``nn`` module it subclasses.

Each layer says which part of the checkpoint tensor it holds (``checkpoint_shard``),
so the loader cuts each tensor as it streams. The CPU platform packs linears into
panels (kernels/cpu/packing.py); a layer with a collective keeps it through
``packed(cls)``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                 get_tensor_model_parallel_world_size,
                                                 tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)
from inflight.distributed.sharding import HeadShard, Segments, even_split, head_shard


class ColumnParallelLinear(nn.Linear):
    """``y = x W^T + b`` with this rank's rows of W (and b): a part of each of the
    fused checkpoint shards. ``ranges[i]`` is (start, size) within shard ``i``, whose
    full row count is ``full_sizes[i]``."""

    def __init__(self, in_features: int, full_sizes: list[int], ranges: list[tuple[int, int]], bias: bool) -> None:
        super().__init__(in_features, sum(size for _, size in ranges), bias=bias)
        self.full_sizes, self.ranges = list(full_sizes), list(ranges)

    @classmethod
    def split_evenly(cls, in_features: int, full_sizes: list[int], bias: bool = False) -> "ColumnParallelLinear":
        """Each shard split into equal parts (gate/up: vLLM's MergedColumnParallelLinear)."""
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        return cls(in_features, full_sizes, [even_split(n, tp, rank, "a column-parallel shard") for n in full_sizes],
                   bias)

    def shard_rows(self) -> list[int]:
        """This rank's rows of each fused shard, in shard order."""
        return [size for _, size in self.ranges]

    def checkpoint_shard(self, param: str, shard: Optional[int]) -> Optional[Segments]:
        """Rows of checkpoint shard ``shard`` (None: of the already-fused tensor) this rank holds."""
        if get_tensor_model_parallel_world_size() == 1:
            return None
        if shard is not None:
            return 0, [self.ranges[shard]]
        offsets = [sum(self.full_sizes[:i]) for i in range(len(self.full_sizes))]
        return 0, [(off + start, size) for off, (start, size) in zip(offsets, self.ranges)]


def qkv_parallel_linear(hidden: int, head_dim: int, num_heads: int, num_kv_heads: int,
                        bias: bool) -> tuple[ColumnParallelLinear, HeadShard]:
    """The fused q/k/v projection of this rank's heads (vLLM's QKVParallelLinear)."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    heads = head_shard(num_heads, num_kv_heads, tp, rank)
    kv = (heads.kv_start * head_dim, heads.num_kv_heads * head_dim)
    layer = ColumnParallelLinear(hidden, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim],
                                 [(heads.q_start * head_dim, heads.num_heads * head_dim), kv, kv], bias)
    return layer, heads


class _ReduceAfter(nn.Module):
    """A packed linear without bias, then the all-reduce, then the bias (added once)."""

    def __init__(self, inner: nn.Module, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = tensor_model_parallel_all_reduce(self.inner(x))
        return y if self.bias is None else y + self.bias


class RowParallelLinear(nn.Linear):
    """``y = all_reduce(x_r W_r^T) + b``: this rank's columns of W times its part of x
    (the output of a column-parallel layer), summed over the ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.in_start, local_in = even_split(in_features, tp, rank, "a row-parallel layer's input")
        super().__init__(local_in, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if get_tensor_model_parallel_world_size() == 1:
            return super().forward(x)
        y = tensor_model_parallel_all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def checkpoint_shard(self, param: str, shard: Optional[int]) -> Optional[Segments]:
        if get_tensor_model_parallel_world_size() == 1 or param != "weight":
            return None  # the bias is whole on every rank
        return 1, [(self.in_start, self.in_features)]

    def packed(self, cls: Callable) -> nn.Module:
        if get_tensor_model_parallel_world_size() == 1:
            return cls(self.weight, self.bias)
        return _ReduceAfter(cls(self.weight, None), self.bias)


def vocab_range(vocab_size: int) -> tuple[int, int, int]:
    """(start, rows, rows per rank) of this rank's part of the vocabulary; the last
    rank's part may be shorter."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    per_rank = -(-vocab_size // tp)
    start = min(rank * per_rank, vocab_size)
    return start, min(per_rank, vocab_size - start), per_rank


def gather_logits(local: torch.Tensor, vocab_size: int, per_rank: int) -> torch.Tensor:
    """Every rank's vocabulary columns side by side: the full ``[rows, vocab_size]`` logits."""
    if get_tensor_model_parallel_world_size() == 1:
        return local
    if local.shape[-1] < per_rank:  # the short last part, padded so every rank sends as much
        local = F.pad(local, (0, per_rank - local.shape[-1]))
    return tensor_model_parallel_all_gather(local, dim=-1)[..., :vocab_size]


class _GatherLogits(nn.Module):
    """A (packed) projection onto this rank's vocabulary part, then the gather."""

    def __init__(self, inner: nn.Module, vocab_size: int, per_rank: int) -> None:
        super().__init__()
        self.inner, self.vocab_size, self.per_rank = inner, vocab_size, per_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_logits(self.inner(x), self.vocab_size, self.per_rank)


class VocabParallelEmbedding(nn.Embedding):
    """The embedding rows of this rank's vocabulary part; tokens of other parts look up
    zeros here, and the all-reduce sums the one rank that holds each token."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        self.vocab_start, rows, self.per_rank = vocab_range(vocab_size)
        super().__init__(rows, hidden_size)
        self.vocab_size = vocab_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if get_tensor_model_parallel_world_size() == 1:
            return super().forward(ids)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return tensor_model_parallel_all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0.0))

    def checkpoint_shard(self, param: str, shard: Optional[int]) -> Optional[Segments]:
        if get_tensor_model_parallel_world_size() == 1:
            return None
        return 0, [(self.vocab_start, self.num_embeddings)]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied logits projection: this part's logits, gathered."""
        return gather_logits(F.linear(hidden, self.weight), self.vocab_size, self.per_rank)

    def tied_head(self, factory: Callable) -> nn.Module:
        """A (packed) logits projection of these rows that gathers the full logits."""
        head = factory(self.weight, None)
        return head if get_tensor_model_parallel_world_size() == 1 else _GatherLogits(head, self.vocab_size,
                                                                                        self.per_rank)


class ParallelLMHead(nn.Linear):
    """The untied logits projection over this rank's vocabulary part, gathered to the full logits."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        self.vocab_start, rows, self.per_rank = vocab_range(vocab_size)
        super().__init__(hidden_size, rows, bias=False)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_logits(super().forward(x), self.vocab_size, self.per_rank)

    def checkpoint_shard(self, param: str, shard: Optional[int]) -> Optional[Segments]:
        if get_tensor_model_parallel_world_size() == 1:
            return None
        return 0, [(self.vocab_start, self.out_features)]

    def packed(self, cls: Callable) -> nn.Module:
        head = cls(self.weight, None)
        if get_tensor_model_parallel_world_size() == 1:
            return head
        return _GatherLogits(head, self.vocab_size, self.per_rank)

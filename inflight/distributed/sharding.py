"""How a model's heads and rows split over the tensor-parallel ranks.

Attention heads split evenly (``num_attention_heads % tp == 0``, as vLLM requires);
KV heads split evenly too, or, when there are fewer KV heads than ranks, each rank
holds the one KV head its query heads read (replicated on ``tp / num_kv_heads``
ranks). A checkpoint tensor is cut by ``Segments``: the row or column ranges of the
full tensor that make this rank's shard, concatenated in order.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from inflight.models.registry import ModelArchConfig

# (dim, [(start, size), ...]): the ranges of the checkpoint tensor along ``dim`` that,
# concatenated, are this rank's part of a parameter.
Segments = tuple[int, list[tuple[int, int]]]


@dataclass(frozen=True)
class HeadShard:
    """One rank's attention heads: query heads [q_start, q_start + num_heads),
    KV heads [kv_start, kv_start + num_kv_heads)."""

    num_heads: int
    num_kv_heads: int
    q_start: int
    kv_start: int


def check_tp_size(num_heads: int, num_kv_heads: int, tp: int) -> None:
    """ValueError when the heads cannot be split over ``tp`` ranks."""
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {tp}")
    if num_heads % tp:
        raise ValueError(f"the model's {num_heads} attention heads do not split over tensor_parallel_size={tp} "
                         f"ranks: num_attention_heads must be divisible by tensor_parallel_size")
    if (num_kv_heads >= tp and num_kv_heads % tp) or (num_kv_heads < tp and tp % num_kv_heads):
        raise ValueError(f"the model's {num_kv_heads} KV heads do not split over tensor_parallel_size={tp} ranks: "
                         "one of num_key_value_heads and tensor_parallel_size must divide the other")


def head_shard(num_heads: int, num_kv_heads: int, tp: int, rank: int) -> HeadShard:
    """The heads rank ``rank`` of ``tp`` computes."""
    check_tp_size(num_heads, num_kv_heads, tp)
    nh = num_heads // tp
    if num_kv_heads >= tp:
        nkv = num_kv_heads // tp
        return HeadShard(nh, nkv, rank * nh, rank * nkv)
    return HeadShard(nh, 1, rank * nh, rank // (tp // num_kv_heads))


def even_split(size: int, tp: int, rank: int, what: str) -> tuple[int, int]:
    """(start, size) of rank ``rank``'s equal part of ``size``; ValueError if uneven."""
    if size % tp:
        raise ValueError(f"{what} ({size}) does not split over tensor_parallel_size={tp} ranks")
    part = size // tp
    return rank * part, part


def local_arch(arch: ModelArchConfig, tp: int, rank: int) -> ModelArchConfig:
    """The config as one rank sees its shard: its heads and MLP columns (for the KV pool's size)."""
    if tp == 1:
        return arch
    heads = head_shard(arch.num_attention_heads, arch.num_key_value_heads, tp, rank)
    _, inter = even_split(arch.intermediate_size, tp, rank, "intermediate_size")
    return replace(arch, num_attention_heads=heads.num_heads, num_key_value_heads=heads.num_kv_heads,
                   intermediate_size=inter)

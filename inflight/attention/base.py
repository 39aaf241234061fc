"""The attention backend interface and the per-step metadata it reads."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class AttentionMetadata:
    """Where every token of the flattened batch lives, built once per step.

    Requests are ordered decodes first (``num_decodes`` rows of one token each),
    then prefill chunks. Request ``i`` owns query rows
    ``query_start_loc[i]:query_start_loc[i+1]`` and, after this step, has
    ``seq_lens[i]`` tokens of context in the blocks ``block_tables[i]``.

    With a hybrid KV layout (layers in groups with a block table each, core/hybrid_kv.py)
    ``per_layer[L]`` is layer L's: its group's block tables and slot mapping, the rest
    shared; a model hands each layer ``for_layer(L)``.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    block_tables: torch.Tensor  # [num_reqs, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [num_reqs] int64
    query_start_loc_list: list[int]  # [num_reqs + 1]
    seq_lens_list: list[int]
    num_decodes: int
    block_size: int
    max_decode_seq_len: int = 0
    per_layer: Optional[list["AttentionMetadata"]] = None

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_list)

    def for_layer(self, layer: int) -> "AttentionMetadata":
        """Layer ``layer``'s metadata: this one unless the KV layout has layer groups."""
        return self if self.per_layer is None else self.per_layer[layer]


class AttentionBackend(abc.ABC):
    """Writes new K/V into the paged cache and attends each request's queries
    over its own history (causal within the new tokens).

    ``sliding_window`` (a per-layer setting): the token at position p sees only keys
    (p - W, p], as transformers' sliding-window mask; keys before that are skipped,
    never read, so their blocks may already be back in the pool (the block table
    then holds a placeholder there).

    ``logits_soft_cap`` (Gemma 2): scores become ``cap * tanh(scores / cap)`` before
    the softmax."""

    @abc.abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata,
                scale: float, sliding_window: Optional[int] = None,
                logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D].
        Returns [T, H, D]."""

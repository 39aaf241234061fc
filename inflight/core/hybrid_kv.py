"""KV management for stacks that mix sliding-window and global layers (Gemma 2/3),
after vLLM's hybrid allocator.

The layers are split into groups of equal size, each group all-global or all with one
window; one block id then names the same slots in one layer of every group, so the KV
pool holds ``group size`` layers per block instead of every layer. Each group keeps its
own block table per request (a :class:`KVCacheManager` over the one shared pool, its
prefix-cache keys tagged with the group), so a windowed group hands back the blocks
behind its window while the global groups keep theirs: a long request holds the whole
context once per global group and only the window in each windowed group.

The scheduler uses it when the model's layers mix windows (``Scheduler(layer_windows=...)``)
and sends each request's tables per group; the worker's KV pool then holds ``group size``
layer pools of ``num_blocks`` blocks, layer L in the pool of its place in its group, and
each layer reads its group's block table and slot mapping (``AttentionMetadata.for_layer``).
Swap preemption and KV transfer work on one table per request: both are refused here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

from inflight.core.block_pool import BlockPool
from inflight.core.kv_cache_manager import NULL_BLOCK, ComputedBlocks, KVCacheManager
from inflight.core.request import Request


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share a block table: all global (``sliding_window`` None) or all windowed alike."""

    sliding_window: Optional[int]
    layers: tuple[int, ...]


def group_layers(layer_windows: Sequence[Optional[int]]) -> list[KVCacheGroup]:
    """Split the layers into groups of one kind and equal size (the smallest kind's count;
    a kind's last group may be smaller), global groups first."""
    by_window: dict[Optional[int], list[int]] = {}
    for layer, window in enumerate(layer_windows):
        by_window.setdefault(window or None, []).append(layer)
    size = min(len(layers) for layers in by_window.values())
    kinds = sorted(by_window, key=lambda w: -1 if w is None else w)
    return [KVCacheGroup(w, tuple(by_window[w][i:i + size])) for w in kinds for i in range(0, len(by_window[w]), size)]


class HybridComputedBlocks(NamedTuple):
    """A prefix-cache hit in every group, all of the same length."""

    per_group: list[ComputedBlocks]
    num_tokens: int


class HybridKVCacheManager:
    """The KVCacheManager interface over one pool and one :class:`KVCacheManager` per group.

    Blocks counts (``num_blocks``, ``num_free_blocks``, ``num_blocks_of``) are pool blocks,
    each holding ``group_size`` layers; ``get_block_ids`` gives one table per group."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool,
                 groups: Sequence[KVCacheGroup]) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.groups = list(groups)
        self.sliding_window = None  # no window common to every layer
        self.pool = BlockPool(num_blocks, enable_caching)
        self.managers = [KVCacheManager(num_blocks, block_size, enable_caching, g.sliding_window,
                                        pool=self.pool, group_id=i) for i, g in enumerate(self.groups)]
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks ``num_tokens`` tokens take in every group together, before any window frees some."""
        return len(self.managers) * -(-num_tokens // self.block_size)

    def max_blocks_held(self, num_tokens: int, max_chunk: int) -> int:
        return sum(m.max_blocks_held(num_tokens, max_chunk) for m in self.managers)

    def get_computed_blocks(self, request: Request) -> HybridComputedBlocks:
        """The longest prefix every group can take from the cache: each group's hit is cut
        to the shortest, until they agree (a windowed group's shorter prefix may need blocks
        it lacks, so the cut repeats)."""
        empty = HybridComputedBlocks([ComputedBlocks([], 0) for _ in self.managers], 0)
        if not self.enable_caching or request.skips_prefix_cache:
            return empty
        hashes = self.managers[0]._update_block_hashes(request)
        n = (request.num_tokens - 1) // self.block_size
        hits = [m.find_hit(hashes[:n]) for m in self.managers]
        while any(len(h) != n for h in hits):
            n = min(len(h) for h in hits)
            hits = [h if len(h) == n else m.find_hit(hashes[:n]) for m, h in zip(self.managers, hits)]
        num_tokens = n * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_tokens
        return HybridComputedBlocks([ComputedBlocks(h, num_tokens) for h in hits], num_tokens)

    def _split(self, computed: Optional[HybridComputedBlocks]) -> list[Optional[ComputedBlocks]]:
        return list(computed.per_group) if computed else [None] * len(self.managers)

    def num_blocks_to_allocate(self, request: Request, num_new_tokens: int,
                               computed: Optional[HybridComputedBlocks] = None) -> int:
        return sum(m.num_blocks_to_allocate(request, num_new_tokens, c)
                   for m, c in zip(self.managers, self._split(computed)))

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed: Optional[HybridComputedBlocks] = None, cache: bool = True) -> bool:
        """As KVCacheManager.allocate_slots, in every group or in none."""
        for m in self.managers:
            m._remove_skipped_blocks(request, request.num_computed_tokens)
        if self.num_blocks_to_allocate(request, num_new_tokens, computed) > self.pool.num_free_blocks:
            return False
        # every group's hit blocks pinned first: one group's new blocks come off the free
        # list, where another group's hit blocks may still sit
        pinned = [b for c in self._split(computed) if c for b in c.blocks if b is not NULL_BLOCK]
        self.pool.touch(pinned)
        for m, c in zip(self.managers, self._split(computed)):
            ok = m.allocate_slots(request, num_new_tokens, c, cache)
            assert ok, "a group could not allocate what the pool had room for"
        self.pool.free(pinned)
        return True

    def free(self, request: Request) -> None:
        for m in self.managers:
            m.free(request)

    def free_preempted(self, request: Request) -> None:
        for m in self.managers:
            m.free_preempted(request)

    def computed_block_ids(self, request: Request) -> list[int]:
        raise NotImplementedError("swap preemption with per-group block tables: use preemption_mode='recompute'")

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        """One block table per group."""
        return [m.get_block_ids(request_id) for m in self.managers]

    @property
    def group_windows(self) -> tuple[Optional[int], ...]:
        """Each group's sliding window (None: global), in group order."""
        return tuple(g.sliding_window for g in self.groups)

    def get_group_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """One block table per group, as the worker gets it."""
        return tuple(self.get_block_ids(request_id))

    def num_blocks_of(self, request_id: str) -> int:
        return sum(m.num_blocks_of(request_id) for m in self.managers)

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Pool invariants, and every block's ref count equal to its holders across all groups."""
        self.pool.check_integrity()
        counts: dict[int, int] = {}
        for m in self.managers:
            for block_id, n in m.held_block_counts().items():
                counts[block_id] = counts.get(block_id, 0) + n
        for b in self.pool.blocks:
            assert b.ref_cnt == counts.get(b.block_id, 0), \
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != holders {counts.get(b.block_id, 0)}"


def make_kv_cache_manager(num_blocks: int, block_size: int, enable_caching: bool, sliding_window: Optional[int],
                          layer_windows: Optional[Sequence[Optional[int]]] = None,
                          preemption_mode: str = "recompute") -> Union[KVCacheManager, HybridKVCacheManager]:
    """One block table per request, unless the layers' windows differ (``layer_windows``,
    per layer): then one per layer group over the same pool."""
    if layer_windows is None or len({w or None for w in layer_windows}) < 2:
        return KVCacheManager(num_blocks, block_size, enable_caching, sliding_window)
    if preemption_mode == "swap":
        # the host swap pool and its copies hold one block table per request
        raise ValueError("preemption_mode='swap' is not supported for models that mix sliding-window and "
                         "global attention layers (per-group KV block tables); use preemption_mode='recompute'")
    return HybridKVCacheManager(num_blocks, block_size, enable_caching, group_layers(layer_windows))

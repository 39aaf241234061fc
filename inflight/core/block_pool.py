"""Fixed pool of KV blocks with reference counts, an LRU free list and a
hash -> block map for prefix caching."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(eq=False)
class KVCacheBlock:
    """One block of ``block_size`` token slots in every layer's pool."""

    block_id: int
    ref_cnt: int = 0
    # Set once the block is full and its content is known; kept after the block
    # is freed so a later request with the same prefix can reuse it.
    block_hash: Optional[bytes] = None


class BlockPool:
    """Owns every block. Free blocks sit in an LRU list (oldest freed first out);
    a free block keeps its hash until it is handed out again, when it is evicted
    from the prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # OrderedDict as LRU: popitem(last=False) gives the least recently freed.
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def get_cached_block(self, block_hash: bytes) -> Optional[KVCacheBlock]:
        return self.cached.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones off the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Hand out ``n`` free blocks (LRU first), evicting their cached hashes."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks with only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
                self.num_evictions += 1
            block.block_hash = None

    def uncache(self, block: KVCacheBlock) -> None:
        """Forget a block's hash (its content will never be written, e.g. its
        writer was preempted before the step ran)."""
        self._evict(block)

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Register a full block under its hash; an existing entry wins."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return  # another block already holds this content; keep one copy findable
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block. Pass blocks tail-first so that the
        deepest (least reusable) blocks are evicted before their prefixes."""
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def reset_prefix_cache(self) -> None:
        for block in self._free.values():
            self._evict(block)

    def check_integrity(self) -> None:
        """Assert the pool's invariants (cheap enough for tests and debug mode)."""
        in_use = sum(1 for b in self.blocks if b.ref_cnt > 0)
        assert in_use + len(self._free) == self.num_blocks, "free + in use != num_blocks"
        for b in self.blocks:
            assert b.ref_cnt >= 0, f"block {b.block_id} has ref_cnt {b.ref_cnt}"
            assert (b.ref_cnt == 0) == (b.block_id in self._free), f"block {b.block_id} free-list mismatch"
        for h, b in self.cached.items():
            assert b.block_hash == h, f"cached block {b.block_id} hash mismatch"

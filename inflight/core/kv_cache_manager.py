"""Block tables per request, prefix-cache lookups and slot allocation on top
of the block pool."""
from __future__ import annotations

from typing import NamedTuple, Optional

from inflight.core.block_pool import BlockPool, KVCacheBlock
from inflight.core.kv_cache_utils import first_block_keys, hash_block_tokens
from inflight.core.request import Request


class ComputedBlocks(NamedTuple):
    """Result of a prefix-cache lookup: the hit blocks and the tokens they hold."""

    blocks: list[KVCacheBlock]
    num_tokens: int


# With a sliding window: the placeholder for a block-table slot whose block went back to
# the pool (every later token's window starts past it). Not in the pool, never counted,
# and never read: attention skips keys before the window (block id 0 fills the table).
NULL_BLOCK = KVCacheBlock(0)


class KVCacheManager:
    """Maps requests to blocks. Full blocks are registered in the prefix cache
    under a chained hash; a partially filled last block is always private.

    NOTE: a block in any block table has ref_cnt > 0; blocks shared through the
    prefix cache are never written, because a request only writes slots at
    positions >= its num_computed_tokens, which lie past every hit block.

    With ``sliding_window`` W (every layer windowed; the token at position p sees
    keys (p - W, p]), the blocks that lie wholly before the window of the next token
    to compute are returned to the pool as the request runs (:data:`NULL_BLOCK`
    takes their slot in the block table), so a request holds at most
    ``ceil((W - 1 + chunk) / block_size) + 1`` blocks; a prefix-cache hit needs only
    the hit blocks inside the window of the first uncached token.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding_window: Optional[int] = None, pool: Optional[BlockPool] = None,
                 group_id: int = 0) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.sliding_window = sliding_window or None
        # a pool shared by the layer groups of a hybrid manager (core/hybrid_kv.py); each group
        # tags its cache keys, since equal tokens fill different blocks in different groups
        self.pool = pool if pool is not None else BlockPool(num_blocks, enable_caching)
        self._key_tag = b"" if group_id == 0 else group_id.to_bytes(4, "little")
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of those, tokens found in the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0.0 .. 1.0)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks no token at a position >= ``num_computed_tokens`` attends to."""
        if self.sliding_window is None:
            return 0
        return max(num_computed_tokens - self.sliding_window + 1, 0) // self.block_size

    def max_blocks_held(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks a request of ``num_tokens`` tokens ever holds at once, computed
        in chunks of at most ``max_chunk`` tokens."""
        full = self.blocks_needed(num_tokens)
        if self.sliding_window is None:
            return full
        return min(full, self.blocks_needed(self.sliding_window - 1 + max_chunk) + 1)

    def _remove_skipped_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Return the blocks before the window of the next token to the pool."""
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks or self.sliding_window is None:
            return
        n = min(self.num_skipped_blocks(num_computed_tokens), len(blocks))
        freed = [b for b in blocks[:n] if b is not NULL_BLOCK]
        if freed:
            blocks[:n] = [NULL_BLOCK] * n
            self.pool.free(reversed(freed))

    def _update_block_hashes(self, request: Request) -> list[bytes]:
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        while (len(hashes) + 1) * bs <= len(tokens):
            i = len(hashes)
            # the salt and the adapter go into the first block only: the chain carries them on
            lora = request.lora_request.lora_name if request.lora_request is not None else None
            parent, keys = (hashes[-1], {}) if hashes else (None, first_block_keys(request.cache_salt, lora))
            hashes.append(hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], **keys))
        return hashes

    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """Longest cached prefix of a new request, in whole blocks.

        NOTE: at most ``num_tokens - 1`` tokens can hit, so the last prompt token
        is always recomputed and its logits sampled. A request still owed prompt
        logprobs takes no hit (as vLLM): a cached position has no logits."""
        if not self.enable_caching or request.skips_prefix_cache:
            return ComputedBlocks([], 0)
        hashes = self._update_block_hashes(request)
        hits = self.find_hit(hashes[:(request.num_tokens - 1) // self.block_size])
        num_tokens = len(hits) * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_tokens
        return ComputedBlocks(hits, num_tokens)

    def peek_cached_blocks(self, request: Request) -> int:
        """Leading prompt blocks already in the prefix cache, as :meth:`get_computed_blocks`
        would find them now, but a read only: no stats, no blocks taken (a KV transfer
        pulls only the blocks after these)."""
        if not self.enable_caching or self.sliding_window is not None:
            return 0
        n = 0
        for h in self._update_block_hashes(request)[:(request.num_tokens - 1) // self.block_size]:
            if self.pool.get_cached_block(h + self._key_tag) is None:
                break
            n += 1
        return n

    def find_hit(self, hashes: list[bytes]) -> list[KVCacheBlock]:
        """The longest prefix of these block hashes that this manager can take from the cache
        (with a window, :data:`NULL_BLOCK` before it); no side effects."""
        if self.sliding_window is not None:
            return self._windowed_hit(hashes)
        hits = []
        for h in hashes:
            block = self.pool.get_cached_block(h + self._key_tag)
            if block is None:
                break
            hits.append(block)
        return hits

    def _windowed_hit(self, hashes: list[bytes]) -> list[KVCacheBlock]:
        """The longest hit of k blocks whose blocks inside the window of token k * block_size
        are all cached (the chained hash names the whole prefix, so a cached block is right
        whatever became of its parents); :data:`NULL_BLOCK` for the blocks before it."""
        cached = [self.pool.get_cached_block(h + self._key_tag) for h in hashes]
        best, run = 0, 0
        for k in range(1, len(cached) + 1):
            run = run + 1 if cached[k - 1] is not None else 0
            if run >= k - self.num_skipped_blocks(k * self.block_size):
                best = k
        skip = self.num_skipped_blocks(best * self.block_size)
        return [NULL_BLOCK] * skip + cached[skip:best]

    def num_blocks_to_allocate(self, request: Request, num_new_tokens: int,
                               computed: Optional[ComputedBlocks] = None) -> int:
        """Free blocks that :meth:`allocate_slots` would take for these tokens (no side effects)."""
        hit_blocks = computed.blocks if computed else []
        hit_tokens = computed.num_tokens if computed else 0
        held = len(self.req_to_blocks.get(request.request_id, ()))
        total = request.num_computed_tokens + hit_tokens + num_new_tokens
        num_new = self.blocks_needed(total) - held - len(hit_blocks)
        # Hit blocks with ref_cnt 0 sit on the free list: taking them uses up free blocks too.
        num_reclaimed = sum(1 for b in hit_blocks if b.ref_cnt == 0 and b is not NULL_BLOCK)
        return max(num_new, 0) + num_reclaimed

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed: Optional[ComputedBlocks] = None, cache: bool = True) -> bool:
        """Make room for ``num_new_tokens`` past the request's computed tokens
        (plus any prefix-cache hits passed in). Returns False, changing nothing,
        when the pool cannot supply the blocks (blocks before a sliding window may
        have gone back to the pool first: no token will read them again).
        NOTE: full blocks enter the prefix cache here, as this step will write them;
        ``cache=False`` for slots reserved for a later step, whose blocks enter it
        at the allocation of the step that writes them."""
        self._remove_skipped_blocks(request, request.num_computed_tokens)
        if self.num_blocks_to_allocate(request, num_new_tokens, computed) > self.pool.num_free_blocks:
            return False
        hit_blocks = computed.blocks if computed else []
        hit_tokens = computed.num_tokens if computed else 0
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        total = request.num_computed_tokens + hit_tokens + num_new_tokens
        num_new = self.blocks_needed(total) - len(blocks) - len(hit_blocks)
        self.pool.touch(b for b in hit_blocks if b is not NULL_BLOCK)
        blocks.extend(hit_blocks)
        if num_new > 0:
            blocks.extend(self.pool.allocate(num_new))
        if cache:
            self._cache_full_blocks(request, blocks, total)
        return True

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        if not self.enable_caching:
            return
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self._update_block_hashes(request)
        for i in range(start, num_full):
            if blocks[i] is not NULL_BLOCK:
                self.pool.cache_block(blocks[i], hashes[i] + self._key_tag)
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return a request's blocks, tail first so deeper blocks are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free(b for b in reversed(blocks) if b is not NULL_BLOCK)

    def free_preempted(self, request: Request) -> None:
        """Free a request preempted before this step ran. Blocks past its computed
        tokens were registered in the prefix cache when this step allocated them,
        but they will never be written: forget their hashes first.

        NOTE: only the running loop preempts a request scheduled in this step, and it
        runs before any admission could take a prefix hit on such a block, so
        these blocks are held by this request alone."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        for block in blocks[request.num_computed_tokens // self.block_size:]:
            if block is not NULL_BLOCK and block.block_hash is not None and block.ref_cnt == 1:
                self.pool.uncache(block)
        self.free(request)

    def computed_block_ids(self, request: Request) -> list[int]:
        """Blocks holding the request's computed tokens that its next token can still
        attend to: what a swap-out copies. With a sliding window, a suffix of them.
        NOTE: blocks behind the next token's window may still be held (they go back
        at the next allocation); copying them would cost host blocks that the resume
        must then find room for on the device, more than the pool may ever have."""
        nc = request.num_computed_tokens
        blocks = self.req_to_blocks.get(request.request_id, [])
        return [b.block_id for b in blocks[self.num_skipped_blocks(nc):self.blocks_needed(nc)] if b is not NULL_BLOCK]

    def allocate_swapped_in(self, request: Request, num_blocks: int) -> list[int]:
        """Fresh blocks for a request coming back from the host pool; the caller
        copies its KV into them before the step runs, so full blocks are
        registered in the prefix cache at once (an existing entry wins). The
        ``num_blocks`` blocks take the last slots of the computed tokens' table."""
        assert request.request_id not in self.req_to_blocks, f"{request.request_id} already holds blocks"
        num_null = self.blocks_needed(request.num_computed_tokens) - num_blocks
        blocks = [NULL_BLOCK] * num_null + self.pool.allocate(num_blocks)
        self.req_to_blocks[request.request_id] = blocks
        self._num_cached_blocks.pop(request.request_id, None)
        self._cache_full_blocks(request, blocks, request.num_computed_tokens)
        return [b.block_id for b in blocks[num_null:]]

    def blocks_to_resume(self, request: Request, num_host_blocks: int, num_new_tokens: int) -> int:
        """Free blocks a swapped request needs to come back and compute ``num_new_tokens``."""
        nc = request.num_computed_tokens
        return num_host_blocks + self.blocks_needed(nc + num_new_tokens) - self.blocks_needed(nc)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    @property
    def group_windows(self) -> tuple[Optional[int], ...]:
        """Each KV cache group's sliding window: one group, every layer."""
        return (self.sliding_window,)

    def get_group_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per KV cache group (one here), as the worker gets it."""
        return (self.get_block_ids(request_id),)

    def num_blocks_of(self, request_id: str) -> int:
        """Pool blocks the request holds (placeholders for freed window blocks not counted)."""
        return sum(1 for b in self.req_to_blocks.get(request_id, ()) if b is not NULL_BLOCK)

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Assert pool invariants and that every held block is counted once per holder."""
        self.pool.check_integrity()
        counts = self.held_block_counts()
        for b in self.pool.blocks:
            assert b.ref_cnt == counts.get(b.block_id, 0), \
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != holders {counts.get(b.block_id, 0)}"

    def held_block_counts(self) -> dict[int, int]:
        """Block id -> number of requests holding it, asserting each table's shape."""
        counts: dict[int, int] = {}
        for rid, blocks in self.req_to_blocks.items():
            if self.sliding_window is None:
                assert NULL_BLOCK not in blocks, f"request {rid} holds a placeholder with no window"
            n_null = next((i for i, b in enumerate(blocks) if b is not NULL_BLOCK), len(blocks))
            assert NULL_BLOCK not in blocks[n_null:], f"request {rid}: a placeholder after a held block"
            blocks = blocks[n_null:]
            ids = [b.block_id for b in blocks]
            assert len(ids) == len(set(ids)), f"request {rid} holds a block twice"
            for b in blocks:
                assert b.ref_cnt > 0, f"request {rid} holds free block {b.block_id}"
                counts[b.block_id] = counts.get(b.block_id, 0) + 1
        return counts

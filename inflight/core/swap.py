"""The host block pool for swap preemption: which host blocks hold which
swapped-out request's KV. The bytes live in the worker (worker/swap.py); this
is only the bookkeeping, so it needs no torch."""
from __future__ import annotations

from typing import Optional

from inflight.core.block_pool import BlockPool, KVCacheBlock


class SwapSpace:
    """Host blocks for requests preempted by swap.

    A swap-out maps each of the request's computed device blocks to a free
    host block and returns the ``(device, host)`` pairs the runner copies; a
    swap-in maps the host blocks back to freshly allocated device blocks and
    returns ``(host, device)`` pairs. Host blocks are private (no prefix
    caching), so a swapped request owns its host blocks outright.

    NOTE: the runner performs every copy of a step before its forward pass and
    reads all sources before writing any destination, so a block freed by one
    copy may be reused as the destination of another in the same step.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = max(int(num_blocks), 0)
        self.pool: Optional[BlockPool] = BlockPool(self.num_blocks, enable_caching=False) if self.num_blocks else None
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks if self.pool else 0

    def can_hold(self, num_blocks: int) -> bool:
        """True when ``num_blocks`` more host blocks are free."""
        return 0 < num_blocks <= self.num_free_blocks

    def num_blocks_of(self, request_id: str) -> int:
        return len(self.req_to_blocks.get(request_id, ()))

    def swap_out(self, request_id: str, device_block_ids: list[int]) -> list[tuple[int, int]]:
        """Take host blocks for a request's device blocks; returns (device, host) pairs."""
        assert self.pool is not None and request_id not in self.req_to_blocks
        blocks = self.pool.allocate(len(device_block_ids))
        self.req_to_blocks[request_id] = blocks
        return [(d, h.block_id) for d, h in zip(device_block_ids, blocks)]

    def swap_in(self, request_id: str, device_block_ids: list[int]) -> list[tuple[int, int]]:
        """Release a request's host blocks into ``device_block_ids``; returns (host, device) pairs."""
        blocks = self.req_to_blocks.pop(request_id)
        assert len(blocks) == len(device_block_ids), "swap-in needs one device block per host block"
        self.pool.free(blocks)
        return [(h.block_id, d) for h, d in zip(blocks, device_block_ids)]

    def free(self, request_id: str) -> None:
        """Drop a swapped request's host blocks (it was aborted or finished)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        if blocks:
            self.pool.free(blocks)

    def check_integrity(self) -> None:
        """The pool invariants, and every held host block has exactly one holder."""
        if self.pool is None:
            assert not self.req_to_blocks, "host blocks held with no host pool"
            return
        self.pool.check_integrity()
        holders: dict[int, int] = {}
        for rid, blocks in self.req_to_blocks.items():
            assert blocks, f"request {rid} is swapped with no host blocks"
            for b in blocks:
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for b in self.pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0) <= 1, \
                f"host block {b.block_id}: ref_cnt {b.ref_cnt}, holders {holders.get(b.block_id, 0)}"

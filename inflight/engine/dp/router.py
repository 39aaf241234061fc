"""The prefix-cache-aware router of data parallelism: which replica gets a request.

A request goes to the replica holding the longest cached prefix of its prompt, else
to the least loaded one. A replica's cache is known from two sources: the block
hashes it reports (a mirror of its prefix cache, so bounded by its pool), and the
prompt blocks of requests routed to it and not yet finished (they will be cached
there by the time a copy could be reused, and the replica's own report takes over
when they finish). Without the second, requests sharing a prefix that arrive together
would scatter before the first of them had been prefilled. Pure Python: no torch.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from inflight.core.kv_cache_utils import first_block_keys, hash_block_tokens


@dataclass
class ReplicaView:
    """What the router knows of one replica."""

    reported: set[bytes] = field(default_factory=set)  # block hashes in its prefix cache, as reported
    inflight: Counter = field(default_factory=Counter)  # prompt block hashes of its unfinished requests
    load: int = 0  # requests routed to it and not finished (its running + waiting, seen from here)
    routed: int = 0  # requests routed to it so far (breaks ties, so idle replicas take turns)
    alive: bool = True

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.reported or block_hash in self.inflight


@dataclass(frozen=True)
class RouteDecision:
    """The chosen replica, how many prompt blocks it already holds, and why it won:
    ``prefix`` (longest cached prefix), ``load`` (no replica holds any of the prompt)
    or ``balance`` (the prefix holder was too far ahead in load)."""

    replica: int
    matched_blocks: int
    reason: str


class PrefixAwareRouter:
    """Chooses replicas and keeps the per-replica cache views up to date.

    ``balance_abs_threshold``: the prefix holder is passed over for the least loaded
    replica when it has more than this many unfinished requests beyond it (SGLang's
    cache-aware router has the same guard), so one hot prefix cannot pin all work on
    one replica; the other replica then builds its own copy and both share the load.
    """

    def __init__(self, num_replicas: int, block_size: int, balance_abs_threshold: int = 8) -> None:
        if num_replicas < 1:
            raise ValueError(f"the router needs at least one replica, got {num_replicas}")
        self.block_size = block_size
        self.balance_abs_threshold = balance_abs_threshold
        self.replicas = [ReplicaView() for _ in range(num_replicas)]
        self._requests: dict[str, tuple[int, list[bytes]]] = {}

    def prompt_hashes(self, token_ids: Sequence[int], cache_salt: Optional[str] = None,
                      lora_name: Optional[str] = None) -> list[bytes]:
        """The chained hashes of the prompt's full blocks, exactly as the KV cache manager
        computes them (the salt and the adapter go into the first block only)."""
        bs, hashes = self.block_size, []
        parent: Optional[bytes] = None
        for i in range(len(token_ids) // bs):
            keys = first_block_keys(cache_salt, lora_name) if i == 0 else {}
            parent = hash_block_tokens(parent, token_ids[i * bs:(i + 1) * bs], **keys)
            hashes.append(parent)
        return hashes

    def matched_blocks(self, replica: int, hashes: Sequence[bytes], num_tokens: int) -> int:
        """Leading prompt blocks the replica holds; at most ``(num_tokens - 1) // block_size``
        can hit (the last prompt token is always computed)."""
        view = self.replicas[replica]
        limit = min(len(hashes), max(num_tokens - 1, 0) // self.block_size)
        n = 0
        while n < limit and view.has(hashes[n]):
            n += 1
        return n

    def choose(self, hashes: Sequence[bytes], num_tokens: int) -> RouteDecision:
        """The replica for a prompt with these block hashes. Raises RuntimeError when none is alive."""
        alive = [i for i, v in enumerate(self.replicas) if v.alive]
        if not alive:
            raise RuntimeError("no engine replica is alive")
        matches = {i: self.matched_blocks(i, hashes, num_tokens) for i in alive}
        least = min(alive, key=self._load_key)
        best = max(matches.values())
        if best == 0:
            return RouteDecision(least, 0, "load")
        holder = min((i for i in alive if matches[i] == best), key=self._load_key)
        if self.replicas[holder].load - self.replicas[least].load > self.balance_abs_threshold:
            return RouteDecision(least, matches[least], "balance")
        return RouteDecision(holder, best, "prefix")

    def _load_key(self, i: int) -> tuple[int, int, int]:
        v = self.replicas[i]
        return v.load, v.routed, i

    def on_routed(self, request_id: str, replica: int, hashes: list[bytes]) -> None:
        """Count a request against its replica until :meth:`on_finished`."""
        view = self.replicas[replica]
        view.load += 1
        view.routed += 1
        view.inflight.update(hashes)
        self._requests[request_id] = (replica, hashes)

    def on_finished(self, request_id: str) -> Optional[int]:
        """The request left its replica (finished, aborted or failed); returns that replica."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return None
        replica, hashes = entry
        view = self.replicas[replica]
        view.load -= 1
        view.inflight.subtract(hashes)
        for h in hashes:
            if view.inflight[h] <= 0:
                del view.inflight[h]
        return replica

    def replica_of(self, request_id: str) -> Optional[int]:
        entry = self._requests.get(request_id)
        return entry[0] if entry is not None else None

    def apply_cache_delta(self, replica: int, added: Iterable[bytes], removed: Iterable[bytes]) -> None:
        """A replica's report: blocks that entered and left its prefix cache since the last one."""
        reported = self.replicas[replica].reported
        reported.difference_update(removed)
        reported.update(added)

    def mark_dead(self, replica: int) -> list[str]:
        """Route nothing more to the replica; returns the ids of the requests it held."""
        view = self.replicas[replica]
        view.alive = False
        view.reported.clear()
        lost = [rid for rid, (r, _) in self._requests.items() if r == replica]
        for rid in lost:
            self.on_finished(rid)
        return lost

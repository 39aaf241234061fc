"""Admission: which queued request starts next, whether memory allows it, and
taking it off the queue with its blocks (a waiting request's prefix-cache hits
and connector-loaded tokens, or a swapped request's host blocks copied back).

Order. Swapped requests come before waiting ones (under ``fcfs`` always;
under ``priority`` they compete by ``(priority, arrival)`` like everyone
else). Waiting requests keep queue order under ``fcfs`` (recompute-preempted
requests sit at the front), and go by ``(priority, arrival)`` under
``priority``. A request preempted in this step is not resumed in it.

Watermark. While anything runs, a request is admitted only if at least
``watermark * num_blocks`` blocks stay free afterwards (vLLM keeps 1%): the
running requests need room to grow, and admitting into the last free blocks
only to preempt the newcomer a step later is thrashing. With nothing running
the watermark is waived, so it can never block progress.

Fairness for interactive traffic: a work-conserving seat share for long
generations. A request whose ``max_tokens`` exceeds
``long_generation_threshold`` is a *long generation*; the others are
*interactive*. Long generations are entitled to ``long_generation_seat_share``
of the ``max_num_seqs`` seats (at least one):

* while an interactive request is queued, admission skips long requests once
  they hold their share, and takes the interactive one behind them;
* with no interactive request queued, long requests may fill every seat
  (no seat idles for traffic that is not there);
* when an interactive request is queued, every seat is taken and long
  generations hold more than their share, the newest such long generation is
  preempted (swap or recompute; core/preemption.py) to give it a seat;
* when KV blocks run out, long generations are preempted before interactive ones.

So a flood of long generations cannot queue interactive requests behind
thousands of decode steps: an interactive request waits for at most one step
plus the other interactive requests. Why this policy: it needs nothing beyond
what the client declares (``max_tokens``); the reserved seats cost nothing when
there is no interactive traffic; the price is one preemption of a long
generation per interactive request that arrives while the flood holds every
seat, and the preemption cap (progress guarantee) bounds how often any one long
generation pays it. Priority aging would not help here: it reorders a queue
whose head still waits for a seat. Off by default
(``long_generation_threshold=0``); ``benchmarks/fairness.py`` measures it.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import SchedulerOutput
from inflight.core.request import Request
from inflight.core.swap import SwapSpace

if TYPE_CHECKING:
    from inflight.core.batching import BatchingPolicy
    from inflight.distributed.kv_transfer.base import KVConnectorBase

# The scheduler's: put a request that holds its blocks into the running batch with ``n`` tokens.
StartFn = Callable[[Request, int], None]


def chunk_size(config: SchedulerConfig, req: Request, num_computed: int, budget: int) -> int:
    """Tokens of ``req`` to compute this step from ``num_computed``, within ``budget``."""
    n = min(req.num_tokens - num_computed, budget)
    # The threshold caps prefill chunks, so it only means something when chunking is on.
    if config.enable_chunked_prefill and config.long_prefill_token_threshold > 0:
        n = min(n, config.long_prefill_token_threshold)
    return n


def check_feasible(config: SchedulerConfig, kv: KVCacheManager, max_model_len: int, request: Request) -> None:
    """Raise ValueError if ``request`` could never run, whatever else is running: its prompt
    plus ``max_tokens`` (default: up to ``max_model_len``) needs more blocks than the whole
    pool, or, without chunked prefill, its prompt exceeds one step's token budget."""
    max_tokens = request.sampling_params.max_tokens or (max_model_len - request.num_prompt_tokens)
    need = kv.max_blocks_held(request.num_prompt_tokens + max_tokens, config.max_num_batched_tokens)
    if need > kv.num_blocks:
        raise ValueError(
            f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) needs {need} KV "
            f"blocks but the whole KV cache has {kv.num_blocks} blocks of {kv.block_size} tokens "
            f"({kv.num_blocks * kv.block_size} tokens): it can never fit; shorten the prompt "
            f"or lower max_tokens")
    if not config.enable_chunked_prefill and request.num_prompt_tokens > config.max_num_batched_tokens:
        raise ValueError(
            f"prompt of {request.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) and chunked prefill is disabled")


def longest_feasible(config: SchedulerConfig, kv: KVCacheManager, max_model_len: int) -> int:
    """The most tokens (prompt and output) one request can reach with the whole KV pool to
    itself: ``max_model_len``, or less where the pool cannot hold that (a sliding window's
    requests hold only their window's blocks, so theirs may reach it with a smaller pool)."""
    def fits(n: int) -> bool:
        return kv.max_blocks_held(n, config.max_num_batched_tokens) <= kv.num_blocks

    lo, hi = 0, max_model_len  # fits(lo) holds; find the largest n <= hi that fits
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


class AdmissionQueue:
    """The requests waiting for a seat (``waiting``: new and recompute-preempted;
    ``swapped``: preempted by swap) and the order admission tries them in.

    It reads ``running`` (the scheduler's list) for the seat share and never
    changes it: :meth:`admit` and :meth:`resume_swapped` take a request off the
    queue with its blocks and hand it to the scheduler's ``start``. Which waiting
    requests may start at all is the batching policy's.
    """

    def __init__(self, config: SchedulerConfig, policy: "BatchingPolicy", running: list[Request],
                 kv: KVCacheManager, swap: SwapSpace, watermark_blocks: int, max_loras: Optional[int] = None) -> None:
        self.config = config
        self.policy = policy
        self.running = running
        self.kv = kv
        self.swap = swap
        self.watermark_blocks = watermark_blocks
        self.waiting: deque[Request] = deque()
        self.swapped: list[Request] = []
        self.preempted_now: set[str] = set()  # preempted in the current schedule(): not resumed in it
        # LoRA: adapters the running batch may mix (None: no LoRA); a request of one more waits
        self.max_loras = max_loras

    def room_for(self, num_blocks: int) -> bool:
        """Whether ``num_blocks`` more blocks can be taken while keeping the watermark."""
        keep = self.watermark_blocks if self.running else 0
        return self.kv.num_free_blocks - num_blocks >= keep

    def is_long(self, r: Request) -> bool:
        """A long generation: ``max_tokens`` above ``long_generation_threshold`` (where the policy has seat shares)."""
        t = self.config.long_generation_threshold
        return t > 0 and r.max_tokens > t and self.policy.seat_share

    def long_seats(self) -> int:
        return max(1, int(self.config.long_generation_seat_share * self.config.max_num_seqs))

    def queued(self) -> Iterable[Request]:
        """Swapped requests (by arrival), then the admissible waiting ones in queue order."""
        swapped = sorted(self.swapped, key=lambda r: r.arrival_time)
        return itertools.chain(swapped, self.policy.admissible(self.waiting))

    def interactive_queued(self) -> int:
        """Interactive (not long) requests waiting for a seat."""
        return sum(1 for r in self.queued() if r.request_id not in self.preempted_now and not self.is_long(r))

    def newest_interactive(self) -> Request:
        """The most recently arrived interactive request in the queue (one must be queued)."""
        return max((r for r in self.queued() if not self.is_long(r)), key=lambda r: r.arrival_time)

    def long_over_share(self) -> int:
        """How many seats long generations hold beyond their share (negative: below it)."""
        return sum(1 for r in self.running if self.is_long(r)) - self.long_seats()

    def lora_full(self) -> Optional[set[int]]:
        """The adapters running, when they are ``max_loras`` (only their requests may join); else None."""
        if self.max_loras is None:
            return None
        ids = {r.lora_int_id for r in self.running if r.lora_int_id}
        return ids if len(ids) >= self.max_loras else None

    def next_candidate(self) -> Optional[Request]:
        """The request admission should try next, or None."""
        long_full = False
        if self.config.long_generation_threshold > 0 and self.policy.seat_share:
            long_full = self.long_over_share() >= 0 and self.interactive_queued() > 0
        loras = self.lora_full()
        by_priority = self.config.scheduling_policy == "priority"
        best: Optional[Request] = None
        for r in self.queued():
            if r.request_id in self.preempted_now or (long_full and self.is_long(r)):
                continue
            if loras is not None and r.lora_int_id and r.lora_int_id not in loras:
                continue  # NOTE: the running batch holds max_loras adapters: no step mixes more
            if not by_priority:
                return r
            if best is None or (r.priority, r.arrival_time) < (best.priority, best.arrival_time):
                best = r
        return best

    def admit(self, req: Request, budget: int, connector: Optional["KVConnectorBase"],
              start: StartFn) -> Optional[int]:
        """Start a waiting request: tokens scheduled, 0 if it must wait for budget, None for blocks."""
        computed = self.kv.get_computed_blocks(req)
        # prompt tokens whose KV a connector loads before the step (disaggregated prefill)
        ext = connector.get_num_new_matched_tokens(req, computed.num_tokens) if connector else 0
        n = chunk_size(self.config, req, computed.num_tokens + ext, budget)
        # NOTE: without chunked prefill a prompt runs whole or not at all; a request
        # preempted mid-generation may still be recomputed in chunks, else a
        # prompt+output longer than the budget could never resume.
        if (not self.config.enable_chunked_prefill and req.num_output_tokens == 0
                and n < req.num_tokens - computed.num_tokens - ext):
            return 0
        if not self.room_for(self.kv.num_blocks_to_allocate(req, ext + n, computed)) \
                or not self.kv.allocate_slots(req, ext + n, computed):
            return None
        self.waiting.remove(req)
        req.num_computed_tokens = computed.num_tokens + ext
        if connector is not None:
            connector.update_state_after_alloc(req, self.kv.get_block_ids(req.request_id),
                                               computed.num_tokens, ext)
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = computed.num_tokens
        start(req, n)
        return n

    def resume_swapped(self, req: Request, out: SchedulerOutput, budget: int, start: StartFn) -> Optional[int]:
        """Bring a swapped request back: fresh device blocks, host -> device copies, next chunk."""
        n = chunk_size(self.config, req, req.num_computed_tokens, budget)
        num_host = self.swap.num_blocks_of(req.request_id)
        if not self.room_for(self.kv.blocks_to_resume(req, num_host, n)):
            return None
        device_ids = self.kv.allocate_swapped_in(req, num_host)
        out.blocks_to_swap_in.extend(self.swap.swap_in(req.request_id, device_ids))
        ok = self.kv.allocate_slots(req, n)
        assert ok, "room was checked above"
        self.swapped.remove(req)
        start(req, n)
        return n

"""The KV cache manager with a sliding window: blocks before the window of the next
token go back to the pool while a request runs, prefix hits need only the blocks
inside the window, and under random traffic (swap and recompute preemption, prefix
caching, chunks) every read inside a window finds its token, a request never holds
more than the window's blocks, and every block returns to the pool."""
import pytest
from hypothesis import example, given, settings, strategies as st

from fake_runner import make_request, make_scheduler, run_step, schedule
from inflight.core.kv_cache_manager import NULL_BLOCK, KVCacheManager
from inflight.core.request import RequestStatus
from test_preemption_property import SimulatedKV, execute


def held_bound(window: int, chunk: int, block_size: int) -> int:
    return -(-(window - 1 + chunk) // block_size) + 1


def test_blocks_behind_the_window_return_to_the_pool():
    kv = KVCacheManager(num_blocks=64, block_size=4, sliding_window=10)
    req = make_request("a", prompt_len=40, max_tokens=100)
    assert kv.allocate_slots(req, 40)
    assert kv.num_blocks_of("a") == 10  # the prompt's first chunk: nothing computed yet
    req.num_computed_tokens = 40
    peak = 0
    for _ in range(60):  # decodes: the token at p reads keys p-9 .. p
        req.append_output_token(5)
        assert kv.allocate_slots(req, 1)
        ids = kv.get_block_ids("a")
        first_needed = (req.num_computed_tokens - 9) // 4
        assert all(b == NULL_BLOCK.block_id for b in ids[:first_needed])
        assert kv.req_to_blocks["a"][first_needed] is not NULL_BLOCK
        peak = max(peak, kv.num_blocks_of("a"))
        assert kv.num_free_blocks == 64 - kv.num_blocks_of("a")
        kv.check_integrity()
        req.num_computed_tokens += 1
    assert peak == held_bound(10, 1, 4) == 4
    kv.free(req)
    assert kv.num_free_blocks == 64
    kv.check_integrity()


def test_prefix_hit_needs_only_the_window_blocks():
    """A second request with the same prompt hits although the prompt's early blocks
    were evicted: only the blocks inside the first uncached token's window count."""
    kv = KVCacheManager(num_blocks=12, block_size=4, sliding_window=6)
    a = make_request("a", prompt_len=33, max_tokens=1)
    for start in range(0, 33, 4):  # chunks of 4: early blocks go back to the pool as a runs
        a.num_computed_tokens = start
        assert kv.allocate_slots(a, min(4, 33 - start))
    kv.free(a)
    kv.pool.free(kv.pool.allocate(4))  # the oldest freed blocks (a's first ones) are handed out: evicted
    b = make_request("b", prompt_len=33, max_tokens=1)
    hit = kv.get_computed_blocks(b)
    assert hit.num_tokens == 32  # all whole blocks below the last prompt token
    # token 32 reads keys 27 .. 32: blocks 6 and 7 of the hit are held, 0 .. 5 are placeholders
    assert hit.blocks[:6] == [NULL_BLOCK] * 6 and NULL_BLOCK not in hit.blocks[6:]
    assert kv.num_blocks_to_allocate(b, 1, hit) == 3  # two hit blocks off the free list + one new
    assert kv.allocate_slots(b, 1, hit)
    assert kv.num_blocks_of("b") == 3
    kv.check_integrity()


def test_no_window_hit_breaks_at_the_first_evicted_block():
    kv = KVCacheManager(num_blocks=12, block_size=4)
    a = make_request("a", prompt_len=17, max_tokens=1)
    assert kv.allocate_slots(a, 17)
    kv.free(a)
    kv.pool.free(kv.pool.allocate(12))  # evicts everything
    assert kv.get_computed_blocks(make_request("b", prompt_len=17, max_tokens=1)).num_tokens == 0


def test_a_long_request_fits_a_pool_smaller_than_it():
    """Admission counts the window's blocks, not the whole request's."""
    s = make_scheduler(num_blocks=12, block_size=4, max_num_batched_tokens=8, sliding_window=16)
    req = make_request("a", prompt_len=100, max_tokens=100)
    s.add_request(req)
    for _ in range(400):
        run_step(s)
        s.check_integrity()
        assert s.kv.num_blocks_of("a") <= held_bound(16, 8, 4)
        if not s.has_unfinished_requests():
            break
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED and req.num_output_tokens == 100
    assert s.kv.num_free_blocks == 12


class WindowedKV(SimulatedKV):
    """Reads only what attention with the window reads: keys inside some new token's window."""

    def __init__(self, num_blocks, num_host_blocks, block_size, window):
        super().__init__(num_blocks, num_host_blocks, block_size)
        self.window = window

    def forward(self, sched) -> None:
        for x in sched.scheduled:
            r, nc = x.request, x.request.num_computed_tokens
            for p in range(nc, nc + x.num_new_tokens):
                self.device[self.slot(x, p)] = (p, r.all_token_ids[p])
        for x in sched.scheduled:
            r, nc = x.request, x.request.num_computed_tokens
            for p in range(max(nc - self.window + 1, 0), nc + x.num_new_tokens):
                got = self.device[self.slot(x, p)]
                assert got == (p, r.all_token_ids[p]), f"{r.request_id} position {p}: {got}"


request_st = st.tuples(st.integers(1, 40), st.integers(1, 30), st.integers(0, 3), st.integers(0, 5))


@settings(max_examples=200, deadline=None)
@given(
    reqs=st.lists(request_st, min_size=2, max_size=10),
    window=st.integers(1, 12),
    num_blocks=st.integers(4, 24),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 24),
    max_num_seqs=st.integers(1, 6),
    caching=st.booleans(),
    policy=st.sampled_from(["fcfs", "priority"]),
    mode=st.sampled_from(["swap", "recompute"]),
    num_host_blocks=st.integers(0, 16),
    abort_steps=st.sets(st.integers(0, 60), max_size=3),
)
# a swap-out that copied blocks behind the window left a request whose resume needed more
# blocks than the pool has: it stayed swapped forever
@example(reqs=[(1, 1, 0, 0), (15, 3, 0, 0), (13, 1, 0, 0)], window=2, num_blocks=6, block_size=2, budget=9,
         max_num_seqs=2, caching=False, policy="fcfs", mode="swap", num_host_blocks=5, abort_steps=set())
def test_windowed_kv_under_random_traffic(reqs, window, num_blocks, block_size, budget, max_num_seqs, caching,
                                          policy, mode, num_host_blocks, abort_steps):
    s = make_scheduler(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs, enable_prefix_caching=caching, scheduling_policy=policy,
                       preemption_mode=mode, num_host_blocks=num_host_blocks, sliding_window=window)
    kv = WindowedKV(num_blocks, s.swap.num_blocks, block_size, window)
    # few distinct prompts, so prefix hits (with placeholders before the window) happen
    pending = [(arrival, make_request(f"r{i}", prompt_len=plen, max_tokens=mt, base=(i % 2) * 1000,
                                      priority=prio, arrival_time=float(i)))
               for i, (plen, mt, arrival, prio) in enumerate(reqs)]
    accepted = []
    bound = held_bound(window, budget, block_size)
    for step in range(800):
        for _, req in [p for p in pending if p[0] == step]:
            try:
                s.add_request(req)
                accepted.append(req)
            except ValueError:
                pass
        if step in abort_steps and (s.running or s.swapped):
            s.abort_requests([(s.swapped or s.running)[0].request_id])
        sched = schedule(s)
        kv.swap(sched)
        kv.forward(sched)
        for x in sched.scheduled:
            assert s.kv.num_blocks_of(x.request.request_id) <= bound
        s.update_from_output(sched, execute(sched))
        s.check_integrity()
        if step > max(p[0] for p in pending) and not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests(), "requests left hanging"
    assert s.kv.num_free_blocks == num_blocks and s.swap.num_free_blocks == s.swap.num_blocks
    for req in accepted:
        assert req.status.is_finished


def _blocks_of_a_4096_token_request(window):
    """(peak, final) blocks a 4,000-token prompt + 96 generated tokens holds, 16-token
    blocks, 1,024-token prefill chunks."""
    s = make_scheduler(num_blocks=300, block_size=16, max_num_batched_tokens=1024, max_model_len=8192,
                       sliding_window=window)
    req = make_request("a", prompt_len=4000, max_tokens=96)
    s.add_request(req)
    peak = final = 0
    while s.has_unfinished_requests():
        sched, _ = run_step(s)
        final = s.kv.num_blocks_of("a") or final
        peak = max(peak, final)
    assert req.num_tokens == 4096 and s.kv.num_free_blocks == 300
    return peak, final


def test_a_1024_window_holds_a_quarter_of_a_4096_token_request():
    peak, final = _blocks_of_a_4096_token_request(1024)
    full_peak, full_final = _blocks_of_a_4096_token_request(None)
    assert full_peak == full_final == 256
    assert final == 1024 // 16 + 1  # the window's blocks and the one being filled
    assert peak == (1023 + 1024) // 16 + 1  # a 1,024-token chunk on top of the window


def test_longest_feasible_request_of_a_pool():
    # what the server may give a chat request that sets no max_tokens: the most tokens whose
    # blocks the whole pool holds (a window's requests hold only the window's blocks)
    from inflight.config import SchedulerConfig
    from inflight.core.admission import check_feasible, longest_feasible

    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    plain = KVCacheManager(10, 4)
    assert longest_feasible(config, plain, 1000) == 40 and longest_feasible(config, plain, 30) == 30
    windowed = KVCacheManager(10, 4, sliding_window=8)
    assert longest_feasible(config, windowed, 1000) == 1000
    tight = KVCacheManager(6, 4, sliding_window=8)  # a window and a chunk: 6 blocks and one more, past the pool
    assert longest_feasible(config, tight, 1000) == 24
    for kv, n in ((plain, 40), (tight, 24)):  # the engine's own admission check agrees at the edge
        check_feasible(config, kv, 1000, make_request("a", prompt_len=n - 1, max_tokens=1))
        with pytest.raises(ValueError, match="can never fit"):
            check_feasible(config, kv, 1000, make_request("b", prompt_len=n, max_tokens=1))

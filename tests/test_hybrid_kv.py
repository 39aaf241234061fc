"""The hybrid KV manager (windowed and global layer groups over one pool): a windowed
group hands back the blocks behind its window while the global groups keep every block,
prefix hits agree across groups, and under random traffic (chunks, prefix hits,
preemption, frees) every read a layer group makes finds its token and every block
returns to the pool."""
import pytest
from hypothesis import given, settings, strategies as st

from fake_runner import make_request, make_scheduler
from inflight.core.hybrid_kv import HybridKVCacheManager, KVCacheGroup, group_layers
from inflight.core.kv_cache_manager import NULL_BLOCK, KVCacheManager


def test_layers_group_by_kind_in_equal_sizes():
    assert group_layers([8, None, 8, None]) == [KVCacheGroup(None, (1, 3)), KVCacheGroup(8, (0, 2))]
    gemma3 = group_layers([None if (i + 1) % 6 == 0 else 512 for i in range(26)])  # 22 windowed, 4 global
    assert gemma3[0] == KVCacheGroup(None, (5, 11, 17, 23))
    assert [len(g.layers) for g in gemma3[1:]] == [4, 4, 4, 4, 4, 2]
    assert sorted(i for g in gemma3 for i in g.layers) == list(range(26))


def _blocks_of_a_4096_token_request(kv) -> tuple[int, int]:
    """(peak, final) pool blocks of a 4,000-token prompt in 1,024-token chunks + 96 generated
    tokens (the last one sampled, never computed), as the scheduler runs it."""
    req = make_request("a", prompt_len=4000, max_tokens=96)
    peak = 0
    while req.num_tokens < 4096:
        n = min(1024, req.num_tokens - req.num_computed_tokens)
        assert kv.allocate_slots(req, n)
        peak = max(peak, kv.num_blocks_of("a"))
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token(5)
    final = kv.num_blocks_of("a")
    kv.free(req)
    kv.check_integrity()
    assert kv.num_free_blocks == kv.num_blocks
    return peak, final


def test_windowed_layers_hold_only_their_window():
    """Alternating 1,024-token-window and global layers: the global half holds all 256
    16-token blocks of a 4,096-token request, the windowed half 65; all-global holds 256
    blocks of twice the layers. In layer-blocks (bytes): 321 / 2 against 256, 63 %."""
    layers = 8
    hybrid = HybridKVCacheManager(1000, 16, True, group_layers([1024, None] * (layers // 2)))
    assert [len(g.layers) for g in hybrid.groups] == [layers // 2] * 2
    peak, final = _blocks_of_a_4096_token_request(hybrid)
    assert final == 256 + 1024 // 16 + 1
    # at the last prefill chunk (tokens 3,072 .. 3,999): 250 blocks, 128 of them behind every window
    assert peak == 250 + (250 - (3072 - 1023) // 16)
    full_peak, full_final = _blocks_of_a_4096_token_request(KVCacheManager(1000, 16))
    assert full_peak == full_final == 256
    assert final * (layers // 2) < 0.63 * full_final * layers


def test_prefix_hit_is_cut_to_what_every_group_holds():
    """The windowed group lost the early blocks (fine: behind its window), the global group
    lost block 5: the hit stops before block 5 in both, and the windowed group then needs
    blocks inside the shorter prefix's window."""
    kv = HybridKVCacheManager(40, 4, True, [KVCacheGroup(None, (1,)), KVCacheGroup(6, (0,))])
    a = make_request("a", prompt_len=33, max_tokens=1)
    assert kv.allocate_slots(a, 33)
    global_blocks = list(kv.managers[0].req_to_blocks["a"])
    kv.free(a)
    kv.pool.uncache(global_blocks[5])
    b = make_request("b", prompt_len=33, max_tokens=1)
    hit = kv.get_computed_blocks(b)
    assert hit.num_tokens == 20
    full, windowed = hit.per_group
    assert full.blocks == global_blocks[:5]
    assert windowed.blocks[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in windowed.blocks[3:5]
    assert kv.allocate_slots(b, 13, hit)
    kv.check_integrity()
    assert kv.prefix_cache_hits == 20


def test_the_scheduler_keeps_a_table_per_group_only_for_mixed_windows():
    """Layers that differ in window get the hybrid manager, whose tables the worker is sent
    per group; one window (or none) for every layer keeps one table per request. Swap
    preemption, whose host pool holds one table per request, is refused at startup."""
    assert type(make_scheduler(layer_windows=[None, None]).kv) is KVCacheManager
    assert type(make_scheduler(layer_windows=[8, 8], sliding_window=8).kv) is KVCacheManager
    s = make_scheduler(layer_windows=[8, None, 8, None])
    assert isinstance(s.kv, HybridKVCacheManager) and s.kv.group_windows == (None, 8)
    with pytest.raises(ValueError, match="preemption_mode='swap' is not supported"):
        make_scheduler(layer_windows=[8, None], preemption_mode="swap", num_host_blocks=8)


class GroupedKV:
    """What each layer group's attention writes and reads: the token at position p of group
    g is written to its slot, and each new token reads positions in its window (global: all)."""

    def __init__(self, kv: HybridKVCacheManager) -> None:
        self.kv, self.data = kv, {}

    def step(self, req, n: int) -> None:
        nc, bs = req.num_computed_tokens, self.kv.block_size
        for g, (group, m) in enumerate(zip(self.kv.groups, self.kv.managers)):
            blocks = m.req_to_blocks[req.request_id]
            for p in range(nc, nc + n):
                self.data[(blocks[p // bs].block_id, p % bs)] = req.all_token_ids[:p + 1]
            first = 0 if group.sliding_window is None else max(nc - group.sliding_window + 1, 0)
            for p in range(first, nc + n):
                assert blocks[p // bs] is not NULL_BLOCK, f"group {g}: position {p} was freed"
                got = self.data.get((blocks[p // bs].block_id, p % bs))
                assert got == req.all_token_ids[:p + 1], f"group {g}: position {p} of {req.request_id}"


@settings(max_examples=120, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 2)), min_size=2, max_size=8),
    windows=st.lists(st.sampled_from([None, 1, 3, 6, 11]), min_size=2, max_size=5),
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 4]),
    chunk=st.integers(1, 12),
    caching=st.booleans(),
    actions=st.lists(st.integers(0, 99), min_size=20, max_size=80),
)
def test_hybrid_kv_under_random_traffic(prompts, windows, num_blocks, block_size, chunk, caching, actions):
    kv = HybridKVCacheManager(num_blocks, block_size, caching, group_layers(windows))
    sim = GroupedKV(kv)
    waiting = [make_request(f"r{i}", prompt_len=plen, max_tokens=4, base=1000 * base)
               for i, (plen, base) in enumerate(prompts)]
    running = []
    for a in actions:
        if waiting and (a % 3 == 0 or not running):  # admit, with any prefix hit
            req = waiting.pop(0)
            hit = kv.get_computed_blocks(req)
            n = min(chunk, req.num_tokens - hit.num_tokens)
            if kv.allocate_slots(req, n, hit):
                req.num_computed_tokens = hit.num_tokens
                sim.step(req, n)
                req.num_computed_tokens += n
                running.append(req)
            else:
                waiting.append(req)
        elif running:
            req = running[a % len(running)]
            if req.num_computed_tokens == req.num_tokens and a % 2:
                kv.free(req)  # finished
                running.remove(req)
                continue
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token(7 + a)
            n = min(chunk, req.num_tokens - req.num_computed_tokens)
            if kv.allocate_slots(req, n):
                sim.step(req, n)
                req.num_computed_tokens += n
            else:  # preempt it by recompute
                kv.free_preempted(req)
                req.num_computed_tokens = 0
                running.remove(req)
                waiting.append(req)
        kv.check_integrity()
    for req in running:
        kv.free(req)
    kv.check_integrity()
    assert kv.num_free_blocks == num_blocks

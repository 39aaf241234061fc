"""Random traffic under swap and recompute preemption, priorities, the watermark,
the preemption cap and the long-generation seat share.

Besides the block invariants of BOTH pools after every step, a simulated KV
cache checks the data: every slot holds the token its writer put there, swap
copies move it (sources read before destinations are written, as the runner
does), and every scheduled request reads its own tokens back through its
block table (prefix-cache hits included). Everything is freed at the end."""
from hypothesis import event, given, settings, strategies as st

from fake_runner import make_request, make_scheduler, schedule
from inflight.core.outputs import ModelRunnerOutput
from inflight.core.request import RequestStatus

request_st = st.tuples(st.integers(1, 16), st.integers(1, 12), st.integers(0, 3), st.integers(0, 5))


class SimulatedKV:
    """Slot contents of the device and host pools: (position, token) or None."""

    def __init__(self, num_blocks: int, num_host_blocks: int, block_size: int) -> None:
        self.bs = block_size
        self.device = [None] * (num_blocks * block_size)
        self.host = [None] * (num_host_blocks * block_size)

    def _block(self, pool, b):
        return pool[b * self.bs:(b + 1) * self.bs]

    def swap(self, sched) -> None:
        outs = [(h, self._block(self.device, d)) for d, h in sched.blocks_to_swap_out]
        ins = [(d, self._block(self.host, h)) for h, d in sched.blocks_to_swap_in]
        for h, data in outs:
            self.host[h * self.bs:(h + 1) * self.bs] = data
        for d, data in ins:
            self.device[d * self.bs:(d + 1) * self.bs] = data

    def slot(self, x, pos: int) -> int:
        return x.block_ids[0][pos // self.bs] * self.bs + pos % self.bs

    def forward(self, sched) -> None:
        """Write every new token first, then check every read (write_kv precedes attention)."""
        for x in sched.scheduled:
            r, nc = x.request, x.request.num_computed_tokens
            for p in range(nc, nc + x.num_new_tokens):
                self.device[self.slot(x, p)] = (p, r.all_token_ids[p])
        for x in sched.scheduled:
            r = x.request
            for p in range(r.num_computed_tokens + x.num_new_tokens):
                got = self.device[self.slot(x, p)]
                assert got == (p, r.all_token_ids[p]), f"{r.request_id} position {p}: {got}"


def execute(sched) -> ModelRunnerOutput:
    """A token that depends on the request and its length, so generated KV differs per request."""
    return ModelRunnerOutput({s.request.request_id: [1 + (hash(s.request.request_id) + s.request.num_tokens) % 997]
                              for s in sched.scheduled if s.samples})


@settings(max_examples=500, deadline=None)
@given(
    reqs=st.lists(request_st, min_size=3, max_size=14),
    num_blocks=st.integers(3, 20),  # small pools: preemption is the point
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 8),
    chunked=st.booleans(),
    caching=st.booleans(),
    abort_steps=st.sets(st.integers(0, 60), max_size=4),
    policy=st.sampled_from(["fcfs", "priority"]),
    scheduling=st.sampled_from(["continuous", "continuous", "static"]),
    mode=st.sampled_from(["swap", "recompute"]),
    num_host_blocks=st.integers(0, 24),
    watermark=st.sampled_from([0.0, 0.1, 0.3]),
    cap=st.integers(1, 3),
    long_threshold=st.sampled_from([0, 6]),
)
def test_kv_data_and_invariants_hold_under_swap_and_priorities(
        reqs, num_blocks, block_size, budget, max_num_seqs, chunked, caching, abort_steps, policy, scheduling,
        mode, num_host_blocks, watermark, cap, long_threshold):
    s = make_scheduler(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                       scheduling_policy=policy, scheduling=scheduling, preemption_mode=mode,
                       num_host_blocks=num_host_blocks, watermark=watermark, max_preemptions_per_request=cap,
                       long_generation_threshold=long_threshold, long_generation_seat_share=0.5)
    kv = SimulatedKV(num_blocks, s.swap.num_blocks, block_size)
    pending = [(arrival, make_request(f"r{i}", prompt_len=plen, max_tokens=mt, base=(i % 2) * 1000,
                                      priority=prio, arrival_time=float(i)))
               for i, (plen, mt, arrival, prio) in enumerate(reqs)]
    accepted = []
    for step in range(600):
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
        s.update_from_output(sched, execute(sched))
        s.check_integrity()
        assert sched.total_num_scheduled_tokens <= budget and len(s.running) <= max_num_seqs
        if step > max(p[0] for p in pending) and not s.has_unfinished_requests():
            break
    event(f"preemptions: {min(s.num_preemptions, 3)}+, swap-outs: {min(s.num_swap_outs, 3)}+, "
          f"fallbacks: {min(s.num_swap_fallbacks, 1)}+")
    assert not s.has_unfinished_requests(), "requests left hanging"
    assert s.kv.num_free_blocks == num_blocks and s.swap.num_free_blocks == s.swap.num_blocks
    for req in accepted:
        assert req.status.is_finished
        if req.status == RequestStatus.FINISHED_LENGTH_CAPPED:
            assert req.num_output_tokens == req.max_tokens

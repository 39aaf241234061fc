"""Random arrivals, lengths, aborts and pool sizes: the KV invariants hold after every step."""
from hypothesis import example, given, settings, strategies as st

from fake_runner import make_request, make_scheduler, run_step
from inflight.core.request import RequestStatus

request_st = st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3), st.integers(0, 5))


@settings(max_examples=300, deadline=None)
@given(
    reqs=st.lists(request_st, min_size=1, max_size=12),
    num_blocks=st.integers(4, 40),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    caching=st.booleans(),
    threshold=st.sampled_from([0, 3]),
    abort_steps=st.sets(st.integers(0, 60), max_size=5),
    policy=st.sampled_from(["fcfs", "priority"]),
    scheduling=st.sampled_from(["continuous", "static"]),
)
# two requests that cannot both fit, the older of lower priority: once out of preemptions it
# preempted itself while the newer one, which may not preempt it, preempted itself too (a livelock)
@example(reqs=[(11, 1, 1, 0), (24, 2, 0, 1), (23, 5, 0, 0)], num_blocks=18, block_size=2, budget=6, max_num_seqs=3,
         chunked=True, caching=False, threshold=3, abort_steps=set(), policy="priority", scheduling="continuous")
def test_invariants_hold_under_random_traffic(reqs, num_blocks, block_size, budget, max_num_seqs, chunked,
                                              caching, threshold, abort_steps, policy, scheduling):
    s = make_scheduler(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                       enable_prefix_caching=caching, long_prefill_token_threshold=threshold,
                       scheduling_policy=policy, scheduling=scheduling)
    pending = []
    for i, (plen, mt, arrival, prio) in enumerate(reqs):
        # A small vocabulary of prefixes so prefix-cache hits and sharing happen.
        pending.append((arrival, make_request(f"r{i}", prompt_len=plen, max_tokens=mt, base=(i % 2) * 1000,
                                              priority=prio, arrival_time=float(i))))
    accepted = []
    for step in range(400):
        for arrival, req in [p for p in pending if p[0] == step]:
            try:
                s.add_request(req)
                accepted.append(req)
            except ValueError:
                pass  # infeasible for this pool/budget: rejected up front, never queued
        if step in abort_steps and s.running:
            s.abort_requests([s.running[0].request_id])
        sched, _ = run_step(s)
        s.kv.check_integrity()
        assert sched.total_num_scheduled_tokens <= budget
        assert len(s.running) <= max_num_seqs
        for x in sched.scheduled:
            assert x.request.num_computed_tokens <= x.request.num_tokens
        if step > max(p[0] for p in pending) and not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests(), "requests left hanging"
    assert s.kv.num_free_blocks == num_blocks
    for req in accepted:
        assert req.status.is_finished
        if req.status == RequestStatus.FINISHED_LENGTH_CAPPED:
            assert req.num_output_tokens == req.max_tokens

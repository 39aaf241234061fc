"""Scheduler and KV cache manager behaviour with a fake model runner."""
import pytest

from fake_runner import make_request, make_scheduler, run_step
from inflight.core.request import RequestStatus


def split(sched):
    return {s.request.request_id: s.num_new_tokens for s in sched.scheduled}


def test_decodes_first_then_prefill_takes_remainder():
    s = make_scheduler(max_num_batched_tokens=10, max_num_seqs=8)
    s.add_request(make_request("a", prompt_len=6, max_tokens=5))
    s.add_request(make_request("b", prompt_len=6, max_tokens=5, base=100))
    s.add_request(make_request("c", prompt_len=20, max_tokens=5, base=200))
    sched, _ = run_step(s)
    assert split(sched) == {"a": 6, "b": 4}  # b chunked to the remaining budget
    sched, _ = run_step(s)
    # a decodes (1), b finishes its prompt (2), c gets the remaining 7
    assert split(sched) == {"a": 1, "b": 2, "c": 7}
    assert [x.request.request_id for x in sched.scheduled] == ["a", "b", "c"]
    sched, _ = run_step(s)
    assert split(sched) == {"a": 1, "b": 1, "c": 8}
    sched, _ = run_step(s)
    assert split(sched) == {"a": 1, "b": 1, "c": 5}


def test_max_num_seqs_limits_running():
    s = make_scheduler(max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(4):
        s.add_request(make_request(f"r{i}", prompt_len=4, max_tokens=2, base=10 * i))
    sched, _ = run_step(s)
    assert set(split(sched)) == {"r0", "r1"}
    assert len(s.waiting) == 2
    sched, outs = run_step(s)
    assert split(sched) == {"r0": 1, "r1": 1}
    assert {o.request_id for o in outs if o.finish_reason == "length"} == {"r0", "r1"}
    sched, _ = run_step(s)
    assert split(sched) == {"r2": 4, "r3": 4}


def test_long_prefill_token_threshold_caps_chunks():
    s = make_scheduler(max_num_batched_tokens=100, long_prefill_token_threshold=8)
    s.add_request(make_request("a", prompt_len=20, max_tokens=2))
    s.add_request(make_request("b", prompt_len=5, max_tokens=2, base=100))
    chunks = []
    for _ in range(3):
        sched, _ = run_step(s)
        chunks.append(split(sched))
    assert chunks[0] == {"a": 8, "b": 5}
    assert chunks[1] == {"a": 8, "b": 1}
    assert chunks[2] == {"a": 4}  # b finished after its 2 tokens


def test_without_chunked_prefill_prompt_runs_whole_or_waits():
    s = make_scheduler(max_num_batched_tokens=10, enable_chunked_prefill=False)
    s.add_request(make_request("a", prompt_len=6, max_tokens=3))
    s.add_request(make_request("b", prompt_len=6, max_tokens=3, base=100))
    sched, _ = run_step(s)
    assert split(sched) == {"a": 6}  # b does not fit whole in the remaining 4
    sched, _ = run_step(s)
    assert split(sched) == {"a": 1, "b": 6}
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        s.add_request(make_request("c", prompt_len=11, max_tokens=1))


def test_preemption_by_recompute_newest_first_and_resumes():
    # 4 blocks of 4 tokens; two requests of 8 prompt tokens take 2 blocks each;
    # computing position 8 needs a third block: the newest request is preempted.
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    s.add_request(make_request("old", prompt_len=8, max_tokens=6))
    s.add_request(make_request("new", prompt_len=8, max_tokens=6, base=100))
    run_step(s)  # both prefilled and sampled: 9 tokens each, 2 blocks each
    sched, _ = run_step(s)  # old needs block 3 -> new is preempted
    assert sched.preempted_req_ids == ["new"]
    assert split(sched) == {"old": 1}
    new = s.waiting[0]
    assert new.request_id == "new" and new.status == RequestStatus.PREEMPTED
    assert new.num_computed_tokens == 0 and new.num_preemptions == 1
    s.kv.check_integrity()
    finished = {}
    for _ in range(30):
        _, outs = run_step(s)
        s.kv.check_integrity()
        finished.update({o.request_id: o.finish_reason for o in outs if o.finish_reason})
        if not s.has_unfinished_requests():
            break
    assert finished == {"old": "length", "new": "length"}
    assert s.kv.num_free_blocks == 4
    assert s.num_preemptions >= 1


def test_abort_frees_blocks_immediately():
    s = make_scheduler(num_blocks=16, block_size=4)
    s.add_request(make_request("a", prompt_len=9, max_tokens=10))
    s.add_request(make_request("b", prompt_len=3, max_tokens=10, base=50))
    run_step(s)
    assert s.kv.num_free_blocks == 16 - 3 - 1
    s.abort_requests(["a"])
    assert s.kv.num_free_blocks == 16 - 1
    s.abort_requests(["b", "unknown"])
    assert s.kv.num_free_blocks == 16
    assert not s.has_unfinished_requests()
    s.kv.check_integrity()


def test_abort_waiting_request():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("a"))
    s.add_request(make_request("b", base=100))
    run_step(s)
    s.abort_requests(["b"])
    assert list(s.waiting) == []


def test_prefix_cache_hit_exact_blocks_and_ref_counts():
    s = make_scheduler(num_blocks=16, block_size=4)
    # 10-token prompt: blocks 0,1 full (cached), block 2 partial (private).
    s.add_request(make_request("a", prompt_len=10, max_tokens=5))
    sched, _ = run_step(s)
    assert sched.scheduled[0].block_ids == ([0, 1, 2],)
    s.add_request(make_request("b", prompt_len=10, max_tokens=5))
    sched, _ = run_step(s)
    b = next(x for x in sched.scheduled if x.request.request_id == "b")
    assert b.block_ids[0][:2] == [0, 1]  # shared full blocks
    assert b.block_ids[0][2] not in (0, 1, 2)  # the partial block is never shared
    assert b.num_new_tokens == 2 and b.request.num_cached_tokens == 8
    pool = s.kv.pool
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 2)] == [2, 2, 1]
    assert s.kv.prefix_cache_hits == 8
    s.kv.check_integrity()


def test_prefix_cache_always_recomputes_last_token():
    s = make_scheduler(num_blocks=16, block_size=4)
    s.add_request(make_request("a", prompt_len=8, max_tokens=1))
    run_step(s)
    s.add_request(make_request("b", prompt_len=8, max_tokens=1))
    sched, _ = run_step(s)
    # 8 tokens = 2 full cached blocks, but the last token must be computed to sample.
    assert split(sched) == {"b": 4}
    assert sched.scheduled[0].request.num_cached_tokens == 4


def test_eviction_is_lru_and_tail_first():
    s = make_scheduler(num_blocks=6, block_size=4)
    s.add_request(make_request("a", prompt_len=8, max_tokens=1))  # blocks 0,1
    run_step(s)
    assert not s.has_unfinished_requests()
    # freed tail first behind the never-used blocks; hashes of 0,1 are kept.
    assert list(s.kv.pool._free) == [2, 3, 4, 5, 1, 0]
    s.add_request(make_request("b", prompt_len=15, max_tokens=1, base=500))  # needs 4 blocks
    sched, _ = run_step(s)
    assert sched.scheduled[0].block_ids == ([2, 3, 4, 5],)
    assert s.kv.pool.blocks[1].block_hash is not None  # a's prefix survives
    s.add_request(make_request("c", prompt_len=9, max_tokens=1))
    sched, _ = run_step(s)
    assert sched.scheduled[0].block_ids[0][:2] == [0, 1]  # hit on the surviving prefix


def test_salt_separates_prefix_caches():
    s = make_scheduler(num_blocks=16, block_size=4)
    s.add_request(make_request("a", prompt_len=9, max_tokens=1, cache_salt="x"))
    run_step(s)
    s.add_request(make_request("b", prompt_len=9, max_tokens=1, cache_salt="y"))
    sched, _ = run_step(s)
    assert sched.scheduled[0].request.num_cached_tokens == 0


def test_infeasible_request_rejected_with_limit_named():
    s = make_scheduler(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="4 blocks"):
        s.add_request(make_request("big", prompt_len=14, max_tokens=4))
    s.add_request(make_request("ok", prompt_len=4, max_tokens=4))
    assert s.has_unfinished_requests()


def test_stop_conditions_eos_and_min_tokens():
    s = make_scheduler()
    r = make_request("a", prompt_len=4, max_tokens=10, ignore_eos=False)
    r.sampling_params.min_tokens = 2
    s.add_request(r)
    _, outs = run_step(s, token=0)  # eos, but min_tokens not reached
    assert outs[0].finish_reason is None
    _, outs = run_step(s, token=0)
    assert outs[0].finish_reason == "stop"
    assert r.output_token_ids == [0, 0]


def test_priority_policy_admits_urgent_first():
    s = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    s.add_request(make_request("low", priority=5, arrival_time=1.0))
    s.add_request(make_request("high", priority=-1, arrival_time=2.0, base=100))
    sched, _ = run_step(s)
    assert split(sched) == {"high": 8}

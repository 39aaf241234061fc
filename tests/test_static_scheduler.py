"""Static (request-level) batching on the same scheduler machinery."""
from fake_runner import make_request, make_scheduler, run_step


def _drive(s, max_steps=50, token=7):
    trace = []
    for _ in range(max_steps):
        sched, outs = run_step(s, token)
        s.kv.check_integrity()
        trace.append(({x.request.request_id: x.num_new_tokens for x in sched.scheduled},
                      sorted({o.request_id for o in outs})))
        if not s.has_unfinished_requests():
            break
    return trace


def test_padded_static_batch_holds_rows_and_releases_at_end():
    s = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, scheduling="static")
    s.add_request(make_request("a", prompt_len=4, max_tokens=4))
    s.add_request(make_request("b", prompt_len=4, max_tokens=2, base=100))
    s.add_request(make_request("c", prompt_len=4, max_tokens=1, base=200))
    trace = _drive(s)
    batches = [t[0] for t in trace]
    assert batches[0] == {"a": 4, "b": 4}  # c may not join the running batch
    # b finished after step 1 but keeps computing a padding row until a finishes.
    assert batches[1] == {"a": 1, "b": 1}
    assert batches[2] == {"a": 1, "b": 1}
    assert batches[3] == {"a": 1, "b": 1}
    assert batches[4] == {"c": 4}  # the next batch starts only after the last member ends
    released = [t[1] for t in trace]
    assert released[:3] == [[], [], []]  # nothing is handed back mid-batch
    assert released[3] == ["a", "b"]  # a's 4 tokens and b's 2, all at the batch end
    assert released[4] == ["c"]
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_static_without_padding_drops_finished_rows():
    s = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, scheduling="static", static_padding=False)
    s.add_request(make_request("a", prompt_len=4, max_tokens=4))
    s.add_request(make_request("b", prompt_len=4, max_tokens=2, base=100))
    s.add_request(make_request("c", prompt_len=4, max_tokens=1, base=200))
    batches = [t[0] for t in _drive(s)]
    assert batches[:5] == [{"a": 4, "b": 4}, {"a": 1, "b": 1}, {"a": 1}, {"a": 1}, {"c": 4}]


def test_static_outputs_equal_token_counts():
    s = make_scheduler(max_num_seqs=3, max_num_batched_tokens=64, scheduling="static")
    for i, n in enumerate([3, 1, 5, 2]):
        s.add_request(make_request(f"r{i}", prompt_len=3, max_tokens=n, base=10 * i))
    got = {}
    for _ in range(40):
        _, outs = run_step(s)
        for o in outs:
            got[o.request_id] = got.get(o.request_id, 0) + len(o.new_token_ids)
        if not s.has_unfinished_requests():
            break
    assert got == {"r0": 3, "r1": 1, "r2": 5, "r3": 2}


def test_a_padding_rows_slot_is_not_served_from_the_prefix_cache_unwritten():
    """A finished member's padding slot (its sampled token's position) is reserved at once but
    written only when padding runs; a batch that ends first must not leave that block in the
    prefix cache, where a prompt with the same tokens would read its unwritten slot."""
    s = make_scheduler(num_blocks=8, block_size=2, max_num_seqs=1, max_num_batched_tokens=64, scheduling="static",
                       enable_prefix_caching=True)
    s.add_request(make_request("a", prompt_len=1, max_tokens=1))  # [0], then samples 1: one full block
    _drive(s, max_steps=1, token=1)
    s.add_request(make_request("b", prompt_len=3, max_tokens=1))  # [0, 1, 2]: the same first block
    step, _ = run_step(s)
    assert {x.request.request_id: x.num_new_tokens for x in step.scheduled} == {"b": 3}
    assert s.kv.prefix_cache_hits == 0

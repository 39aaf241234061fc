"""Prefix-cache identity: block hashes are sha256 chains, and cache_salt separates tenants."""
from __future__ import annotations

import hashlib

from fake_runner import make_request, make_scheduler, run_step
from inflight.core.kv_cache_utils import ROOT_BLOCK_HASH, hash_block_tokens


def _python_hash(parent, tokens, extra=None) -> int:
    """The block hash this engine used before: Python's built-in hash of a tuple."""
    return hash((parent, tuple(tokens), extra))


def test_block_hash_is_sha256_of_parent_tokens_and_salt():
    h = hash_block_tokens(None, [1, 2, 3, 4])
    assert isinstance(h, bytes) and len(h) == 32
    assert h == hash_block_tokens(None, (1, 2, 3, 4))  # list or tuple: same block
    assert h == hash_block_tokens(ROOT_BLOCK_HASH, [1, 2, 3, 4])
    assert h != hash_block_tokens(h, [1, 2, 3, 4])
    assert h != hash_block_tokens(None, [1, 2, 3, 4], "")  # an empty salt is a salt
    assert hash_block_tokens(None, [1, 2, 3, 4], "a") != hash_block_tokens(None, [1, 2, 3, 4], "b")
    # fields are length-prefixed: moving bytes between them never gives the same input
    assert hash_block_tokens(None, [1, 2], "x") != hash_block_tokens(None, [1, 2, 0], None)
    assert hashlib.sha256(h).digest() != h


def test_crafted_python_hash_collisions_do_not_collide():
    # hash(-1) == hash(-2) and ints hash modulo 2**61 - 1: tuples built from them collide.
    assert _python_hash(None, [-1, 5]) == _python_hash(None, [-2, 5])
    assert _python_hash(None, [7, 2**61 + 5]) == _python_hash(None, [7, 6])
    assert hash_block_tokens(None, [-1, 5]) != hash_block_tokens(None, [-2, 5])
    assert hash_block_tokens(None, [7, 2**61 + 5]) != hash_block_tokens(None, [7, 6])


def test_crafted_colliding_prompt_gets_no_prefix_hit():
    """A prompt whose blocks collided under the old hash must not be served another's KV."""
    s = make_scheduler(num_blocks=16, block_size=4)
    victim = make_request("victim", prompt_len=9, max_tokens=1)
    victim.prompt_token_ids[:] = victim.all_token_ids[:] = [-1] * 9
    s.add_request(victim)
    run_step(s)
    attacker = make_request("attacker", prompt_len=9, max_tokens=1)
    attacker.prompt_token_ids[:] = attacker.all_token_ids[:] = [-2] * 9
    assert _python_hash(None, [-1] * 4) == _python_hash(None, [-2] * 4)
    s.add_request(attacker)
    sched, _ = run_step(s)
    assert sched.scheduled[0].request.num_cached_tokens == 0
    s.kv.check_integrity()


def _serve_twice(salt_a, salt_b) -> tuple[int, set[int], set[int]]:
    """Run two requests with the same prompt; returns b's cached tokens and both block sets."""
    s = make_scheduler(num_blocks=32, block_size=4)
    s.add_request(make_request("a", prompt_len=13, max_tokens=3, cache_salt=salt_a))
    sched, _ = run_step(s)
    blocks_a = set(sched.scheduled[0].block_ids[0])
    s.add_request(make_request("b", prompt_len=13, max_tokens=3, cache_salt=salt_b))
    sched, _ = run_step(s)
    b = next(x for x in sched.scheduled if x.request.request_id == "b")
    return b.request.num_cached_tokens, blocks_a, set(b.block_ids[0])


def test_two_salts_share_no_blocks():
    cached, blocks_a, blocks_b = _serve_twice("tenant-a", "tenant-b")
    assert cached == 0 and not blocks_a & blocks_b
    cached, blocks_a, blocks_b = _serve_twice(None, "tenant-b")
    assert cached == 0 and not blocks_a & blocks_b


def test_the_same_salt_shares_its_prefix():
    cached, blocks_a, blocks_b = _serve_twice("tenant-a", "tenant-a")
    assert cached == 12 and len(blocks_a & blocks_b) == 3
    cached, _, _ = _serve_twice(None, None)
    assert cached == 12


def test_cached_tokens_only_within_the_request_salt():
    """Over HTTP: a tenant learns nothing of another salt's prefixes from cached_tokens."""
    import httpx

    from inflight.entrypoints.openai.server_thread import ServerThread
    from test_async_engine import make_fake_engine

    engine = make_fake_engine(num_blocks=256, block_size=4, max_model_len=128, max_num_seqs=8,
                              max_num_batched_tokens=256)
    prompt = "A prefix that spans several KV blocks, sent by two tenants. "

    def cached(h: httpx.Client, salt=None, chat: bool = False) -> int:
        body = {"max_tokens": 2, **({"cache_salt": salt} if salt else {})}
        if chat:
            r = h.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": prompt}]})
        else:
            r = h.post("/v1/completions", json={**body, "prompt": prompt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with ServerThread(engine, "fake", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        assert cached(h, "tenant-a") == 0
        assert cached(h, "tenant-b") == 0  # same prompt, other tenant: no hit, nothing learned
        assert cached(h) == 0
        assert cached(h, "tenant-a") >= 40  # its own prefix still hits
        assert cached(h, "tenant-a", chat=True) == 0 and cached(h, "tenant-a", chat=True) >= 40
        assert cached(h, "tenant-b", chat=True) == 0

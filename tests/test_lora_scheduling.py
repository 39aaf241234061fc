"""LoRA in the scheduler (no model): max_loras bounds the adapters a step mixes, and
requests of different adapters never share prefix-cache blocks."""
from fake_runner import make_request, make_scheduler, run_step
from inflight.core.kv_cache_utils import hash_block_tokens
from inflight.lora import LoRARequest

A, B, C = (LoRARequest(n, i, f"/adapters/{n}") for i, n in enumerate("abc", 1))


def _adapters(step) -> set:
    return {x.request.lora_int_id for x in step.scheduled if x.request.lora_int_id}


def test_max_loras_bounds_the_adapters_of_every_step():
    s = make_scheduler(max_num_batched_tokens=256, max_num_seqs=16, max_loras=2)
    order = [A, B, None, C, A, C, B, None]
    for i, lora in enumerate(order):
        s.add_request(make_request(f"r{i}", prompt_len=4, max_tokens=3 + i, base=10 * i, lora_request=lora))
    step, _ = run_step(s)
    # a and b fill the two seats for adapters; c waits, base-model requests do not
    assert {x.request.request_id for x in step.scheduled} == {"r0", "r1", "r2", "r4", "r6", "r7"}
    seen = [_adapters(step)]
    while s.has_unfinished_requests():
        step, _ = run_step(s)
        seen.append(_adapters(step))
        s.check_integrity()
    assert all(len(ids) <= 2 for ids in seen)
    assert 3 in set().union(*seen)  # c ran once a's or b's requests were done
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_without_lora_nothing_waits_for_an_adapter_seat():
    s = make_scheduler(max_num_batched_tokens=256, max_num_seqs=16)
    for i, lora in enumerate([A, B, C]):
        s.add_request(make_request(f"r{i}", prompt_len=4, base=10 * i, lora_request=lora))
    step, _ = run_step(s)
    assert len(step.scheduled) == 3


def test_adapters_share_no_prefix_blocks():
    def cached(lora_a, lora_b) -> int:
        s = make_scheduler(num_blocks=32, block_size=4)
        s.add_request(make_request("a", prompt_len=13, max_tokens=3, lora_request=lora_a))
        run_step(s)
        s.add_request(make_request("b", prompt_len=13, max_tokens=3, lora_request=lora_b))
        step, _ = run_step(s)
        return next(x for x in step.scheduled if x.request.request_id == "b").request.num_cached_tokens

    assert cached(A, A) == 12
    assert cached(None, A) == 0 and cached(A, None) == 0 and cached(A, B) == 0


def test_the_adapter_name_is_its_own_hash_field():
    tokens = [1, 2, 3, 4]
    assert hash_block_tokens(None, tokens, lora_name="x") != hash_block_tokens(None, tokens)
    assert hash_block_tokens(None, tokens, lora_name="x") != hash_block_tokens(None, tokens, "x")  # salt "x"
    assert hash_block_tokens(None, tokens, "s", "x") != hash_block_tokens(None, tokens, "s", "y")
    assert hash_block_tokens(None, tokens, "s", "x") == hash_block_tokens(None, tokens, "s", "x")

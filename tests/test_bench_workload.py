"""The benchmark workloads' shapes: counts, lengths, and the same requests from the same seed."""
from inflight.bench.workload import WORKLOADS, generate
from inflight.loader import load_tokenizer


def test_longcontext_is_a_few_long_streams():
    """Four prompts of 1,500-3,500 whole-word tokens, 256 output tokens each, seeded."""
    tok = load_tokenizer()
    reqs = generate("longcontext", tok)
    assert "longcontext" in WORKLOADS and len(reqs) == 4
    for r in reqs:
        assert 1500 <= len(r.prompt.split()) <= 3500 and r.max_tokens == 256
        assert r.prompt_tokens == len(tok(r.prompt, add_special_tokens=False).input_ids)
        assert 0.9 * len(r.prompt.split()) <= r.prompt_tokens <= 1.2 * len(r.prompt.split())
    assert [r.prompt for r in generate("longcontext", tok)] == [r.prompt for r in reqs]
    assert [r.prompt for r in generate("longcontext", tok, seed=1)] != [r.prompt for r in reqs]

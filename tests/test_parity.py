"""Greedy outputs token-for-token equal to transformers' on the embedded model, in float32:
alone, batched, chunked, under preemption, and with prefix caching."""
import pytest
import torch

from hf_reference import load_hf_reference
from inflight import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:",
    "1, 2, 3, 4, 5,",
    "Translate to French: Good morning, my friend.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Water boils at a temperature of",
]
SHARED = ("You are a careful assistant. Answer briefly and precisely, and never invent facts. "
          "The user asks a question about geography, history or science. ")
MAX_TOKENS = 32


def _hf_greedy(model, tok, prompt_ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.eos_token_id)
    ids = out[0, len(prompt_ids):].tolist()
    eos = tok.eos_token_id
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", kv_cache_memory=128 * 2**20, max_num_seqs=16, max_num_batched_tokens=512)


@pytest.fixture(scope="module")
def expected(llm):
    tok = llm.get_tokenizer()
    model = load_hf_reference(dtype=torch.float32)
    torch.set_num_threads(torch.get_num_threads())
    prompts = PROMPTS + [SHARED + "What is the largest ocean?", SHARED + "Who painted the Mona Lisa?"]
    ids = [tok(p).input_ids for p in prompts]
    return ids, [_hf_greedy(model, tok, i) for i in ids]


def _run(llm, ids):
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate(prompt_token_ids=ids, sampling_params=sp, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _engine_with(llm, **sched):
    """Reuse the loaded model with different scheduler settings."""
    from inflight.config import CacheConfig, SchedulerConfig
    from inflight.core.scheduler import Scheduler

    eng = llm.llm_engine
    base = eng.config.scheduler_config
    cfg = SchedulerConfig(**{**base.__dict__, **sched.pop("sched", {})})
    cache = CacheConfig(**{**eng.config.cache_config.__dict__, **sched})
    num_blocks = cache.num_gpu_blocks_override or eng.num_blocks
    eng.scheduler = Scheduler(cfg, cache, num_blocks, eng.max_model_len)
    return eng.scheduler


def test_each_alone(llm, expected):
    ids, want = expected
    for i, w in zip(ids[:8], want[:8]):
        assert _run(llm, [i]) == [w]


def test_all_in_one_batch(llm, expected):
    ids, want = expected
    _engine_with(llm)
    assert _run(llm, ids) == want


def test_every_prompt_chunked(llm, expected):
    ids, want = expected
    # Chunks of at most 4 tokens: every prompt (all are longer) is prefilled over several
    # steps, interleaved with other requests' decodes and chunks.
    s = _engine_with(llm, sched={"long_prefill_token_threshold": 4, "max_num_batched_tokens": 24})
    assert min(len(i) for i in ids) > 4
    assert _run(llm, ids) == want
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_forced_preemption(llm, expected):
    ids, want = expected
    # 10 blocks of 16 tokens for 10 requests of up to ~60 tokens: preemption is certain.
    s = _engine_with(llm, num_gpu_blocks_override=10)
    assert _run(llm, ids) == want
    assert s.num_preemptions > 0
    assert s.kv.num_free_blocks == 10


def test_prefix_caching_shared_prefix(llm, expected):
    ids, want = expected
    s = _engine_with(llm, enable_prefix_caching=True)
    first = _run(llm, [ids[8]])
    second = _run(llm, [ids[9]])
    assert s.kv.prefix_cache_hits >= 16  # the shared prefix came from the cache
    assert first + second == want[8:]
    both = _run(llm, ids[8:])  # and again, both hitting
    assert both == want[8:]

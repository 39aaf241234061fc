"""Greedy outputs on the embedded model in float32 are the same with and without
forced preemption: by recompute, by swap (with a host pool small enough that
one victim falls back to recompute), and with an fp8 KV cache under pure swap
(swap copies fp8 values and their scales byte for byte).

NOTE: under fp8 on the torch reference backend, recompute is not exact: a prefill with
no cached prefix attends over its unquantized K/V, decodes over the quantized cache (the
CPU's C kernels read every key from the quantized pool)."""
import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.config import SchedulerConfig, SpeculativeConfig
from inflight.core.scheduler import Scheduler
from inflight.worker.kv_cache import allocate_kv_cache
from inflight.worker.swap import Swapper

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a small village by the sea,", "1, 2, 3, 4, 5,"]
MAX_TOKENS = 16
HOST_BLOCKS = 32  # the runner's host pool; each scheduler below uses at most this many


@pytest.fixture(scope="module")
def llm():
    # 8-token blocks so that 16 new tokens cross block boundaries; room for 32 swapped blocks.
    return LLM(dtype="float32", kv_cache_memory=16 * 2**20, block_size=8, max_num_seqs=8,
               max_num_batched_tokens=256, preemption_mode="swap", num_cpu_blocks_override=HOST_BLOCKS)


@pytest.fixture(scope="module")
def prompt_ids(llm):
    tok = llm.get_tokenizer()
    return [tok(p).input_ids for p in PROMPTS]


def _fresh_scheduler(llm, num_blocks=None, num_host_blocks=0, spec=None, **sched) -> Scheduler:
    eng = llm.llm_engine
    cfg = SchedulerConfig(**{**eng.config.scheduler_config.__dict__, **sched})
    eng.scheduler = Scheduler(cfg, eng.config.cache_config, num_blocks or eng.num_blocks, eng.max_model_len,
                              num_host_blocks=num_host_blocks, speculative_config=spec)
    return eng.scheduler


def _generate(llm, ids):
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate(prompt_token_ids=ids, sampling_params=sp, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def expected(llm, prompt_ids):
    s = _fresh_scheduler(llm)
    out = _generate(llm, prompt_ids)
    assert s.num_preemptions == 0
    return out


def _check_drained(s: Scheduler) -> None:
    s.check_integrity()
    assert not s.has_unfinished_requests()
    assert s.kv.num_free_blocks == s.kv.num_blocks and s.swap.num_free_blocks == s.swap.num_blocks


def test_recompute_preemption_keeps_greedy_outputs(llm, prompt_ids, expected):
    # 7 blocks of 8 tokens for 4 requests of 21 to 30 tokens: preemption is certain.
    s = _fresh_scheduler(llm, num_blocks=7, preemption_mode="recompute")
    assert _generate(llm, prompt_ids) == expected
    assert s.num_preemptions > 0 and s.num_swap_outs == 0
    _check_drained(s)


def test_swap_preemption_and_its_fallback_keep_greedy_outputs(llm, prompt_ids, expected):
    # A 3-block host pool: some victims are swapped, one finds it full and is recomputed.
    swapper = llm.llm_engine.runner.swapper
    before = swapper.num_blocks_swapped_in
    s = _fresh_scheduler(llm, num_blocks=6, num_host_blocks=3, preemption_mode="swap")
    assert _generate(llm, prompt_ids) == expected
    assert s.num_swap_outs > 0 and s.num_swap_fallbacks > 0
    assert swapper.num_blocks_swapped_in > before  # the blocks really went through the host pool
    _check_drained(s)


@pytest.mark.parametrize("mode,num_blocks,num_host_blocks", [("recompute", 7, 0), ("swap", 6, 3)])
def test_speculative_decoding_under_preemption_keeps_greedy_outputs(llm, prompt_ids, expected, mode, num_blocks,
                                                                    num_host_blocks):
    """Drafts rejected before a preemption leave stale KV past num_computed_tokens; a
    victim's recompute or swap must not carry it into the output."""
    s = _fresh_scheduler(llm, num_blocks=num_blocks, num_host_blocks=num_host_blocks, preemption_mode=mode,
                         spec=SpeculativeConfig(num_speculative_tokens=3))
    assert _generate(llm, prompt_ids) == expected
    assert s.num_preemptions > 0 and s.num_accepted_tokens > 0
    _check_drained(s)


def test_fp8_kv_cache_under_swap_matches_fp8_without_preemption(llm, prompt_ids):
    eng = llm.llm_engine
    runner = eng.runner
    saved = runner.kv_caches, runner.swapper
    cc = eng.config.cache_config
    try:
        runner.kv_caches = allocate_kv_cache(eng.arch, eng.num_blocks, cc.block_size, torch.float32,
                                             eng.device, "fp8")
        runner.swapper = Swapper(runner.kv_caches, HOST_BLOCKS, eng.device)
        _fresh_scheduler(llm)
        want = _generate(llm, prompt_ids)
        s = _fresh_scheduler(llm, num_blocks=7, num_host_blocks=HOST_BLOCKS, preemption_mode="swap")
        assert _generate(llm, prompt_ids) == want
        assert s.num_swap_outs > 0 and s.num_swap_fallbacks == 0
        _check_drained(s)
    finally:
        runner.kv_caches, runner.swapper = saved
        _fresh_scheduler(llm)

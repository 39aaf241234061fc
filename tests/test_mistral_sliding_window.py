"""Mistral with its sliding window from an HF folder: greedy float32 tokens equal
transformers' on a tiny random-weight checkpoint whose window (8 tokens) is far
shorter than the prompts and generations, alone, batched, in tiny chunks, under
preemption (recompute and swap) and prefix-cached, on the CPU fast path and the
torch reference, while the KV manager frees the blocks behind the window."""
from __future__ import annotations

import pytest
import torch
import transformers

from inflight import LLM, SamplingParams
from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.scheduler import Scheduler
from inflight.loader.testing import TOKENS, write_tiny_gguf

pytestmark = pytest.mark.slow

WINDOW = 8
HOST_BLOCKS = 64
MAX_TOKENS = 16
SHARED = [7 + (5 * j) % 240 for j in range(40)]
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(5)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201]]


def _mistral(window):
    cfg = transformers.MistralConfig(
        vocab_size=len(TOKENS), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=window,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["MistralForCausalLM"])
    torch.manual_seed(5)
    model = transformers.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return new[: new.index(2) + 1] if 2 in new else new


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(HF folder, transformers' greedy tokens for every prompt)."""
    folder = tmp_path_factory.mktemp("mistral_sw")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf")
    model = _mistral(WINDOW)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    want = [_hf_greedy(model, p) for p in PROMPTS]
    # the same weights without the window generate other tokens: the window is tested
    model.config.sliding_window = None
    assert [_hf_greedy(model, p) for p in PROMPTS[2:5]] != want[2:5]
    return str(folder), want


def _run(llm, prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp,
                                                          use_tqdm=False)]


def _scheduler(llm, sched: dict | None = None, **cache) -> Scheduler:
    """The loaded model with other scheduler settings (and its sliding window)."""
    eng = llm.llm_engine
    cfg = SchedulerConfig(**{**eng.config.scheduler_config.__dict__, **(sched or {})})
    cc = CacheConfig(**{**eng.config.cache_config.__dict__, **cache})
    eng.scheduler = Scheduler(cfg, cc, cc.num_gpu_blocks_override or eng.num_blocks, eng.max_model_len,
                              num_host_blocks=HOST_BLOCKS, sliding_window=eng.arch.sliding_window)
    return eng.scheduler


def _track_peak(s: Scheduler) -> list[int]:
    """Record the most blocks any request holds after each schedule()."""
    peak = [0]
    schedule = s.schedule

    def wrapped():
        out = schedule()
        peak[0] = max([peak[0]] + [s.kv.num_blocks_of(x.request.request_id) for x in s.last_scheduled])
        return out
    s.schedule = wrapped
    return peak


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_equals_transformers(checkpoint, backend):
    folder, want = checkpoint
    llm = LLM(model=folder, dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
              max_num_seqs=16, max_num_batched_tokens=256, block_size=4, preemption_mode="swap",
              num_cpu_blocks_override=HOST_BLOCKS)
    eng = llm.llm_engine
    assert eng.arch.sliding_window == WINDOW
    assert all(ly.self_attn.sliding_window == WINDOW for ly in eng.runner.model.layers)
    if backend == "auto" and eng.runner.model.layer_loop is None:
        pytest.skip("no C layer loop on this machine")  # the torch run still checks the reference path

    for p, w in zip(PROMPTS[2:4], want[2:4]):
        assert _run(llm, [p]) == [w]
    s = _scheduler(llm)
    peak = _track_peak(s)
    assert _run(llm, PROMPTS) == want
    # a whole prompt of up to 50 tokens in one chunk, then decodes over 8-token windows
    assert peak[0] <= -(-(WINDOW - 1 + 50) // 4) + 1
    assert s.kv.num_free_blocks == s.kv.num_blocks

    s = _scheduler(llm, {"long_prefill_token_threshold": 4, "max_num_batched_tokens": 8})
    peak = _track_peak(s)
    assert _run(llm, PROMPTS) == want  # prefills in chunks of at most 4 tokens beside decodes
    assert peak[0] <= -(-(WINDOW - 1 + 8) // 4) + 1  # never more than the window's blocks
    assert s.kv.num_free_blocks == s.kv.num_blocks

    for mode in ("recompute", "swap"):
        s = _scheduler(llm, {"preemption_mode": mode, "max_num_batched_tokens": 16}, num_gpu_blocks_override=12)
        assert _run(llm, PROMPTS) == want
        assert s.num_preemptions > 0 and (mode == "recompute" or s.num_swap_outs > 0)
        assert s.kv.num_free_blocks == s.kv.num_blocks

    s = _scheduler(llm, enable_prefix_caching=True)
    assert _run(llm, PROMPTS[-2:-1]) + _run(llm, PROMPTS[-1:]) == want[-2:]
    assert s.kv.prefix_cache_hits >= 36  # the second prompt's shared blocks came from the cache

"""Speculative decoding by n-gram prompt lookup, at the scheduler: drafts are
scheduled as extra query rows, a step yields the accepted drafts plus the model's
own token, and the output is exactly what one-token-a-step greedy decoding gives.

The fake model here is a deterministic function of the whole token sequence,
verified row by row as the real model runner does (accept_greedy)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_runner import make_request, make_scheduler, schedule, worker_batch
from inflight.config import EngineConfig, SpeculativeConfig
from inflight.core.outputs import ModelRunnerOutput
from inflight.core.spec_decode import NgramProposer, accept_greedy
from inflight.sampling_params import SamplingParams


def ngram(max_n=4, min_n=1, k=4):
    return NgramProposer(SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_max=max_n, prompt_lookup_min=min_n))


def test_proposes_what_followed_the_latest_earlier_match_of_the_longest_suffix():
    toks = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3]
    # [6, 1, 2, 3] never occurred before; [1, 2, 3] did, last at index 6, followed by 7, 8, 6
    assert ngram().propose(toks, 2) == [7, 8]
    assert ngram().propose(toks, 10) == [7, 8, 6, 1, 2, 3]  # the continuation may run into the suffix
    assert ngram(max_n=1).propose([4, 5, 6, 5], 3) == [6, 5]  # [5] last seen at index 1
    assert ngram().propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert ngram(min_n=2).propose([7, 1, 2, 3, 1], 3) == []  # only a 1-gram recurs
    assert ngram().propose([5, 5], 0) == [] and ngram().propose([5], 3) == []


def test_a_byte_match_straddling_two_tokens_is_not_a_match():
    # 256 = bytes 00 01 00 00, then 0 = 00 00 00 00: token 1 (01 00 00 00) appears at byte offset 1
    assert ngram(max_n=1).propose([256, 0, 1], 3) == []
    assert ngram(max_n=1).propose([256, 0, 1, 9, 1], 3) == [9, 1]


def test_accept_greedy_keeps_drafts_until_the_first_disagreement_then_the_models_token():
    assert accept_greedy((5, 6, 7), [5, 6, 9, 4]) == [5, 6, 9]
    assert accept_greedy((5, 6, 7), [1, 6, 7, 4]) == [1]
    assert accept_greedy((5, 6), [5, 6, 3]) == [5, 6, 3]
    assert accept_greedy((), [8]) == [8]


def periodic_model(period: int, eos: int = -1, eos_at: int = -1):
    """Next token = the token ``period`` back (so it repeats, and lookup drafts hit),
    except ``eos`` once the sequence reaches ``eos_at`` tokens."""
    def next_token(seq: list[int]) -> int:
        if len(seq) == eos_at:
            return eos
        return seq[-period] if len(seq) >= period else 3
    return next_token


def execute(scheduler, sched, model) -> ModelRunnerOutput:
    """The model runner's contract: a target token after the last known token and
    after every draft, then accept_greedy."""
    out = ModelRunnerOutput()
    for s in worker_batch(scheduler, sched):
        if not s.samples:
            continue
        seq = list(s.state.all_token_ids)
        targets = [model(seq + list(s.spec_token_ids[:j])) for j in range(len(s.spec_token_ids) + 1)]
        out.sampled_token_ids[s.req_id] = accept_greedy(s.spec_token_ids, targets)
    return out


def run(requests, model, spec=None, **sched_kw):
    """Run to completion; returns ({id: output tokens}, steps, the schedule outputs)."""
    sched = make_scheduler(speculative_config=spec, **sched_kw)
    for r in requests:
        sched.add_request(r)
    outputs, steps, log = {r.request_id: [] for r in requests}, 0, []
    while sched.has_unfinished_requests():
        so = schedule(sched)
        log.append(so)
        for o in sched.update_from_output(so, execute(sched, so, model)):
            outputs[o.request_id].extend(o.new_token_ids)
        sched.check_integrity()
        steps += 1
        assert steps < 10_000
    assert sched.kv.num_free_blocks == sched.kv.num_blocks  # every block back in the pool
    return outputs, steps, log


def reqs(n=3, prompt_len=10, max_tokens=40, shared_prefix=False, **kw):
    """``shared_prefix``: every prompt starts 1, 2, 3, ... (prefix-cache hits), else each its own."""
    return [make_request(f"r{i}", prompt_len + (i if shared_prefix else 0), max_tokens,
                         base=1 if shared_prefix else 10 * i + 1, **kw) for i in range(n)]


def test_same_tokens_as_plain_greedy_in_fewer_steps():
    model = periodic_model(5)
    plain, plain_steps, _ = run(reqs(), model)
    spec, spec_steps, log = run(reqs(), model, SpeculativeConfig(num_speculative_tokens=4))
    assert spec == plain and all(len(v) == 40 for v in spec.values())
    assert spec_steps < plain_steps / 2
    drafted = [s for so in log for s in so.scheduled if s.spec_token_ids]
    assert drafted and all(s.num_new_tokens == 1 + len(s.spec_token_ids) <= 5 for s in drafted)


def test_max_tokens_and_a_stop_token_inside_accepted_drafts_end_the_request_there():
    model = periodic_model(4)
    capped, _, _ = run(reqs(n=1, max_tokens=7), model, SpeculativeConfig(num_speculative_tokens=4))
    assert len(capped["r0"]) == 7
    # EOS (0) comes as the 13th token of a 10-token prompt
    eos_model = periodic_model(4, eos=0, eos_at=12)
    plain, _, _ = run(reqs(n=1, ignore_eos=False), eos_model)
    spec, _, _ = run(reqs(n=1, ignore_eos=False), eos_model, SpeculativeConfig(num_speculative_tokens=4))
    assert spec == plain and spec["r0"][-1] == 0 and len(spec["r0"]) == 3


def test_no_drafts_at_or_above_disable_by_batch_size_and_within_the_token_budget():
    model = periodic_model(3)
    staggered = [make_request(f"r{i}", 10, m, base=10 * i + 1) for i, m in enumerate([5, 10, 40, 40])]
    _, _, log = run(staggered, model, SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=3))
    for so in log:
        if any(s.spec_token_ids for s in so.scheduled):
            assert len(so.scheduled) <= 3  # proposed only when fewer than 3 ran
    assert any(s.spec_token_ids for so in log for s in so.scheduled)
    _, _, log = run(reqs(n=4), model, SpeculativeConfig(num_speculative_tokens=4), max_num_batched_tokens=6)
    assert all(so.total_num_scheduled_tokens <= 6 for so in log)
    assert any(s.spec_token_ids for so in log for s in so.scheduled)


def test_only_plain_greedy_requests_draft():
    model = periodic_model(3)
    sampled = make_request("hot", 10, 20)
    sampled.sampling_params = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True)
    penalized = make_request("pen", 10, 20)
    penalized.sampling_params = SamplingParams(temperature=0, repetition_penalty=1.2, max_tokens=20, ignore_eos=True)
    banning = make_request("bad", 10, 20)  # a bad word's ban depends on the tokens before each draft position
    banning.sampling_params = SamplingParams(temperature=0, bad_words=["x"], max_tokens=20, ignore_eos=True)
    _, _, log = run([sampled, penalized, banning], model, SpeculativeConfig())
    assert not any(s.spec_token_ids for so in log for s in so.scheduled)


@settings(max_examples=60, deadline=None)
@given(period=st.integers(1, 6), n=st.integers(1, 5), max_tokens=st.integers(1, 30), k=st.integers(1, 5),
       num_blocks=st.integers(12, 40), budget=st.integers(4, 32), noise=st.integers(0, 7), shared=st.booleans())
def test_property_spec_output_equals_plain_greedy_under_preemption(period, n, max_tokens, k, num_blocks, budget,
                                                                   noise, shared):
    """Random repetitive-ish models, pools small enough to preempt, budgets that cut
    drafts short, prompts sharing cached prefixes: the tokens never differ from plain
    greedy, blocks all come back."""
    base = periodic_model(period)

    def model(seq):  # every `noise`-th length breaks the pattern, so some drafts are rejected
        return (sum(seq[-3:]) % 50) + 1 if noise and len(seq) % (noise + 2) == 0 else base(seq)

    kw = dict(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=budget, max_num_seqs=4)
    plain, _, _ = run(reqs(n, 6, max_tokens, shared), model, **kw)
    spec, _, _ = run(reqs(n, 6, max_tokens, shared), model, SpeculativeConfig(num_speculative_tokens=k), **kw)
    assert spec == plain


def test_speculative_config_parsing_and_validation():
    cfg = EngineConfig.from_kwargs(speculative_config='{"method": "ngram", "num_speculative_tokens": 2}')
    assert cfg.speculative_config == SpeculativeConfig(num_speculative_tokens=2)
    assert EngineConfig.from_kwargs(speculative_config={"prompt_lookup_max": 3}).speculative_config.prompt_lookup_max == 3
    for bad, msg in [({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                     ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup"),
                     ({"draft_model": "x"}, "unknown"), ("[1]", "JSON object"), ("{bad", "not valid JSON")]:
        with pytest.raises(ValueError, match=msg):
            EngineConfig.from_kwargs(speculative_config=bad)
    with pytest.raises(ValueError, match="continuous"):
        EngineConfig.from_kwargs(speculative_config={}, scheduling="static")


# prompts SmolLM2 continues by repeating them (greedy), so drafts get accepted
REPETITIVE = ["red, green, blue, red, green, blue, red, green, blue, red,",
              "Repeat after me: hello world hello world hello world hello world"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype,backend", [("bfloat16", "auto"), ("float32", "torch")])
def test_real_model_speculative_output_equals_greedy_in_fewer_steps(dtype, backend):
    """On SmolLM2: the same tokens as plain greedy (the C kernels verify drafts through
    the prefill kernel's short-chunk path in bfloat16), in fewer engine steps."""
    from inflight import LLM

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    results = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3}):
        llm = LLM(dtype=dtype, attention_backend=backend, kv_cache_memory=64 * 2**20, speculative_config=spec)
        start = llm.llm_engine.step_count
        outs = llm.generate(REPETITIVE, params, use_tqdm=False)
        results.append(([o.outputs[0].token_ids for o in outs], llm.llm_engine.step_count - start,
                        llm.llm_engine.scheduler.kv.num_free_blocks == llm.llm_engine.scheduler.kv.num_blocks))
        del llm
    (plain, plain_steps, plain_free), (spec, spec_steps, spec_free) = results
    assert spec == plain and all(len(t) == 24 for t in spec)
    assert spec_steps < plain_steps * 0.75, (spec_steps, plain_steps)
    assert plain_free and spec_free


@pytest.mark.slow
def test_server_streams_several_tokens_a_step_and_counts_drafts():
    import httpx
    import openai

    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread
    from test_server import metric

    engine = LLMEngine.from_kwargs(dtype="bfloat16", kv_cache_memory=64 * 2**20,
                                   speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    with ServerThread(engine, "smollm2", log_stats=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="smollm2", prompt=REPETITIVE[0], max_tokens=20, temperature=0)
        whole = client.completions.create(**kw).choices[0].text
        chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        text = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
        assert "".join(text) == whole and chunks[-1].usage.completion_tokens == 20
        assert len(text) < 20  # steps that accepted drafts stream several tokens in one chunk
        page = httpx.get(srv.base_url + "/metrics").text
        drafted = metric(page, "inflight:spec_decode_num_draft_tokens_total")
        accepted = metric(page, "inflight:spec_decode_num_accepted_tokens_total")
        assert 0 < accepted <= drafted and metric(page, "inflight:spec_decode_num_drafts_total") > 0


def test_drafts_take_only_the_budget_a_prefill_leaves():
    """Decodes first, then the prompt, then drafts: guesses never delay a first token."""
    model = periodic_model(2)
    sched = make_scheduler(speculative_config=SpeculativeConfig(num_speculative_tokens=4), max_num_batched_tokens=8)
    sched.add_request(make_request("old", 6, 30))
    while not sched.requests["old"].spec_token_ids:  # prefill, then decode until drafts appear
        so = schedule(sched)
        sched.update_from_output(so, execute(sched, so, model))
    sched.add_request(make_request("new", 20, 5, base=100))
    so = schedule(sched)
    got = {s.request.request_id: (s.num_new_tokens, s.spec_token_ids) for s in so.scheduled}
    assert got == {"old": (1, ()), "new": (7, ())}
    sched.update_from_output(so, execute(sched, so, model))
    for _ in range(2):  # the rest of the prompt (7 + 6), then drafts fill what is left
        so = schedule(sched)
        sched.update_from_output(so, execute(sched, so, model))
    assert so.scheduled[0].request.request_id == "old" and len(so.scheduled[0].spec_token_ids) == 1

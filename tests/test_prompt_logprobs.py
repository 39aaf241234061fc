"""Prompt logprobs (vLLM's prompt_logprobs; completions echo + logprobs, max_tokens=0),
logit_bias and n > 1.

The fast tests drive the scheduler and the fake-engine server; the slow ones compare
the embedded SmolLM2 in float32 with transformers' log-softmax on the same tokens,
through the plain-torch path (LLM API) and the CPU fast path (the server), both
with 16-token prefill chunks.
"""
from __future__ import annotations

import random

import httpx
import openai
import pytest
import torch

from fake_runner import make_request, make_scheduler, worker_batch
from inflight.core.outputs import ModelRunnerOutput
from inflight.sampling_params import SamplingParams
from inflight.worker.prompt_logprobs import prompt_rows
from bad_request_cases import C, CH, chat, cmpl
from test_bad_requests import post, server  # noqa: F401 (the fake-engine server fixture)
from test_server import metric, wait_until_idle

TOL = 1e-3
PROMPTS = ["The capital of France is Paris, and the capital of Germany is Berlin. The capital of Italy is",
           "Hi", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13"]


def _fake_execute(scheduler, sched) -> ModelRunnerOutput:
    """Token 7 for rows that sample; prompt-logprob entries naming the prompt token they score."""
    batch = worker_batch(scheduler, sched)
    out = ModelRunnerOutput({s.req_id: [7] for s in batch if s.samples})
    for s in batch:
        r = prompt_rows(s, 0)
        if r is not None:
            prompt = s.state.prompt_token_ids
            out.prompt_logprobs[s.req_id] = (
                r.start, [[(prompt[r.start + 1 + i], -1.0, 1)] for i in range(r.num_rows)])
    return out


def test_prompt_logprobs_come_once_with_the_first_token_across_chunks():
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=5, enable_chunked_prefill=True)
    req = make_request("a", prompt_len=13, max_tokens=3, base=100)
    req.sampling_params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=0)
    sched.add_request(req)
    sent = []
    while sched.has_unfinished_requests():
        s = sched.schedule()
        sent += [o.prompt_logprobs for o in sched.update_from_output(s, _fake_execute(sched, s))]
    assert sent[0] is not None and all(p is None for p in sent[1:])
    assert [e[0][0] for e in sent[0]] == list(range(101, 113))  # every prompt token but the first, in order


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_every_prompt_token_scored_once_through_preemptions(mode):
    """40 requests with prompt logprobs in 16 blocks of 4 tokens, 8-token chunks: requests are
    preempted mid-prefill and mid-decode, and each still gets every prompt token once, in order."""
    rng = random.Random(3)
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=8, max_num_seqs=16,
                           enable_chunked_prefill=True, preemption_mode=mode, num_host_blocks=16)
    reqs = [make_request(f"r{i}", prompt_len=rng.randint(2, 14), base=100 * i, arrival_time=float(i))
            for i in range(40)]
    for r in reqs:
        r.sampling_params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 10), ignore_eos=True,
                                           prompt_logprobs=0)
        sched.add_request(r)
    sent: dict[str, list] = {}
    for _ in range(3000):
        if not sched.has_unfinished_requests():
            break
        s = sched.schedule()
        for o in sched.update_from_output(s, _fake_execute(sched, s)):
            if o.prompt_logprobs is not None:
                assert o.request_id not in sent
                sent[o.request_id] = [e[0][0] for e in o.prompt_logprobs]
    assert sched.num_preemptions > 0 and not sched.has_unfinished_requests()
    assert sent == {r.request_id: r.prompt_token_ids[1:] for r in reqs}
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def test_recomputed_entries_are_not_added_twice():
    req = make_request("a", prompt_len=6)
    req.add_prompt_logprobs(0, [[(1, -1.0, 1)], [(2, -1.0, 1)]])
    req.add_prompt_logprobs(0, [[(1, -2.0, 1)], [(2, -2.0, 1)], [(3, -2.0, 1)]])  # after a preemption
    req.add_prompt_logprobs(5, [[(9, -1.0, 1)]])  # a gap: never produced by the runner, ignored
    assert [e[0] for e in req.prompt_logprobs] == [(1, -1.0, 1), (2, -1.0, 1), (3, -2.0, 1)]


@pytest.mark.parametrize("prompt_logprobs", [0, 2])
def test_no_prefix_cache_hit_while_prompt_logprobs_are_owed(prompt_logprobs):
    sched = make_scheduler(num_blocks=64, block_size=4)
    sched.add_request(make_request("warm", prompt_len=12, max_tokens=1))
    while sched.has_unfinished_requests():
        s = sched.schedule()
        sched.update_from_output(s, _fake_execute(sched, s))
    owed = make_request("owed", prompt_len=12, max_tokens=1)
    owed.sampling_params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=prompt_logprobs)
    plain = make_request("plain", prompt_len=12, max_tokens=1)
    assert sched.kv.get_computed_blocks(owed).num_tokens == 0
    assert sched.kv.get_computed_blocks(plain).num_tokens == 8


def test_logit_bias_applies_per_row_in_one_batch_and_logprobs_stay_raw():
    from inflight.worker.sampler import Sampler, SamplingMetadata, SamplingRow

    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 4)

    def row(**kw) -> SamplingRow:
        return SamplingRow(SamplingParams(temperature=0.0, **kw), [], [], [])

    rows = [row(), row(logit_bias={3: 100}), row(logit_bias={0: -100, 2: 1.5}, logprobs=1),
            row(logit_bias={0: -0.5})]
    md = SamplingMetadata.from_rows(rows, 4, torch.device("cpu"))
    out = Sampler()(logits, md)
    assert not md.greedy_only and out.sampled_token_ids == [0, 3, 2, 0]
    raw = logits[2].log_softmax(-1)
    assert out.logprobs[2][0] == (2, pytest.approx(raw[2].item()), 3)  # vLLM: logprobs of the raw logits


def test_logit_bias_checks_the_vocabulary_offline():
    from inflight.errors import InvalidRequestError

    SamplingParams(logit_bias={256: -100, 0: 100.0}).verify_vocab(257)
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias={257: 1}).verify_vocab(257)


def test_fake_server_accepts_logit_bias_and_echo_without_generation(server):  # noqa: F811
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        for path, body in ((C, cmpl(logit_bias={"5": 100, "6": -100})), (CH, chat(logit_bias={"256": -3.5}))):
            assert post(h, path, body).status_code == 200, body
        r = post(h, C, cmpl(prompt="Hello", echo=True, max_tokens=0)).json()
        assert r["choices"][0]["text"] == "Hello" and r["usage"]["completion_tokens"] == 0
    wait_until_idle(server)
    assert metric(httpx.get(server.base_url + "/metrics").text, "inflight:kv_cache_usage_perc") == 0.0


# ----------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def hf_logprobs():
    from hf_reference import load_hf_reference

    model = load_hf_reference()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return logprobs


def _check_entries(ids: list[int], entries: list, ref: torch.Tensor, top_n: int) -> float:
    """Assert entries (None, then {token: (logprob, rank)}) match ``ref``; returns the largest difference."""
    assert entries[0] is None and len(entries) == len(ids)
    worst = 0.0
    for q in range(1, len(ids)):
        e = entries[q]
        worst = max(worst, abs(e[ids[q]][0] - ref[q - 1, ids[q]].item()))
        top = ref[q - 1].topk(top_n)
        for rank, (v, t) in enumerate(zip(top.values.tolist(), top.indices.tolist()), 1):
            near = int(((ref[q - 1] - v).abs() < TOL).sum())  # near-ties may swap ranks, nothing else
            assert abs(e[t][1] - rank) < near, (q, t, e)
            worst = max(worst, abs(e[t][0] - v))
    assert worst < TOL
    return worst


@pytest.mark.slow
def test_llm_api_prompt_logprobs_on_the_torch_path(hf_logprobs):
    from inflight import LLM

    llm = LLM(dtype="float32", attention_backend="torch", kv_cache_memory=32 * 2**20, max_model_len=256,
              max_num_batched_tokens=16)
    sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    outs = llm.generate(PROMPTS[:2], sp, use_tqdm=False)
    for o in outs:
        entries = [None if d is None else {t: (lp.logprob, lp.rank) for t, lp in d.items()}
                   for d in o.prompt_logprobs]
        _check_entries(o.prompt_token_ids, entries, hf_logprobs(o.prompt_token_ids), 2)
    # the prompt is in the prefix cache now: asking again recomputes it, the same values
    again = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0,
                                                    n=2), use_tqdm=False)[0]
    assert len(again.outputs) == 2 and len(again.prompt_logprobs) == len(outs[0].prompt_logprobs)
    for a, b in zip(again.prompt_logprobs[1:], outs[0].prompt_logprobs[1:]):
        ((tok, lp),) = a.items()
        assert abs(lp.logprob - b[tok].logprob) < 1e-5


@pytest.fixture(scope="module")
def real_server():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=64 * 2**20, max_num_seqs=16,
                                   max_num_batched_tokens=16)
    with ServerThread(engine, "m", log_stats=False) as srv:
        srv.tokenizer = engine.tokenizer
        yield srv


@pytest.fixture
def client(real_server):
    return openai.OpenAI(base_url=real_server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.mark.slow
def test_echo_logprobs_match_transformers_on_the_fast_path(real_server, client, hf_logprobs):
    tok = real_server.tokenizer
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        r = client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=1)
        c = r.choices[0]
        assert c.text == tok.decode(ids) and r.usage.completion_tokens == 0
        assert len(c.logprobs.token_logprobs) == len(ids) and c.logprobs.top_logprobs[0] is None
        ref = hf_logprobs(ids)
        for q in range(1, len(ids)):
            assert abs(c.logprobs.token_logprobs[q] - ref[q - 1, ids[q]].item()) < TOL
            assert abs(max(c.logprobs.top_logprobs[q].values()) - ref[q - 1].max().item()) < TOL
        chunks = list(client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=1,
                                                stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == c.text
        assert sum((ch.choices[0].logprobs.token_logprobs for ch in chunks), []) == c.logprobs.token_logprobs
        # vLLM's prompt_logprobs field, with max_tokens > 0: prompt then generated tokens
        body = {"prompt": ids, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3, "echo": True, "logprobs": 0}
        r = httpx.post(real_server.base_url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        entries = [None if d is None else {int(t): (v["logprob"], v["rank"]) for t, v in d.items()}
                   for d in r["prompt_logprobs"]]
        _check_entries(ids, entries, ref, 3)
        assert len(r["logprobs"]["token_logprobs"]) == len(ids) + 2


@pytest.mark.slow
def test_chat_prompt_logprobs_logit_bias_and_n(real_server, client):
    user = [{"role": "user", "content": "Name a fruit."}]
    body = {"messages": user, "max_tokens": 2, "prompt_logprobs": 0}
    r = httpx.post(real_server.base_url + "/v1/chat/completions", json=body, timeout=60).json()
    assert len(r["prompt_logprobs"]) == r["usage"]["prompt_tokens"] and r["prompt_logprobs"][0] is None
    tok = real_server.tokenizer

    def first_token(**kw) -> int:
        text = client.chat.completions.create(model="m", messages=user, max_tokens=3, temperature=0,
                                              **kw).choices[0].message.content
        return tok(text, add_special_tokens=False).input_ids[0]

    greedy = first_token()
    assert first_token(logit_bias={str(greedy): -100}) != greedy
    forced = tok(" kiwi", add_special_tokens=False).input_ids[0]
    r = client.completions.create(model="m", prompt="I like", max_tokens=2, temperature=0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == tok.decode([forced] * 2)
    # n samples, streamed and not: the same texts under the same seed
    kw = dict(model="m", messages=user, max_tokens=5, temperature=1.0, seed=5, n=2)
    whole = client.chat.completions.create(**kw)
    texts = {0: "", 1: ""}
    for ch in client.chat.completions.create(**kw, stream=True):
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert [c.message.content for c in whole.choices] == [texts[0], texts[1]]
    kw = dict(model="m", prompt=["A", "B"], max_tokens=4, temperature=1.0, seed=3, n=2)
    whole = client.completions.create(**kw)
    streamed = {i: "" for i in range(4)}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            streamed[c.index] += c.text
    assert sorted(c.index for c in whole.choices) == [0, 1, 2, 3]
    assert [c.text for c in sorted(whole.choices, key=lambda c: c.index)] == [streamed[i] for i in range(4)]
    wait_until_idle(real_server)
    assert metric(httpx.get(real_server.base_url + "/metrics").text, "inflight:kv_cache_usage_perc") == 0.0

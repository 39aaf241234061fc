"""Beam search (vLLM's ``LLM.beam_search`` and ``use_beam_search``).

The search itself runs on a toy language model (no engine): with a beam wide enough
to keep every sequence it must find exactly the brute-force ranking, and ending once
settled must give what running every round gives. The slow tests run the embedded
SmolLM2 in float32 against transformers' own beam search, offline and served.
"""
from __future__ import annotations

import asyncio
import itertools
import math
import random

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.beam_search import BeamSearch
from inflight.outputs import CompletionOutput, Logprob, RequestOutput
from inflight.sampling_params import BeamSearchParams

EOS, VOCAB, PROMPT = 0, 4, [7, 8, 9]


def toy_logprobs(context: tuple[int, ...], seed: int) -> dict[int, float]:
    """A fixed next-token distribution over VOCAB tokens for every context."""
    rng = random.Random(hash((seed, context)))
    weights = [rng.random() ** 3 + 1e-3 for _ in range(VOCAB)]
    total = sum(weights)
    return {t: math.log(w / total) for t, w in enumerate(weights)}


def engine_outputs(search: BeamSearch, seed: int) -> list[RequestOutput]:
    """What the engine answers one round: each beam's top ``num_logprobs`` logprobs."""
    outs = []
    for beam in search.beams:
        lps = sorted(toy_logprobs(tuple(beam.tokens), seed).items(), key=lambda kv: -kv[1])[:search.num_logprobs]
        entry = {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(lps, 1)}
        outs.append(RequestOutput("r", None, beam.tokens, [CompletionOutput(0, "", [lps[0][0]], logprobs=[entry])],
                                  True))
    return outs


def search_toy(params: BeamSearchParams, seed: int, every_round: bool = False) -> BeamSearch:
    search = BeamSearch(PROMPT, params, [EOS])

    def more() -> bool:
        return bool(search.beams) and search.rounds < params.max_tokens if every_round else not search.done

    while more():
        search.advance(engine_outputs(search, seed))
    return search


def brute_force(params: BeamSearchParams, seed: int) -> list[tuple[list[int], float]]:
    """Every sequence the toy model can finish (at EOS or max_tokens), best first."""
    done = []
    for n in range(1, params.max_tokens + 1):
        for gen in itertools.product(range(VOCAB), repeat=n):
            if EOS in gen[:-1] or (n < params.max_tokens and gen[-1] != EOS):
                continue
            tokens = PROMPT + list(gen)
            cum = sum(toy_logprobs(tuple(tokens[:i]), seed)[tokens[i]] for i in range(len(PROMPT), len(tokens)))
            length = len(tokens) - (gen[-1] == EOS)  # the prompt counts, a final EOS does not
            done.append((tokens, cum, cum / length ** params.length_penalty))
    return [(t, c) for t, c, _ in sorted(done, key=lambda d: -d[2])]


@pytest.mark.parametrize("length_penalty", [-1.0, 0.0, 1.0, 3.0])
def test_a_beam_that_keeps_every_sequence_finds_the_brute_force_ranking(length_penalty):
    """Width 16 keeps all 3 x 3 non-EOS sequences of two tokens and sees all 4 tokens a
    round: the answer is the 16 best finished sequences, EOS not counted in the length."""
    params = BeamSearchParams(beam_width=16, max_tokens=3, length_penalty=length_penalty)
    for seed in range(5):
        best = search_toy(params, seed).best()
        expected = brute_force(params, seed)[:16]
        assert [s.tokens for s in best] == [t for t, _ in expected]
        assert [s.cum_logprob for s in best] == pytest.approx([c for _, c in expected])
        assert {s.finish_reason for s in best if s.tokens[-1] == EOS} <= {"stop"}
        assert all(s.finish_reason == "length" for s in best if s.tokens[-1] != EOS)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), width=st.integers(1, 3), max_tokens=st.integers(1, 7),
       length_penalty=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]))
def test_ending_once_settled_answers_what_every_round_answers(seed, width, max_tokens, length_penalty):
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty)
    settled, full = search_toy(params, seed), search_toy(params, seed, every_round=True)
    assert settled.rounds <= full.rounds
    assert [(s.tokens, s.cum_logprob) for s in settled.best()] == [(s.tokens, s.cum_logprob) for s in full.best()]


@pytest.mark.parametrize("length_penalty", [-2000.0, 2000.0])
def test_extreme_length_penalties_run_to_an_answer(length_penalty):
    # length ** 2000 overflows a double and length ** -2000 rounds to 0: the search used to
    # raise (a 500 served); the scores take their limits, the best live beams still rank
    params = BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=length_penalty)
    for seed in range(3):
        best = search_toy(params, seed).best()
        assert len(best) == 2 and all(s.finish_reason in ("stop", "length") for s in best)


def test_settling_ends_the_search_early_when_eos_is_likely():
    """A model that all but always ends at once: two rounds finish more beams than any
    continuation can beat (length_penalty 0: a continuation only loses logprob)."""
    params = BeamSearchParams(beam_width=2, max_tokens=50, length_penalty=0.0)
    search = BeamSearch(PROMPT, params, [EOS])
    while not search.done:
        outs = engine_outputs(search, 0)
        for out in outs:
            entry = out.outputs[0].logprobs[0]
            entry[EOS] = Logprob(-1e-3, 1)  # EOS first, far ahead of the rest
            for t in entry:
                entry[t] = entry[t] if t == EOS else Logprob(entry[t].logprob - 20.0, 2)
        search.advance(outs)
    assert search.rounds == 2
    assert [s.tokens[-1] for s in search.best()] == [EOS, EOS]


def test_eos_shown_only_with_include_stop_str_in_output():
    for include in (False, True):
        params = BeamSearchParams(beam_width=16, max_tokens=2, include_stop_str_in_output=include)
        search = search_toy(params, 1)
        stopped = next(s for s in search.best() if s.finish_reason == "stop")
        tokens, logprobs = search.generated(stopped)
        assert (tokens[-1:] == [EOS]) == include and len(tokens) == len(logprobs)
        assert tokens == stopped.tokens[len(PROMPT):len(stopped.tokens) - (0 if include else 1)]


def test_ignore_eos_extends_through_eos():
    params = BeamSearchParams(beam_width=16, max_tokens=2, ignore_eos=True)
    best = search_toy(params, 2).best()
    assert all(len(s.tokens) == len(PROMPT) + 2 and s.finish_reason == "length" for s in best)
    assert any(EOS in s.tokens[len(PROMPT):] for s in best)


# ------------------------------------------------------------------ the real model

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def hf_beams(prompt_ids: list[int], width: int, max_tokens: int) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search, EOS switched off (every beam runs max_tokens), each
    sequence's summed logprob (length_penalty 0)."""
    import torch

    from hf_reference import load_hf_reference

    g = load_hf_reference().generate(
        torch.tensor([prompt_ids]), num_beams=width, num_return_sequences=width, do_sample=False,
        max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0, length_penalty=0.0, early_stopping=False,
        output_scores=True, return_dict_in_generate=True, temperature=None, top_p=None, top_k=None)
    return g.sequences.tolist(), g.sequences_scores.tolist()


@pytest.fixture(scope="module")
def llm():
    from inflight import LLM

    return LLM(dtype="float32", kv_cache_memory=64 * 2**20)


@pytest.mark.slow
def test_llm_beam_search_equals_transformers(llm):
    outs = llm.beam_search([{"prompt": p} for p in PROMPTS], BeamSearchParams(beam_width=3, max_tokens=8,
                                                                              ignore_eos=True))
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs):
        seqs, scores = hf_beams(tok(prompt).input_ids, 3, 8)
        assert [s.tokens for s in out.sequences] == seqs
        assert [s.cum_logprob for s in out.sequences] == pytest.approx(scores, abs=2e-3)
        assert all(s.text == tok.decode(s.tokens, skip_special_tokens=True) for s in out.sequences)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.slow
def test_llm_beam_search_refuses_what_it_cannot_run(llm):
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=11, max_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=llm.llm_engine.max_model_len))


MODEL = "smollm2"


@pytest.fixture(scope="module")
def server():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=64 * 2**20, max_num_seqs=16)
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.slow
def test_served_beam_search_equals_transformers(server, client):
    """Two prompts of width 3: six choices, each prompt's beams best first, as transformers'."""
    body = {"model": MODEL, "prompt": PROMPTS, "max_tokens": 8, "n": 3, "logprobs": 2, "use_beam_search": True,
            "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120).json()
    tok = server.engine.tokenizer
    assert [c["index"] for c in r["choices"]] == list(range(6))
    for i, prompt in enumerate(PROMPTS):
        seqs, scores = hf_beams(tok(prompt).input_ids, 3, 8)
        choices = r["choices"][3 * i:3 * i + 3]
        assert [c["prompt_token_ids"] + c["token_ids"] for c in choices] == seqs
        assert [c["text"] for c in choices] == [tok.decode(c["token_ids"], skip_special_tokens=True) for c in choices]
        sums = [sum(c["logprobs"]["token_logprobs"]) for c in choices]
        assert sums == pytest.approx(scores, abs=2e-3)
        # the token and the top 2 asked for, not the 6 the search read
        assert all(len(top) <= 3 for c in choices for top in c["logprobs"]["top_logprobs"])
        assert all(c["finish_reason"] == "length" for c in choices)
    assert r["usage"]["completion_tokens"] == 6 * 8


@pytest.mark.slow
def test_served_chat_beam_search_ends_at_eos(server, client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}],
                                       max_tokens=24, n=2, extra_body={"use_beam_search": True})
    assert len(r.choices) == 2 and all(c.finish_reason == "stop" for c in r.choices)
    assert all("4" in c.message.content for c in r.choices)


@pytest.mark.slow
@pytest.mark.parametrize("body,param", [({"stream": True}, "stream"), ({"top_p": 0.5}, "top_p"),
                                        ({"stop": ["x"]}, "stop"), ({"n": 11}, "n"),
                                        ({"response_format": {"type": "json_object"}}, "response_format"),
                                        ({"max_tokens": 10**6}, "max_tokens")])
def test_served_beam_search_refuses_what_it_cannot_honour(server, body, param):
    request = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "n": 2, "use_beam_search": True, **body}
    r = httpx.post(server.base_url + "/v1/completions", json=request, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.slow
def test_a_client_that_leaves_mid_search_frees_every_block(server):
    from test_server import metric, wait_until_idle

    async def leave():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as h:
            body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "n": 4, "ignore_eos": True,
                    "use_beam_search": True}
            with pytest.raises(httpx.ReadTimeout):
                await h.post("/v1/completions", json=body, timeout=1.5)

    asyncio.run(leave())
    wait_until_idle(server, timeout=5.0)
    text = httpx.get(server.base_url + "/metrics").text
    assert metric(text, "inflight:kv_cache_usage_perc") == 0.0

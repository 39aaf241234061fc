"""vLLM's request fields beyond OpenAI's, on the real embedded SmolLM2-135M through the
openai client: a chat answer continued from a prefilled start (continue_final_message,
echo), truncate_prompt_tokens, allowed_token_ids, bad_words, token ids, continuous usage,
max_logprobs and structural tags."""
from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from test_server import wait_until_idle

pytestmark = pytest.mark.slow

MODEL = "smollm2"
USER = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def server():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=32 * 2**20, max_num_seqs=8, max_model_len=512)
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.tokenizer = engine.tokenizer
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_continues_a_prefilled_answer_and_echoes_it(server, client):
    start = "The answer is"
    msgs = USER + [{"role": "assistant", "content": start}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    cont = {"continue_final_message": True, "add_generation_prompt": False}
    r = client.chat.completions.create(**kw, extra_body=cont)
    with httpx.Client(base_url=server.base_url) as h:
        ids = h.post("/tokenize", json={"messages": msgs, **cont}).json()["tokens"]
        text = h.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n" + start)  # the turn stays open
    assert r.usage.prompt_tokens == len(ids)
    # the same tokens through the completions endpoint give the same greedy continuation
    ref = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0).choices[0].text
    assert r.choices[0].message.content == ref
    echoed = client.chat.completions.create(**kw, extra_body={**cont, "echo": True})
    assert echoed.choices[0].message.content == start + ref
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={**cont, "echo": True}))
    assert chunks[1].choices[0].delta.content == start
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == start + ref
    # echo after a generation prompt: the answer's role (assistant) is not the last message's (user)
    plain = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, temperature=0,
                                           extra_body={"echo": True})
    assert again.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(**kw, extra_body={"continue_final_message": True})


def test_truncate_prompt_tokens_keeps_the_last_tokens(server, client):
    tok = server.tokenizer
    prompt = "one two three four five six seven eight"
    ids = tok(prompt).input_ids
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                  extra_body={"truncate_prompt_tokens": 3})
    ref = client.completions.create(model=MODEL, prompt=ids[-3:], max_tokens=3, temperature=0)
    assert r.usage.prompt_tokens == 3 and r.choices[0].text == tok.decode(ids[-3:]) + ref.choices[0].text
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                      extra_body={"truncate_prompt_tokens": 3, "truncation_side": "right"})
    ref = client.completions.create(model=MODEL, prompt=ids[:3], max_tokens=3, temperature=0)
    assert first.usage.prompt_tokens == 3 and first.choices[0].text == tok.decode(ids[:3]) + ref.choices[0].text
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                      extra_body={"truncate_prompt_tokens": len(ids) + 5})
    assert whole.usage.prompt_tokens == len(ids)  # shorter than the limit: untouched
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=0,
                                          extra_body={"truncate_prompt_tokens": 4})
    assert chat.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError, match="max_model_len"):  # -1 keeps max_model_len: no room left
        client.completions.create(model=MODEL, prompt="hi " * 600, max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": -1})
    wait_until_idle(server)


def test_allowed_token_ids_are_the_only_tokens_sampled(server, client):
    tok = server.tokenizer
    allowed = sorted({tok(w, add_special_tokens=False).input_ids[0] for w in (" yes", " no", " maybe")})
    for temperature in (0.0, 1.0):
        r = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=6,
                                      temperature=temperature, seed=1, logprobs=0,
                                      extra_body={"allowed_token_ids": allowed})
        tokens = r.choices[0].logprobs.tokens
        assert len(tokens) == 6 and set(tokens) <= {tok.decode([t]) for t in allowed}, (temperature, tokens)
    wait_until_idle(server)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_continuous_usage_stats_count_every_chunk(client, endpoint):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint == "chat":
        chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0,
                                                     stream=True, stream_options=opts, extra_body={"ignore_eos": True}))
    else:
        chunks = list(client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0,
                                                stream=True, stream_options=opts, extra_body={"ignore_eos": True}))
    final = chunks[-1].usage
    assert not chunks[-1].choices and final.completion_tokens == 6
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert all(c.usage.prompt_tokens == final.prompt_tokens for c in chunks[:-1])
    assert counts == sorted(counts) and counts[-1] == 6 and len(counts) >= 6
    plain = list(client.completions.create(model=MODEL, prompt="The sky is", max_tokens=2, stream=True,
                                           stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 2


def test_return_token_ids_streamed_and_not(server, client):
    tok = server.tokenizer
    prompt = "The sky is"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, extra_body={"return_token_ids": True})
    r = client.completions.create(**kw).choices[0]
    assert r.prompt_token_ids == tok(prompt).input_ids and tok.decode(r.token_ids) == r.text and len(r.token_ids) == 5
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True)]
    assert chunks[0].prompt_token_ids == r.prompt_token_ids
    assert all("prompt_token_ids" not in c.model_extra for c in chunks[1:])
    assert [t for c in chunks for t in c.token_ids] == r.token_ids
    ckw = dict(model=MODEL, messages=USER, max_tokens=5, temperature=0, extra_body={"return_token_ids": True})
    whole = client.chat.completions.create(**ckw)
    with httpx.Client(base_url=server.base_url) as h:
        assert whole.prompt_token_ids == h.post("/tokenize", json={"messages": USER}).json()["tokens"]
    ids = whole.choices[0].token_ids
    assert ids and tok.decode(ids, skip_special_tokens=True) == whole.choices[0].message.content
    streamed = list(client.chat.completions.create(**ckw, stream=True))
    assert streamed[0].prompt_token_ids == whole.prompt_token_ids
    assert [t for c in streamed for t in c.choices[0].model_extra.get("token_ids", [])] == ids
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).choices[0]
    assert "token_ids" not in plain.model_extra and "prompt_token_ids" not in plain.model_extra  # opt-in fields


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(client):
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=3, temperature=0, logprobs=2,
                                  extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
    c = r.choices[0]
    assert c.logprobs.tokens == [f"token_id:{t}" for t in c.token_ids]
    assert all(k.startswith("token_id:") for top in c.logprobs.top_logprobs for k in top)
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, temperature=0, logprobs=True,
                                          top_logprobs=2, extra_body={"return_tokens_as_token_ids": True,
                                                                      "return_token_ids": True})
    content = chat.choices[0].logprobs.content
    assert [e.token for e in content] == [f"token_id:{t}" for t in chat.choices[0].token_ids]
    assert all(t.token.startswith("token_id:") for e in content for t in e.top_logprobs)


def test_bad_words_are_never_generated(server, client):
    from inflight.sampling_params import bad_words_token_ids

    tok = server.tokenizer
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
              extra_body={"return_token_ids": True})
    greedy = client.completions.create(**kw).choices[0]
    word = greedy.text.split()[0].strip(".,")  # the answer's first word, " Paris" in one or more tokens
    banned = bad_words_token_ids(tok, [word])
    r = client.completions.create(**{**kw, "extra_body": {"return_token_ids": True, "bad_words": [word]}})
    ids = r.choices[0].token_ids
    assert ids != greedy.token_ids
    for seq in banned:
        assert not any(ids[i:i + len(seq)] == seq for i in range(len(ids))), (word, seq, ids)
    ckw = dict(model=MODEL, messages=USER, max_tokens=14, temperature=0)
    assert "4" in client.chat.completions.create(**ckw).choices[0].message.content
    chat = client.chat.completions.create(**ckw, extra_body={"return_token_ids": True, "bad_words": ["4", "four"]})
    out = chat.choices[0].token_ids
    for seq in bad_words_token_ids(tok, ["4", "four"]):
        assert not any(out[i:i + len(seq)] == seq for i in range(len(out))), (seq, out)
    wait_until_idle(server)


def test_max_logprobs_caps_top_logprobs_offline_and_served(server, client):
    from inflight import LLM, SamplingParams
    from inflight.entrypoints.openai.server_thread import ServerThread
    from inflight.errors import InvalidRequestError

    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):  # the default: 20, as vLLM
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, logprobs=21)
    llm = LLM(dtype="float32", kv_cache_memory=16 * 2**20, max_model_len=256, max_logprobs=30)
    out = llm.generate("The sky is", SamplingParams(temperature=0, max_tokens=2, logprobs=25), use_tqdm=False)
    assert all(len(entry) >= 25 for entry in out[0].outputs[0].logprobs)
    with pytest.raises(InvalidRequestError, match="max_logprobs"):
        llm.generate("The sky is", SamplingParams(max_tokens=1, logprobs=31), use_tqdm=False)
    with ServerThread(llm.llm_engine, MODEL, log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "logprobs": 25}).json()
        assert len(r["choices"][0]["logprobs"]["top_logprobs"][0]) >= 20  # distinct texts of the 25 best
        chat = h.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, "logprobs": True,
                                                     "top_logprobs": 30}).json()
        assert len(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 30
        err = h.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, "logprobs": True,
                                                    "top_logprobs": 31}).json()["error"]
        assert err["param"] == "top_logprobs" and "30" in err["message"]


def test_structural_tags_constrain_the_tagged_part_only(client):
    """Free text until the trigger; then the tag's begin, content by its schema, its end."""
    plain = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert plain.choices[0].text.startswith(" Paris.")
    tag = {"type": "structural_tag", "structures": [{"begin": " Paris", "schema": {"type": "integer"}, "end": "."}],
           "triggers": [" Par"]}
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
                                  extra_body={"response_format": tag})
    assert re.match(r" Paris-?[0-9]+\.", r.choices[0].text), r.choices[0].text
    so = {"structural_tag": json.dumps({k: v for k, v in tag.items() if k != "type"})}
    again = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
                                      extra_body={"structured_outputs": so})
    assert again.choices[0].text == r.choices[0].text
    with pytest.raises(openai.BadRequestError, match="structural tag"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                  extra_body={"structured_outputs": {"structural_tag": '{"format": 5}'}})

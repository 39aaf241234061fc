"""The OpenAI-compatible server over the fake engine (fast): protocol, streaming,
side endpoints, metrics, errors. Cancellation, idle CPU and crashes are in
test_server_cancel.py; the real model in test_server_real.py."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from inflight.entrypoints.openai.server_thread import ServerThread
from test_async_engine import SCRIPT, assert_blocks_all_free, make_fake_engine

MODEL = "fake-model"


@pytest.fixture(scope="module")
def server():
    engine = make_fake_engine(num_blocks=1024, block_size=4, max_model_len=128, max_num_seqs=64,
                              max_num_batched_tokens=256)
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture(autouse=True)
def _reset(server):
    server.engine.runner.step_delay = 0.0
    yield
    server.state.api_key = None
    server.state.max_waiting_requests = None


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def wait_until_idle(server, timeout: float = 5.0) -> None:
    """Every request gone and every KV block back in the pool, checked on the step thread."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.state.engine.call_sync(assert_blocks_all_free, timeout=5)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def wait_until_in_engine(server, n: int, timeout: float = 5.0) -> None:
    """Until ``n`` requests are in the engine (a fixed sleep races a slow client thread)."""
    deadline = time.monotonic() + timeout
    while server.state.engine.num_unfinished < n:
        assert time.monotonic() < deadline, f"{server.state.engine.num_unfinished} of {n} requests in the engine"
        time.sleep(0.01)


def metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head = line.split("{")[0].split(" ")[0]
            if head == name:
                total += float(line.rsplit(" ", 1)[1])
    return total


# ----------------------------------------------------------------- happy paths
def test_completion(client):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0)
    assert r.choices[0].text == SCRIPT[:5] and r.choices[0].finish_reason == "length"
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-") and r.created > 0
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (2, 5, 7)


def test_completion_stream_with_usage(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == SCRIPT[:6]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == SCRIPT[:4]
    assert r.usage.prompt_tokens == len("<user>Hi\n<assistant>") and r.object == "chat.completion"


def test_chat_stream_role_first(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_completion_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SCRIPT[:5]
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 5


def test_n_and_prompt_batches(client):
    r = client.completions.create(model=MODEL, prompt=["Hi", "Yo there"], n=2, max_tokens=3, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    # The engine seeds sample j with seed + j; the fake runner offsets its script by the seed.
    assert {c.index: c.text for c in r.choices} == {i * 2 + j: SCRIPT[1 + j:4 + j] for i in range(2) for j in range(2)}
    assert r.usage.prompt_tokens == 2 + 8 and r.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                                 n=2, max_tokens=3, stream=True))
    for i in range(2):
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) == SCRIPT[:3]


def test_token_id_prompts_and_echo(client):
    r = client.completions.create(model=MODEL, prompt=[72, 105], max_tokens=2, echo=True)
    assert r.choices[0].text == "Hi" + SCRIPT[:2]
    r = client.completions.create(model=MODEL, prompt=[[72], [105]], max_tokens=2)
    assert [c.text for c in r.choices] == [SCRIPT[:2]] * 2
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "Hi" + SCRIPT[:2]


def test_stop_strings(client):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=20, stop=["wor"])
    assert r.choices[0].text == "hello " and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                                 max_tokens=20, stop="wor", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == list(SCRIPT[:3]) and lp.token_logprobs == [-0.5] * 3 and lp.text_offset == [0, 1, 2]
    assert lp.top_logprobs[0] == {"h": -0.5, "x": -2.0, "y": -3.0}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}], max_tokens=2,
                                       logprobs=True, top_logprobs=1)
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == ["h", "e"] and [t.token for t in content[0].top_logprobs] == ["h"]
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                                 max_tokens=3, logprobs=True, stream=True))
    assert [t.token for c in chunks[1:] for t in c.choices[0].logprobs.content] == list(SCRIPT[:3])


def test_cached_tokens_when_a_prefix_repeats(client):
    prompt = "A shared prefix that spans several KV blocks. "
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 40


def test_side_endpoints(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with httpx.Client(base_url=server.base_url) as h:
        assert h.get("/health").status_code == 200
        assert h.get("/ping").status_code == 200 and h.post("/ping").status_code == 200  # vLLM's alias
        assert h.get("/load").json() == {"server_load": 0}  # idle
        assert h.get("/version").json()["version"]
        tok = h.post("/tokenize", json={"prompt": "Hi"}).json()
        assert tok["tokens"] == [72, 105] and tok["count"] == 2 and tok["max_model_len"] == 128
        chat = h.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
        assert chat["count"] == len("<user>Hi\n<assistant>")
        assert h.post("/detokenize", json={"tokens": [72, 105]}).json() == {"prompt": "Hi"}
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
        text = h.get("/metrics").text
    for name in ("inflight:num_requests_running", "inflight:num_requests_waiting", "inflight:kv_cache_usage_perc",
                 "inflight:prefix_cache_queries_total", "inflight:prefix_cache_hits_total",
                 "inflight:num_preemptions_total", "inflight:time_to_first_token_seconds_bucket",
                 "inflight:inter_token_latency_seconds_bucket", "inflight:time_per_output_token_seconds_bucket",
                 "inflight:e2e_request_latency_seconds_count", "inflight:request_queue_time_seconds_count",
                 "inflight:iteration_tokens_total_bucket"):
        assert name in text, name
    assert metric(text, "inflight:generation_tokens_total") >= 3
    assert metric(text, "inflight:prompt_tokens_total") >= 2
    assert metric(text, "inflight:request_success_total", finished_reason="length") >= 1
    assert metric(text, "inflight:kv_cache_usage_perc") == 0.0


# ---------------------------------------------------------------------- errors
C, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]
BAD_REQUESTS = [
    (C, b'{"model": ', 400),  # malformed JSON
    (C, [1, 2], 400),  # not an object
    (C, {"max_tokens": 3}, 400),  # no prompt
    (C, {"prompt": 123}, 400),
    (C, {"prompt": ""}, 400),
    (C, {"prompt": []}, 400),
    (C, {"prompt": [[]]}, 400),
    (C, {"prompt": "Hi", "temperature": -1}, 400),
    (C, {"prompt": "Hi", "temperature": "hot"}, 400),
    (C, {"prompt": "Hi", "top_p": 0}, 400),
    (C, {"prompt": "Hi", "top_p": 1.5}, 400),
    (C, {"prompt": "Hi", "min_p": 2}, 400),
    (C, {"prompt": "Hi", "max_tokens": 0}, 400),
    (C, {"prompt": "Hi", "max_tokens": -5}, 400),
    (C, {"prompt": "Hi", "max_tokens": 1000}, 400),  # cannot fit max_model_len
    (C, {"prompt": "x" * 200}, 400),  # prompt over max_model_len
    (C, {"prompt": [999999]}, 400),  # token id outside the vocabulary
    (C, {"prompt": "Hi", "n": 0}, 400),
    (C, {"prompt": "Hi", "n": 1.5}, 400),
    (C, {"prompt": "Hi", "stream_options": {"include_usage": True}}, 400),  # without stream
    (C, {"prompt": "Hi", "logprobs": 50}, 400),
    (C, {"prompt": "Hi", "presence_penalty": 5}, 400),
    (C, {"prompt": "Hi", "repetition_penalty": 0}, 400),
    (C, {"prompt": "Hi", "min_tokens": 9, "max_tokens": 3}, 400),
    (C, {"prompt": "Hi", "stop": [1, 2]}, 400),
    (C, {"prompt": "Hi", "model": "gpt-17"}, 404),
    (CHAT, {"messages": []}, 400),
    (CHAT, {"model": MODEL}, 400),
    (CHAT, {"messages": [{"content": "Hi"}]}, 400),  # no role
    (CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]}, 400),  # the template rejects it
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400),  # without logprobs
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    (CHAT, {"messages": USER, "temperature": -0.5, "stream": True}, 400),
    ("/tokenize", {}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
    ("/v1/nope", {}, 404),
]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client):
    with httpx.Client(base_url=server.base_url) as h:
        for path, body, status in BAD_REQUESTS:
            kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
                else {"json": body}
            r = h.post(path, **kw)
            assert r.status_code == status, (path, body, r.status_code, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], (body, err)
            assert "Traceback" not in err["message"]
        assert h.get("/health").status_code == 200
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="Hi", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=USER)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text == SCRIPT[:2]
    wait_until_idle(server)


def test_api_key(server, client):
    server.state.api_key = "sekrit"
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sekrit", max_retries=0)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices[0].text == "h"
    with httpx.Client(base_url=server.base_url) as h:
        assert h.post(C, json={"prompt": "Hi"}).status_code == 401
        assert h.get("/health").status_code == 200 and h.get("/metrics").status_code == 200


def test_overload_answers_503_with_retry_after(server):
    server.state.max_waiting_requests = 0
    with httpx.Client(base_url=server.base_url) as h:
        r = h.post(C, json={"prompt": "Hi"})
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "server_overloaded"

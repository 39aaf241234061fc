"""The server on the real embedded SmolLM2-135M, driven by the official openai client.

One engine per module (float32, 64 MiB KV pool); short prompts, few tokens.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from inflight.sampling_params import SamplingParams
from test_async_engine import idle_wakeup_cpu_seconds, thread_cpu_seconds
from test_server import metric, wait_until_idle

pytestmark = pytest.mark.slow

MODEL = "smollm2"
PROMPT = "The capital of France is"
USER = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def server():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=64 * 2**20, max_num_seqs=16)
    # The reference: greedy output of the engine itself, before the server owns it.
    engine.add_request("ref", PROMPT, SamplingParams(temperature=0, max_tokens=8))
    ref = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            ref = out
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.engine, srv.reference = engine, ref.outputs[0]
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_greedy_completion_equals_the_engine(server, client):
    ref = server.reference
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == ref.text
    assert r.usage.completion_tokens == len(ref.token_ids) and r.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_chat_stream_and_not(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 10
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_n_seeds_stop_logprobs_echo(server, client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=1.0, seed=7, n=2)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert len(a.choices) == 2 and [c.text for c in a.choices] == [c.text for c in b.choices]
    ref = server.reference.text
    stop = ref.strip().split()[1]  # the second word of the greedy answer
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == ref[:ref.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True)
    assert r.choices[0].text.startswith(PROMPT)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[-3:] and all(x <= 0 for x in lp.token_logprobs[-3:])
    assert len(lp.tokens) == r.usage.prompt_tokens + 3 and len(lp.top_logprobs[-1]) >= 2
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, logprobs=True, top_logprobs=2)
    assert all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content)


def test_cached_tokens_when_a_prefix_repeats(client):
    prompt = "Here is a long shared system prompt that several requests repeat word for word. " * 3
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert r.usage.prompt_tokens_details.cached_tokens >= 32


def test_bad_input_is_400_and_the_server_keeps_serving(server, client):
    bad = [dict(prompt=PROMPT, temperature=-1), dict(prompt=PROMPT, max_tokens=100_000),
           dict(prompt="hello " * 1000, max_tokens=600)]  # cannot fit the 91-block KV pool
    for kw in bad:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, **kw)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with httpx.Client(base_url=server.base_url) as h:
        assert h.get("/health").status_code == 200
        ids = h.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
        assert h.post("/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPT
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text \
        == server.reference.text
    wait_until_idle(server)


def test_constraints_that_leave_no_token_are_400s_streamed_or_not(server, client):
    # each passes validation and fails at its first sampling step: allowed ids the grammar
    # refuses, allowed ids whose every token is a bad word, a grammar that accepts nothing
    with httpx.Client(base_url=server.base_url, timeout=60) as h:
        paris = h.post("/tokenize", json={"prompt": " Paris", "add_special_tokens": False}).json()["tokens"]
        bodies = [dict(structured_outputs={"choice": ["yes"]}, allowed_token_ids=[5]),
                  dict(allowed_token_ids=paris, bad_words=["Paris"], temperature=1.0),
                  dict(structured_outputs={"grammar": "root ::= root"})]
        for extra in bodies:
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **extra}
            r = h.post("/v1/completions", json=body)
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert "no token" in r.json()["error"]["message"], r.text
            events = h.post("/v1/completions", json=dict(body, stream=True)).text.split("\n\n")
            errors = [json.loads(e[6:])["error"] for e in events if e.startswith("data: {") and '"error"' in e]
            assert errors and errors[0]["type"] == "invalid_request_error", events
            assert "no token" in errors[0]["message"], events
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text \
        == server.reference.text
    wait_until_idle(server)


def test_min_tokens_holds_stop_strings_back(client):
    # greedy " Paris." would stop at "." after two tokens; as vLLM, stop strings wait for min_tokens
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."])
    held = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."],
                                     extra_body={"min_tokens": 5})
    assert free.usage.completion_tokens < 5 and free.choices[0].finish_reason == "stop"
    assert held.usage.completion_tokens >= 5 and held.choices[0].text.startswith(free.choices[0].text + ".")


def test_chat_without_max_tokens_gets_what_the_small_kv_pool_holds(server, client):
    # the 91-block pool holds 1,456 tokens, max_model_len is 8,192: the default max_tokens
    # (the context the prompt leaves) used to be refused as a request that can never fit
    engine = server.engine
    assert engine.max_sequence_tokens == engine.num_blocks * 16 < engine.max_model_len
    r = client.chat.completions.create(model=MODEL, messages=USER, temperature=0)
    assert r.choices[0].finish_reason == "stop" and "4" in r.choices[0].message.content
    wait_until_idle(server)


def test_disconnects_free_every_block(server):
    """8 streams, 4 hang up after their second chunk; the rest get exactly their tokens."""

    async def one(h: httpx.AsyncClient, i: int) -> int:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6 + i, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with h.stream("POST", "/v1/completions", json=body) as r:
            n = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    n += 1
                    if i % 2 and n == 2:
                        return -1
                    usage = json.loads(line[6:]).get("usage")
        return usage["completion_tokens"]

    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as h:
            return await asyncio.gather(*(one(h, i) for i in range(8)))

    assert asyncio.run(main()) == [-1 if i % 2 else 6 + i for i in range(8)]
    wait_until_idle(server, timeout=2.0)
    text = httpx.get(server.base_url + "/metrics").text
    assert metric(text, "inflight:kv_cache_usage_perc") == 0.0
    assert metric(text, "inflight:request_success_total", finished_reason="abort") >= 4


def test_non_streaming_timeout_aborts(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=500, extra_body={"ignore_eos": True})
    wait_until_idle(server, timeout=2.0)


def test_idle_server_uses_almost_no_cpu(server, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    time.sleep(0.5)  # let torch's worker threads stop spinning
    wakeups = idle_wakeup_cpu_seconds()
    step_thread = server.state.engine.thread
    t0, p0 = thread_cpu_seconds(step_thread), time.process_time()
    time.sleep(1.0)
    step_cpu, process_cpu = thread_cpu_seconds(step_thread) - t0, time.process_time() - p0
    # the idle wakeups this host charges for (the uvicorn thread's and this one's) on top
    assert step_cpu < 0.02 and process_cpu < 0.1 + 2 * wakeups, (step_cpu, process_cpu, wakeups)


def test_64_concurrent_streams_get_exact_token_counts(server):
    async def one(h: httpx.AsyncClient, max_tokens: int) -> int:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with h.stream("POST", "/v1/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: {")]
        return json.loads(lines[-1][6:])["usage"]["completion_tokens"]

    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120,
                                     limits=httpx.Limits(max_connections=100)) as h:
            return await asyncio.gather(*(one(h, 1 + i % 6) for i in range(64)))

    assert asyncio.run(main()) == [1 + i % 6 for i in range(64)]
    wait_until_idle(server)


def test_sigterm_ends_running_streams_and_exits_0(tmp_path):
    """`inflight serve` in a subprocess: SIGTERM stops admitting, aborts what outlives
    --shutdown-timeout (its stream ends with finish_reason "abort" and [DONE]), exits 0."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "inflight.entrypoints.cli", "serve", "--port", str(port), "--dtype", "float32",
           "--kv-cache-memory", str(64 * 2**20), "--shutdown-timeout", "0.5", "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "w"))
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "abort"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()

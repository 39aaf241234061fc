"""`inflight proxy` in front of a prefill (kv_producer) and a decode (kv_consumer)
`inflight serve` process, on a tiny random model: greedy completions streamed and not
equal one plain engine's, the decode instance computes no prompt token but the last,
every block returns to both pools after concurrent requests with disconnects, and a
dead prefill instance makes the proxy answer 503."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from inflight.engine.llm_engine import LLMEngine
from inflight.sampling_params import SamplingParams
from test_disagg import tiny_checkpoint
from test_server import metric

pytestmark = pytest.mark.slow

BLOCK = 4
MAX_TOKENS = 5
SHARED = [7 + (5 * j) % 240 for j in range(26)]
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(33 + 10 * i)] for i in range(2)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201, 202, 203, 204]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url} exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become healthy")


def serve(folder: str, kv: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "inflight.entrypoints.cli", "serve", folder, "--port", str(port),
           "--dtype", "float32", "--block-size", str(BLOCK), "--kv-cache-memory", str(4 * 2**20),
           "--disable-log-stats", "--uvicorn-log-level", "warning", "--kv-transfer-config", json.dumps(kv)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env), f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))
    prefill, prefill_url = serve(folder, {"kv_role": "kv_producer", "kv_port": 0,
                                          "kv_connector_extra_config": {"abort_timeout_s": 3}})
    decode, decode_url = serve(folder, {"kv_role": "kv_consumer"})
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "inflight.entrypoints.cli", "proxy", "--prefill", prefill_url,
                              "--decode", decode_url, "--port", str(port), "--timeout", "300"])
    procs = [prefill, decode, proxy]
    try:
        proxy_url = f"http://127.0.0.1:{port}"
        # the reference engine loads while the servers start
        plain = LLMEngine.from_kwargs(model=folder, dtype="float32", kv_cache_memory=4 * 2**20, block_size=BLOCK)
        for url, proc in ((prefill_url, prefill), (decode_url, decode), (proxy_url, proxy)):
            wait_healthy(url, proc)
        yield {"proxy": proxy_url, "prefill": prefill_url, "decode": decode_url, "plain": plain,
               "prefill_proc": prefill}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def plain_text(engine: LLMEngine, prompt: list[int]) -> str:
    rid = f"ref-{time.monotonic_ns()}"
    engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    while True:
        for out in engine.step():
            if out.finished:
                return out.outputs[0].text


def body(prompt: list[int], stream: bool = False) -> dict:
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": stream}


def decode_tokens_computed(cluster) -> float:
    return metric(httpx.get(cluster["decode"] + "/metrics").text, "inflight:iteration_tokens_total_sum")


def streamed_text(url: str, payload: dict) -> str:
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=payload, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    return text


def test_greedy_through_the_proxy_equals_plain_and_decode_computes_only_the_last_prompt_token(cluster):
    for i, prompt in enumerate(PROMPTS):
        ref = plain_text(cluster["plain"], prompt)
        before = decode_tokens_computed(cluster)
        if i % 2:
            got = streamed_text(cluster["proxy"], body(prompt, stream=True))
        else:
            r = httpx.post(cluster["proxy"] + "/v1/completions", json=body(prompt), timeout=60)
            assert r.status_code == 200, r.text
            got = r.json()["choices"][0]["text"]
        assert got == ref
        # the last prompt token, then one per generated token after the first
        assert decode_tokens_computed(cluster) - before == MAX_TOKENS
    before = decode_tokens_computed(cluster)
    chat = {"messages": [{"role": "user", "content": "tell me about the blocks " * 6}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}
    r = httpx.post(cluster["proxy"] + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
    assert decode_tokens_computed(cluster) - before == MAX_TOKENS  # chat prompts move the same way
    decode_metrics = httpx.get(cluster["decode"] + "/metrics").text
    assert metric(decode_metrics, "inflight:kv_transfer_pulls_total") == len(PROMPTS) + 1
    assert metric(decode_metrics, "inflight:kv_transfer_failures_total") == 0


async def _one(client: httpx.AsyncClient, url: str, prompt: list[int], leave: bool) -> bool:
    payload = {**body(prompt, stream=True), "max_tokens": 4}
    async with client.stream("POST", url + "/v1/completions", json=payload) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if leave and line.startswith("data: "):
                return False  # disconnect mid-stream: the proxy closes both upstream requests
        return True


def kv_usage(url: str) -> float:
    return metric(httpx.get(url + "/metrics").text, "inflight:kv_cache_usage_perc")


def test_every_block_returns_after_concurrent_requests_with_disconnects(cluster):
    async def run() -> list[bool]:
        async with httpx.AsyncClient(timeout=120) as client:
            prompts = [[3 + (k * 11 + j * 5) % 240 for j in range(10 + k)] for k in range(32)]
            return await asyncio.gather(*(_one(client, cluster["proxy"], p, k % 3 == 0 and k < 30)
                                          for k, p in enumerate(prompts)))

    done = asyncio.run(run())
    assert done.count(False) == 10 and all(done[k] for k in range(32) if not (k % 3 == 0 and k < 30))
    deadline = time.monotonic() + 30  # a prefill nobody pulled is freed after abort_timeout_s (3 s)
    while (kv_usage(cluster["prefill"]) or kv_usage(cluster["decode"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kv_usage(cluster["prefill"]) == 0 and kv_usage(cluster["decode"]) == 0


def test_a_dead_prefill_instance_makes_the_proxy_answer_503(cluster):
    assert httpx.get(cluster["proxy"] + "/health", timeout=30).status_code == 200
    assert httpx.get(cluster["proxy"] + "/v1/models", timeout=30).json()["data"]
    proc = cluster["prefill_proc"]
    proc.kill()
    proc.wait(timeout=20)
    t0 = time.monotonic()
    r = httpx.post(cluster["proxy"] + "/v1/completions", json=body(PROMPTS[0]), timeout=30)
    assert r.status_code == 503 and time.monotonic() - t0 < 15
    assert httpx.get(cluster["proxy"] + "/health", timeout=30).status_code == 503

"""Cancellation, idle CPU and engine crashes, over the fake engine (fast)."""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from inflight.entrypoints.openai.server_thread import ServerThread
from test_async_engine import idle_wakeup_cpu_seconds, make_fake_engine, thread_cpu_seconds
from test_server import (C, MODEL, _reset, client, metric, server, wait_until_idle,  # noqa: F401 (fixtures)
                         wait_until_in_engine)


# ---------------------------------------------------------------- cancellation
def test_streaming_client_disconnect_aborts_and_frees_blocks(server):
    server.engine.runner.step_delay = 0.02
    with httpx.Client(base_url=server.base_url, timeout=10) as h:
        with h.stream("POST", C, json={"prompt": "Hi", "max_tokens": 100, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert server.state.engine.num_unfinished == 1
        # Leaving the block closed the connection mid-stream; finishing would take 2 s.
        wait_until_idle(server, timeout=1.0)
        text = h.get("/metrics").text
    assert metric(text, "inflight:request_success_total", finished_reason="abort") >= 1
    assert metric(text, "inflight:num_requests_running") == 0


def test_non_streaming_client_timeout_aborts_and_frees_blocks(server, caplog):
    server.engine.runner.step_delay = 0.02
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=0.3)
    aborted = metric(httpx.get(server.base_url + "/metrics").text, "inflight:request_success_total",
                     finished_reason="abort")
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=100, extra_body={"ignore_eos": True})
    wait_until_idle(server, timeout=1.0)  # finishing would take 2 s
    text = httpx.get(server.base_url + "/metrics").text
    assert metric(text, "inflight:request_success_total", finished_reason="abort") == aborted + 1
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # a client leaving is no server error


def test_concurrent_streams_get_exact_counts_and_dropped_ones_free_their_blocks(server):
    """64 streams with their own max_tokens; then 40 streams of which 20 hang up mid-way."""
    server.engine.runner.step_delay = 0.002

    async def one(h: httpx.AsyncClient, max_tokens: int, drop_after: int = 0) -> int:
        body = {"prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        text, usage = "", None
        async with h.stream("POST", C, json=body) as r:
            chunks = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks += 1
                if drop_after and chunks >= drop_after:
                    return -1
                data = json.loads(line[6:])
                text += "".join(c["text"] for c in data["choices"])
                usage = data.get("usage") or usage
        assert usage["completion_tokens"] == len(text)
        return len(text)

    async def main():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60, limits=limits) as h:
            counts = await asyncio.gather(*(one(h, 1 + i % 50) for i in range(64)))
            assert counts == [1 + i % 50 for i in range(64)]
            counts = await asyncio.gather(*(one(h, 60, drop_after=5 if i % 2 else 0) for i in range(40)))
            assert counts == [-1 if i % 2 else 60 for i in range(40)]

    asyncio.run(main())
    wait_until_idle(server, timeout=3.0)
    text = httpx.get(server.base_url + "/metrics").text
    assert metric(text, "inflight:kv_cache_usage_perc") == 0.0
    assert metric(text, "inflight:num_requests_running") == metric(text, "inflight:num_requests_waiting") == 0


def test_idle_server_uses_no_cpu(server, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    time.sleep(0.2)
    wakeups = idle_wakeup_cpu_seconds()
    step_thread = server.state.engine.thread
    t0, p0 = thread_cpu_seconds(step_thread), time.process_time()
    time.sleep(1.0)
    step_cpu, process_cpu = thread_cpu_seconds(step_thread) - t0, time.process_time() - p0
    assert step_cpu < 0.02, f"idle step thread used {step_cpu:.3f} s of CPU in 1 s"
    # NOTE: a polling loop anywhere in the process costs a large part of a second; the wakeups
    # the host charges for (twice: the uvicorn thread and this one) are allowed on top of 0.05 s
    assert process_cpu < 0.05 + 2 * wakeups, \
        f"idle server process used {process_cpu:.3f} s of CPU in 1 s (idle wakeups here cost {wakeups:.3f} s)"


# ---------------------------------------------------------------------- crash
def test_engine_crash_fails_requests_with_500_and_the_server_exits_non_zero():
    engine = make_fake_engine(max_num_seqs=64, max_num_batched_tokens=512)
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=10)
        assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text == "he"
        engine.runner.step_delay = 0.02
        stream = client.completions.create(model=MODEL, prompt="Hi", max_tokens=50, stream=True)
        next(iter(stream))
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.completions.create, model=MODEL, prompt="Hi", max_tokens=50)
            wait_until_in_engine(srv, 2)  # the crash must meet it in the engine, not before
            engine.runner.crash = True
            with pytest.raises(openai.InternalServerError) as e:
                pending.result()
        assert e.value.status_code == 500 and "Traceback" not in str(e.value) and "simulated" not in str(e.value)
        with pytest.raises(openai.APIError, match="engine is not running"):
            list(stream)  # an in-band error event ends the stream instead of a hang
        # No process that answers 503 forever: the server drains and exits with status 1 (under
        # `inflight serve` the process ends and a supervisor restarts it; here the uvicorn thread ends).
        srv._thread.join(15)
        assert not srv._thread.is_alive() and srv.server.exit_code == 1
        assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_blocks


def test_health_fails_while_a_step_makes_no_progress():
    engine = make_fake_engine(max_num_seqs=64, max_num_batched_tokens=512)
    with ServerThread(engine, MODEL, log_stats=False, health_stall_timeout_s=0.3) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=10) as h, ThreadPoolExecutor(1) as pool:
            assert h.get("/health").status_code == 200  # idle for longer than the timeout: healthy
            time.sleep(0.4)
            assert h.get("/health").status_code == 200
            engine.runner.step_delay = 3.0  # a wedged forward pass, as far as /health can tell
            pending = pool.submit(httpx.post, srv.base_url + C, json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
            # NOTE: polled, not one look after a fixed sleep: on a loaded machine the request may
            # reach the step thread late, and the 3 s step leaves /health ~2.7 s to turn 503
            deadline = time.monotonic() + 2.5
            while (r := h.get("/health")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled"
            assert not pending.done()  # 503 while the step is still running, not after it
            engine.runner.step_delay = 0.0
            assert pending.result().status_code == 200
            assert h.get("/health").status_code == 200
    assert srv.server.exit_code == 0  # a plain stop is not a crash

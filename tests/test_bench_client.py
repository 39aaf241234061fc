"""The load client of `inflight bench serve` against a fake OpenAI-compatible
streaming server on 127.0.0.1 whose delays, failures and concurrency we control."""
from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inflight.bench.client import ClientConfig, arrival_offsets, run_load
from inflight.bench.common import make_report, write_report
from inflight.bench.metrics import summarize
from inflight.bench.serve import bench_once
from inflight.bench.workload import WorkloadRequest

TTFT_S, ITL_S = 0.15, 0.03


class FakeServer:
    """/v1/completions that streams ``max_tokens`` one-token chunks (TTFT_S, then ITL_S
    apart), then usage and [DONE]. A prompt starting with FAIL answers 500; DROP
    breaks the connection mid-stream; NODONE ends the stream without [DONE]."""

    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = 0
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.arrivals.append(time.perf_counter())
            self.bodies.append(body)
            if body["prompt"].startswith("FAIL"):
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            return StreamingResponse(self._events(body), media_type="text/event-stream")

        self.app = app

    async def _events(self, body: dict):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            n = body["max_tokens"]
            for i in range(n):
                await asyncio.sleep(TTFT_S if i == 0 else ITL_S)
                if body["prompt"].startswith("DROP") and i == 2:
                    raise RuntimeError("connection dropped")  # uvicorn cuts the chunked body short
                chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            if body["prompt"].startswith("NODONE"):
                return
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def fake():
    import uvicorn

    srv = FakeServer()
    server = uvicorn.Server(uvicorn.Config(srv.app, host="127.0.0.1", port=0, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "fake server did not start"
        time.sleep(0.01)
    srv.base_url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    yield srv
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def reset(fake):
    fake.arrivals.clear()
    fake.bodies.clear()
    fake.max_in_flight = 0
    return fake


def reqs(n, max_tokens=4, prompt="hello"):
    return [WorkloadRequest(f"r{i}", f"{prompt} {i}", 5, max_tokens) for i in range(n)]


def cfg(fake, **kw):
    return ClientConfig(base_url=fake.base_url, show_progress=False, **kw)


def test_all_at_once_records_every_metric(reset):
    res = asyncio.run(run_load(cfg(reset), reqs(6, max_tokens=5)))
    assert len(res.records) == 6 and [r.id for r in res.records] == [f"r{i}" for i in range(6)]
    for r in res.records:
        assert r.success and r.error == ""
        assert r.output_tokens == 5 and r.prompt_tokens == 7  # the server's usage wins
        assert TTFT_S * 0.9 <= r.ttft <= r.e2e
        assert len(r.itl) == 4 and all(x >= 0 for x in r.itl)
        assert r.ttft + sum(r.itl) <= r.e2e + 1e-6  # gaps between chunks, not times since the send
        assert r.tpot == pytest.approx((r.e2e - r.ttft) / 4)
    # a busy machine may hand the client a few chunks at once (gaps near 0), not most of them
    assert statistics.median(x for r in res.records for x in r.itl) >= ITL_S * 0.8
    starts = [r.start for r in res.records]
    assert max(starts) - min(starts) < 0.5  # all sent at once (a stall of the machine delays them alike)
    spread = max(reset.arrivals) - min(reset.arrivals)
    assert spread < 0.5 and reset.max_in_flight == 6
    body = reset.bodies[0]
    assert body["model"] == "fake-model" and body["stream"] and body["ignore_eos"]
    assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0
    s = summarize(res.records, res.duration)
    assert s["completed"] == 6 and s["total_output_tokens"] == 30
    assert s["ttft_p50_ms"] >= TTFT_S * 900 and s["e2el_p99_ms"] <= res.duration * 1000 + 1


def test_poisson_arrivals_follow_the_seeded_schedule(reset):
    offsets = arrival_offsets(20, rate=10.0, seed=3)
    assert offsets == arrival_offsets(20, rate=10.0, seed=3)  # reproducible
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert 0.05 < statistics.mean(gaps) < 0.2  # mean 1/rate = 0.1 s
    res = asyncio.run(run_load(cfg(reset, request_rate=10.0, seed=3), reqs(20, max_tokens=2)))
    assert len(reset.arrivals) == 20 and all(r.success for r in res.records)
    starts = sorted(r.start for r in res.records)
    # each sent when scheduled: never early, and late only by what a busy machine adds
    assert all(s >= o - 0.01 for s, o in zip(starts, offsets))
    assert statistics.median(s - o for s, o in zip(starts, offsets)) < 0.1
    seen = max(reset.arrivals) - min(reset.arrivals)
    assert seen >= offsets[-1] - 0.05


def test_burstiness_shapes_the_gaps():
    def cv(b):
        o = arrival_offsets(400, rate=5.0, burstiness=b, seed=1)
        gaps = [y - x for x, y in zip(o, o[1:])]
        return statistics.stdev(gaps) / statistics.mean(gaps), statistics.mean(gaps)
    bursty, mean_bursty = cv(0.25)
    poisson, mean_poisson = cv(1.0)
    steady, mean_steady = cv(8.0)
    assert bursty > 1.5 > poisson > 0.7 > 0.5 > steady  # CV = 1/sqrt(shape)
    for m in (mean_bursty, mean_poisson, mean_steady):
        assert m == pytest.approx(0.2, rel=0.25)  # the mean rate does not change
    assert arrival_offsets(3, float("inf")) == [0.0, 0.0, 0.0]
    for bad in ((0.0, 1.0), (1.0, 0.0)):
        with pytest.raises(ValueError):
            arrival_offsets(3, *bad)


def test_max_concurrency_is_respected(reset):
    res = asyncio.run(run_load(cfg(reset, max_concurrency=3), reqs(10, max_tokens=4)))
    assert all(r.success for r in res.records)
    assert reset.max_in_flight == 3  # reached, never exceeded
    # TTFT counts from the send, not from the wait for a slot: counted from the wait, a
    # queued request's TTFT would exceed its start (all were due at 0). Sums, not each
    # request, so that one slow first token on a busy machine does not decide it.
    late = [r for r in res.records if r.start > 2 * TTFT_S]
    assert len(late) >= 4  # the later waves waited for a slot
    assert sum(r.ttft for r in late) < 0.6 * sum(r.start for r in late)


def test_failures_are_counted_not_fatal(reset):
    work = reqs(3, max_tokens=4) + [WorkloadRequest("f500", "FAIL please", 5, 4),
                                    WorkloadRequest("drop", "DROP please", 5, 6),
                                    WorkloadRequest("nodone", "NODONE please", 5, 3)]
    res = asyncio.run(run_load(cfg(reset), work))
    by_id = {r.id: r for r in res.records}
    assert [by_id[f"r{i}"].success for i in range(3)] == [True] * 3
    assert not by_id["f500"].success and "HTTP 500" in by_id["f500"].error
    # a body cut short is the transport's error, not a missing [DONE]
    assert not by_id["drop"].success and "ClientPayloadError" in by_id["drop"].error, by_id["drop"].error
    assert not by_id["nodone"].success and "[DONE]" in by_id["nodone"].error
    s = summarize(res.records, res.duration)
    assert s["failed"] == 3 and s["completed"] == 3 and s["total_output_tokens"] == 12


def test_unreachable_server_fails_every_request():
    c = ClientConfig(base_url="http://127.0.0.1:9", model="m", show_progress=False, timeout_s=5)
    res = asyncio.run(run_load(c, reqs(2)))
    assert [r.success for r in res.records] == [False, False] and all(r.error for r in res.records)


def test_json_report_schema(reset, tmp_path):
    run = bench_once(cfg(reset, warmup_requests=1), reqs(4, max_tokens=3), "fake run", {"ttft": 10000, "tpot": 1000},
                     extra_config={"workload": "hand-made"})
    assert len(reset.bodies) == 5 and reset.bodies[0]["max_tokens"] == 4  # warmup first, short, untimed
    path = tmp_path / "out.json"
    write_report(make_report([run]), str(path))
    data = json.loads(path.read_text())  # strict JSON: the infinite rate is "inf"
    assert data["schema"] == "inflight.bench/1"
    assert {"date", "machine", "command", "percentiles", "runs"} <= set(data)
    assert data["machine"]["cpus"] >= 1
    (r,) = data["runs"]
    assert r["label"] == "fake run" and r["kind"] == "serve"
    assert r["config"]["request_rate"] == "inf" and r["config"]["num_requests"] == 4
    assert r["config"]["goodput_slo_ms"] == {"ttft": 10000, "tpot": 1000} and "api_key" not in r["config"]
    s = r["summary"]
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "goodput", "failed",
                "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms",
                "e2el_p99_ms", "duration_s"):
        assert key in s, key
    assert s["good_requests"] == 4 and s["failed"] == 0
    assert len(r["requests"]) == 4
    assert set(r["requests"][0]) == {"id", "prompt_tokens", "max_tokens", "output_tokens", "success", "error",
                                     "start", "ttft", "e2e", "itl", "tpot"}

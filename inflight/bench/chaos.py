"""Chaos clients for the soak benchmark (benchmarks/soak.py): well-formed requests
from the shared workload shapes, clients that disconnect at random points, and
malformed requests, sent in Poisson bursts; plus what each of them saw.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx

from inflight.bench.workload import WorkloadRequest

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@dataclass
class Job:
    """One client of the soak: what it sends and how it behaves."""

    index: int
    kind: str  # "good" | "disconnect" | "bad"
    path: str
    body: Any  # a JSON-able dict, or raw bytes (malformed JSON)
    max_tokens: int = 0
    stream: bool = False
    drop_after_s: float = 0.0  # disconnect, not streaming: the client gives up after this long
    drop_after_chunks: int = 0  # disconnect, streaming: chunks read before the client goes


@dataclass
class JobResult:
    """What one client saw. ``status`` 0: no HTTP answer (dropped on purpose, timed out, refused)."""

    index: int
    kind: str
    status: int = 0
    completion_tokens: Optional[int] = None
    expected_tokens: int = 0
    dropped: bool = False  # the client went away on purpose before the answer ended
    timed_out: bool = False  # no answer within the request timeout: a stuck request
    error: str = ""
    latency_s: float = 0.0

    @property
    def exact(self) -> bool:
        return self.status == 200 and self.completion_tokens == self.expected_tokens


def _bad_bodies(model: str) -> list[tuple[str, Any]]:
    """Malformed or out-of-range requests; each must get a 4xx."""
    base = {"model": model, "prompt": "Hello", "max_tokens": 4}
    return [
        (COMPLETIONS, b'{"model": "x", "prompt": "unterminated'),
        (COMPLETIONS, {**base, "model": "no-such-model"}),
        (COMPLETIONS, {**base, "temperature": -1.0}),
        (COMPLETIONS, {**base, "max_tokens": 0}),
        (COMPLETIONS, {**base, "seed": 2**64}),
        (COMPLETIONS, {**base, "prompt": []}),
        (COMPLETIONS, {**base, "n": 0}),
        (COMPLETIONS, {**base, "top_p": 2.0}),
        (COMPLETIONS, {**base, "prompt": [1] * 10_000}),  # past max_model_len
        (CHAT, {"model": model, "max_tokens": 4}),  # no messages
        (CHAT, {"model": model, "messages": [], "max_tokens": 4}),
        (CHAT, {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": -3}),
        (COMPLETIONS, {**base, "allowed_token_ids": []}),
        (COMPLETIONS, {**base, "truncate_prompt_tokens": 0}),
        (COMPLETIONS, {**base, "bad_words": ["x"] * 100}),
        (CHAT, {"model": model, "messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}),
    ]


# vLLM's request fields that change how a request is sampled or answered, mixed into good
# requests: none of them changes how many tokens an ignore_eos request gets.
_EXTRAS: list[dict[str, Any]] = [
    {"bad_words": ["the", "and"]}, {"allowed_token_ids": list(range(30, 90))}, {"truncate_prompt_tokens": 12},
    {"return_token_ids": True}, {"logit_bias": {"28": 5.0}}, {"stop": ["zzz"], "include_stop_str_in_output": True},
]


def plan_jobs(prompts: list[WorkloadRequest], num_requests: int, model: str, seed: int = 0,
              disconnect_frac: float = 0.3, bad_frac: float = 0.1, max_tokens: int = 8,
              max_prompt_words: int = 96) -> list[Job]:
    """The soak's clients, in arrival order: prompts cycle through ``prompts`` (cut to
    ``max_prompt_words`` words, outputs to ``max_tokens`` tokens, sent with ignore_eos)."""
    rng = random.Random(seed)
    bad = _bad_bodies(model)
    jobs = []
    for i in range(num_requests):
        r = rng.random()
        if r < bad_frac:
            path, body = bad[i % len(bad)]
            jobs.append(Job(i, "bad", path, body))
            continue
        w = prompts[i % len(prompts)]
        n = max(1, min(w.max_tokens, max_tokens))
        text = " ".join(w.prompt.split()[:max_prompt_words])
        body: dict[str, Any] = {"model": model, "max_tokens": n, "ignore_eos": True}
        if rng.random() < 0.3:
            body.update(temperature=0.8, seed=i)
        else:
            body["temperature"] = 0.0
        chat = rng.random() < 0.5
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
            if rng.random() < 0.2:  # an answer continued from a prefilled start
                body["messages"].append({"role": "assistant", "content": "Sure,"})
                body.update(continue_final_message=True, add_generation_prompt=False, echo=rng.random() < 0.5)
        else:
            body["prompt"] = text
        if rng.random() < 0.3:
            body.update(rng.choice(_EXTRAS))
        stream = rng.random() < 0.5
        if stream:
            body.update(stream=True, stream_options={"include_usage": True,
                                                     "continuous_usage_stats": rng.random() < 0.3})
        kind = "disconnect" if r < bad_frac + disconnect_frac else "good"
        jobs.append(Job(i, kind, CHAT if chat else COMPLETIONS, body, n, stream,
                        drop_after_s=rng.uniform(0.0, 2.0), drop_after_chunks=rng.randint(0, n)))
    return jobs


def _tokens_from_events(lines: list[str]) -> tuple[Optional[int], str]:
    """(usage.completion_tokens of the final usage chunk, an in-band error if any)."""
    tokens, error = None, ""
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            error = str(event["error"].get("message", event["error"]))[:200]
        elif event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    return tokens, error


async def _stream(client: httpx.AsyncClient, job: Job, res: JobResult) -> None:
    async with client.stream("POST", job.path, json=job.body) as resp:
        res.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            res.error = resp.text[:200]
            return
        lines: list[str] = []
        async for line in resp.aiter_lines():
            if line:
                lines.append(line)
            if job.kind == "disconnect" and len(lines) > job.drop_after_chunks:
                res.dropped = True
                return  # leaving the block closes the connection mid-stream
    res.completion_tokens, res.error = _tokens_from_events(lines)


async def _post(client: httpx.AsyncClient, job: Job, res: JobResult) -> None:
    send = (client.post(job.path, content=job.body, headers={"content-type": "application/json"})
            if isinstance(job.body, bytes) else client.post(job.path, json=job.body))
    if job.kind == "disconnect":
        try:
            resp = await asyncio.wait_for(send, job.drop_after_s)
        except asyncio.TimeoutError:
            res.dropped = True  # cancelling the request closes its connection
            return
    else:
        resp = await send
    res.status = resp.status_code
    if resp.status_code == 200:
        res.completion_tokens = resp.json()["usage"]["completion_tokens"]
    else:
        res.error = resp.text[:200]


async def run_job(client: httpx.AsyncClient, job: Job, timeout_s: float) -> JobResult:
    """Send one job and record what came back (never raises)."""
    res = JobResult(job.index, job.kind, expected_tokens=job.max_tokens)
    t0 = time.monotonic()
    try:
        work = _stream(client, job, res) if job.stream else _post(client, job, res)
        await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        res.timed_out = True
    except (httpx.HTTPError, OSError, ValueError, KeyError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
    res.latency_s = time.monotonic() - t0
    return res


@dataclass
class Driver:
    """Sends jobs in Poisson bursts: ``burst_s`` seconds at ``rate`` jobs/s, then
    a pause of ``pause_s``, so the queue builds up and drains again."""

    base_url: str
    rate: float
    burst_s: float = 2.0
    pause_s: float = 6.0
    timeout_s: float = 300.0
    seed: int = 0
    on_result: Optional[Callable[[JobResult, int], None]] = None  # (result, number finished so far)
    results: list[JobResult] = field(default_factory=list)

    async def run(self, jobs: list[Job]) -> list[JobResult]:
        rng = random.Random(self.seed)
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, limits=limits,
                                     trust_env=False) as client:
            tasks, i = [], 0
            while i < len(jobs):
                burst_end = time.monotonic() + self.burst_s
                while i < len(jobs) and time.monotonic() < burst_end:
                    tasks.append(asyncio.ensure_future(self._one(client, jobs[i])))
                    i += 1
                    await asyncio.sleep(rng.expovariate(self.rate))
                if i < len(jobs):
                    await asyncio.sleep(self.pause_s)
            await asyncio.gather(*tasks)
        return self.results

    async def _one(self, client: httpx.AsyncClient, job: Job) -> None:
        res = await run_job(client, job, self.timeout_s)
        self.results.append(res)
        if self.on_result is not None:
            self.on_result(res, len(self.results))


async def poll_health(base_url: str, stop: asyncio.Event, interval_s: float = 0.25) -> tuple[list[float], int]:
    """GET /health until ``stop`` is set: (latencies in seconds, answers that were not 200)."""
    latencies, failures = [], 0
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0, trust_env=False) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = (await client.get("/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.monotonic() - t0)
            failures += not ok
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except asyncio.TimeoutError:
                pass
    return latencies, failures

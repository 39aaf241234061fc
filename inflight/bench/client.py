"""A streaming load client for any OpenAI-compatible server (``/v1/completions``
or ``/v1/chat/completions``), on asyncio + aiohttp.

Requests arrive all at once (rate ``inf``), as a Poisson process at
``request_rate``, or as a gamma process with shape ``burstiness`` (1 is Poisson,
below 1 burstier, above 1 more regular) at the same mean rate; at most
``max_concurrency`` are in flight. Every request streams, and asks for a final
usage chunk, so token counts are the server's own.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from inflight.bench.metrics import RequestRecord
from inflight.bench.workload import WorkloadRequest


@dataclass
class ClientConfig:
    """Where to send the load and how."""

    base_url: str = "http://127.0.0.1:8000"
    model: Optional[str] = None  # None: the first model the server lists
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: Optional[int] = None
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 3600.0
    api_key: Optional[str] = None
    warmup_requests: int = 0
    show_progress: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadResult:
    """Per-request records and the wall time from the first send to the last answer."""

    records: list[RequestRecord]
    duration: float
    started_at: float  # time.time() when the load began
    model: str = ""


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of ``n`` requests; the first goes at 0."""
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(n):
        offsets.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


def _payload(cfg: ClientConfig, model: str, req: WorkloadRequest, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": cfg.temperature,
                            "stream": True, "stream_options": {"include_usage": True},
                            "ignore_eos": cfg.ignore_eos}
    if cfg.endpoint.rstrip("/").endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    body.update(cfg.extra_body)
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    """Generated text carried by one streamed chunk (completions or chat)."""
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


async def _stream(session, cfg: ClientConfig, model: str, req: WorkloadRequest, rec: RequestRecord,
                  t_send: float, max_tokens: int) -> None:
    """Send one request and fill ``rec`` from its stream; raises on any failure."""
    chunks, last, usage, done = 0, t_send, None, False
    url = cfg.base_url.rstrip("/") + cfg.endpoint
    async with session.post(url, json=_payload(cfg, model, req, max_tokens)) as resp:
        if resp.status != 200:
            body = (await resp.read()).decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {resp.status}: {body}")
        async for line in resp.content:  # one SSE line at a time
            if not line.startswith(b"data:"):
                continue
            now = time.perf_counter()  # the chunk's arrival, before parsing it
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error in stream: {chunk['error']}")
            if _chunk_text(chunk):
                if rec.ttft is None:
                    rec.ttft = now - t_send
                else:
                    rec.itl.append(now - last)
                last, chunks = now, chunks + 1
            usage = chunk.get("usage") or usage
    if not done:
        raise RuntimeError("the stream ended before [DONE]")
    rec.e2e = time.perf_counter() - t_send
    if usage:
        rec.output_tokens = int(usage.get("completion_tokens") or 0)
        rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
    else:
        rec.output_tokens = chunks  # no usage: one token per content chunk, a lower bound
    rec.success = True


async def _one(session, cfg: ClientConfig, model: str, req: WorkloadRequest, delay: float, t0: float,
               sem: Optional[asyncio.Semaphore], bar) -> RequestRecord:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    rec = RequestRecord(id=req.id, prompt_tokens=max(req.prompt_tokens, 0), max_tokens=req.max_tokens)
    async with sem if sem is not None else contextlib.nullcontext():
        t_send = time.perf_counter()
        rec.start = t_send - t0
        try:
            await _stream(session, cfg, model, req, rec, t_send, req.max_tokens)
        except Exception as e:  # any failure is a failed request, never a crashed benchmark
            rec.success, rec.e2e = False, time.perf_counter() - t_send
            rec.error = f"{type(e).__name__}: {e}"[:500]
    if bar is not None:
        bar.update(1)
    return rec


def import_aiohttp():
    """aiohttp, or a one-line error saying how to get it."""
    try:
        import aiohttp
    except ImportError:  # ValueError: the CLI prints it as one line, not a traceback
        raise ValueError("`inflight bench serve` and `bench sweep` need aiohttp: pip install aiohttp") from None
    return aiohttp


def make_session(cfg: ClientConfig, connections: int):
    """An aiohttp session with room for every concurrent stream (no pool queueing).

    NOTE: aiohttp, as vLLM's serving benchmark uses, not httpx: on a 2-core machine the
    client shares the cores with the server it measures, and httpx's pure-Python stream
    parsing took about a quarter more CPU over the chat workload."""
    aiohttp = import_aiohttp()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    connector = aiohttp.TCPConnector(limit=max(connections, 1))
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=30.0)
    # trust_env=False: a proxy from the environment must not sit between client and server.
    # read_bufsize: a streamed line (a chunk with logprobs, say) may be far above the 64 KiB default.
    return aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout, trust_env=False,
                                 read_bufsize=2 ** 20)


async def resolve_model(session, cfg: ClientConfig) -> str:
    """``cfg.model``, or the first model the server lists at /v1/models."""
    if cfg.model:
        return cfg.model
    async with session.get(cfg.base_url.rstrip("/") + "/v1/models") as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


async def run_load(cfg: ClientConfig, requests: list[WorkloadRequest]) -> LoadResult:
    """Send ``requests`` by the configured arrival process; returns every record, in input order."""
    from tqdm.auto import tqdm

    offsets = arrival_offsets(len(requests), cfg.request_rate, cfg.burstiness, cfg.seed)
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    async with make_session(cfg, cfg.max_concurrency or len(requests)) as session:
        model = await resolve_model(session, cfg)
        for i in range(cfg.warmup_requests):
            warm = RequestRecord(id=f"warmup-{i}")
            await _stream(session, cfg, model, requests[i % len(requests)], warm, time.perf_counter(), 4)
        bar = tqdm(total=len(requests), desc="Requests", dynamic_ncols=True) if cfg.show_progress else None
        started_at, t0 = time.time(), time.perf_counter()
        try:
            records = await asyncio.gather(*(_one(session, cfg, model, r, d, t0, sem, bar)
                                             for r, d in zip(requests, offsets)))
        finally:
            if bar is not None:
                bar.close()
        duration = time.perf_counter() - t0
    return LoadResult(list(records), duration, started_at, model)

"""``inflight proxy --prefill URL [URL...] --decode URL [URL...] --port P``: one
OpenAI-compatible front for prefill/decode disaggregation.

Each completion or chat request goes first to a prefill instance (round robin) with
``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true}``; the
``kv_transfer_params`` of its answer then go with the original request to a decode
instance, which pulls the prompt's KV and generates; its answer (streamed or not) is
the client's. A client that leaves closes the upstream connection, and the instance
aborts the request there (a prefill instance whose prompt was already done frees the
blocks when the decode side releases them, or after its abort timeout). A prefill
instance that cannot be reached is skipped; with none left the answer is 503.
``/health`` is 200 only while every instance answers 200.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from inflight.entrypoints.openai.errors import OpenAIError
from inflight.entrypoints.openai.serving_common import unless_disconnected
from inflight.entrypoints.openai.sse import SSEResponse

logger = logging.getLogger(__name__)

CLIENT_CLOSED = 499
_PASS_HEADERS = ("authorization", "x-request-id")


@dataclass
class ProxyState:
    """The instances behind the proxy and the shared HTTP client."""

    prefill: list[str]
    decode: list[str]
    timeout_s: float = 600.0
    client: Optional[httpx.AsyncClient] = None
    _prefill_rr: Any = field(default=None, repr=False)
    _decode_rr: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.prefill = [u.rstrip("/") for u in self.prefill]
        self.decode = [u.rstrip("/") for u in self.decode]
        self._prefill_rr, self._decode_rr = itertools.count(), itertools.count()

    def prefill_order(self) -> list[str]:
        """Every prefill instance, starting with the next in round robin."""
        k = next(self._prefill_rr) % len(self.prefill)
        return self.prefill[k:] + self.prefill[:k]

    def next_decode(self) -> str:
        return self.decode[next(self._decode_rr) % len(self.decode)]


def _unavailable(message: str) -> Response:
    return OpenAIError(503, message, code="upstream_unavailable", headers={"Retry-After": "1"}).response()


def _prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    return out


async def _prefill(state: ProxyState, path: str, body: dict, headers: dict) -> httpx.Response:
    """The first prefill instance that answers; raises ConnectionError when none does."""
    for url in state.prefill_order():
        try:
            return await state.client.post(url + path, json=_prefill_body(body), headers=headers)
        except httpx.TransportError as e:
            logger.warning("prefill instance %s failed: %s", url, e)
    raise ConnectionError("no prefill instance is reachable")


def _relay(upstream: httpx.Response) -> Response:
    """Relays an upstream SSE stream and closes it however the client's side ends, even
    if the client left before the body started (the instance then aborts the request)."""

    async def body() -> AsyncIterator[bytes]:
        async for chunk in upstream.aiter_raw():
            yield chunk

    return SSEResponse(body(), upstream.aclose, status_code=upstream.status_code)


async def _decode(state: ProxyState, raw: Request, path: str, body: dict, headers: dict) -> Response:
    url = state.next_decode() + path
    if body.get("stream"):
        upstream = await state.client.send(state.client.build_request("POST", url, json=body, headers=headers),
                                           stream=True)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, upstream.status_code, media_type="application/json")
        return _relay(upstream)
    resp = await unless_disconnected(raw, state.client.post(url, json=body, headers=headers))
    if resp is None:
        return Response(status_code=CLIENT_CLOSED)
    return Response(resp.content, resp.status_code, media_type="application/json")


async def handle(state: ProxyState, raw: Request, path: str) -> Response:
    """Prefill on one instance, then decode on another with the prefill's kv_transfer_params."""
    try:
        body = json.loads(await raw.body())
    except ValueError:
        return OpenAIError(400, "the request body is not valid JSON").response()
    if not isinstance(body, dict):
        return OpenAIError(400, "the request body must be a JSON object").response()
    headers = {k: v for k, v in raw.headers.items() if k.lower() in _PASS_HEADERS}
    try:
        pre = await unless_disconnected(raw, _prefill(state, path, body, headers))
    except ConnectionError as e:
        return _unavailable(str(e))
    if pre is None:
        return Response(status_code=CLIENT_CLOSED)
    if pre.status_code != 200:  # the client's mistake (400) or the instance's state (503): pass it on
        return Response(pre.content, pre.status_code, media_type="application/json")
    kv = pre.json().get("kv_transfer_params")
    decode_body = {**body, "kv_transfer_params": kv} if kv else body
    try:
        return await _decode(state, raw, path, decode_body, headers)
    except httpx.TransportError as e:
        logger.warning("decode instance failed: %s", e)
        return _unavailable(f"the decode instance failed: {type(e).__name__}")


async def health_of(state: ProxyState) -> dict[str, int]:
    """Each instance's /health status (0: unreachable)."""
    urls = state.prefill + state.decode

    async def one(url: str) -> int:
        try:
            return (await state.client.get(url + "/health", timeout=5.0)).status_code
        except httpx.HTTPError:
            return 0

    return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls))))


def build_proxy_app(state: ProxyState) -> FastAPI:
    """The proxy's FastAPI app; its HTTP client lives as long as the app."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(state.timeout_s, connect=5.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            state.client = client
            yield

    app = FastAPI(title="inflight proxy", lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await handle(state, raw, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(raw: Request) -> Response:
        return await handle(state, raw, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(raw: Request) -> Response:
        try:
            headers = {k: v for k, v in raw.headers.items() if k.lower() in _PASS_HEADERS}
            resp = await state.client.get(state.decode[0] + "/v1/models", headers=headers)
        except httpx.TransportError as e:
            return _unavailable(f"the decode instance failed: {type(e).__name__}")
        return Response(resp.content, resp.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        statuses = await health_of(state)
        ok = all(s == 200 for s in statuses.values())
        return JSONResponse({"instances": statuses}, status_code=200 if ok else 503)

    return app


def add_proxy_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``proxy`` subcommand."""
    p = subparsers.add_parser("proxy", help="front prefill and decode instances as one OpenAI-compatible server")
    p.add_argument("--prefill", nargs="+", required=True, help="base URLs of prefill (kv_producer) instances")
    p.add_argument("--decode", nargs="+", required=True, help="base URLs of decode (kv_consumer) instances")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds an upstream answer may take")
    p.add_argument("--uvicorn-log-level", default="warning")
    p.set_defaults(handler=run_proxy)
    return p


def run_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per upstream request
    app = build_proxy_app(ProxyState(args.prefill, args.decode, args.timeout))
    logger.info("proxy on http://%s:%d: prefill %s, decode %s", args.host, args.port, args.prefill, args.decode)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level)
    return 0

"""The FastAPI app of the OpenAI-compatible server, and how to run it with uvicorn."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from typing import Any, AsyncIterator, Optional, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import inflight
from inflight.engine.async_engine import AsyncLLMEngine
from inflight.entrypoints.openai.errors import OpenAIError, bad_request, engine_error, install_error_handlers
from inflight.entrypoints.openai.http_options import HttpOptions, fastapi_kwargs, install_http_options
from inflight.entrypoints.openai.limits import ServerLimits
from inflight.entrypoints.openai.middleware import RequestGuard, timed_h11_protocol
from inflight.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                  TokenizeRequest)
from inflight.entrypoints.openai.responses import (DetokenizeResponse, ModelCard, ModelList, TokenizeResponse,
                                                   dump)
from inflight.entrypoints.openai.serving_chat import ChatHandler
from inflight.entrypoints.openai.serving_common import ServerState
from inflight.entrypoints.openai.serving_completion import CompletionHandler
from inflight.entrypoints.openai.protocol_embeddings import EmbeddingRequest
from inflight.entrypoints.openai.serving_classify import ClassificationHandler, ClassificationRequest
from inflight.entrypoints.openai.serving_embedding import EmbeddingHandler
from inflight.entrypoints.openai.serving_score import RerankRequest, ScoreHandler, ScoreRequest
from inflight.entrypoints.openai.serving_lora import LoRAModels, runtime, runtime_updates_allowed
from inflight.entrypoints.openai.protocol_responses import ResponsesRequest
from inflight.entrypoints.openai.serving_responses import ResponsesHandler
from inflight.entrypoints.openai.tool_calling import plan_tools, render_chat_with_tools
from inflight.metrics import EngineMetrics

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_name(model: Optional[str]) -> str:
    """The name clients use when none was given: the model file or folder's name."""
    if not model:
        return DEFAULT_MODEL_NAME
    base = os.path.basename(os.path.normpath(model))
    return base[:-5] if base.endswith(".gguf") else base


def build_state(engine: Any, model_name: str, *, api_key: Optional[str] = None,
                max_waiting_requests: Optional[int] = None, log_stats: bool = True,
                log_interval_s: float = 5.0, limits: Optional[ServerLimits] = None,
                response_role: str = "assistant", log_requests: bool = False,
                max_log_len: Optional[int] = None, model_aliases: Sequence[str] = (),
                force_include_usage: bool = False, lora: Optional[LoRAModels] = None) -> ServerState:
    """Wrap a loaded LLMEngine (or an AsyncLLMEngine around one, or a DPEngineClient)
    for serving: metrics observer, async engine, settings.

    ``lora``: the LoRA adapters served under their names (``--lora-modules``), if LoRA is on.

    The step thread is started by the app's lifespan (or by the caller)."""
    interval = log_interval_s if log_stats else float("inf")
    if hasattr(engine, "use_metrics"):  # data parallel (engine/dp/): metrics per replica, labelled
        async_engine, metrics = engine, engine.use_metrics(model_name, interval)
    else:
        metrics = EngineMetrics(model_name, log_interval_s=interval)
        async_engine = engine if isinstance(engine, AsyncLLMEngine) else AsyncLLMEngine(engine)
        async_engine.observer = metrics
    engine = async_engine.engine
    return ServerState(engine=async_engine, tokenizer=engine.tokenizer, model_name=model_name,
                       max_model_len=engine.max_model_len, metrics=metrics,
                       model_root=getattr(engine, "model_source", None), api_key=api_key,
                       max_waiting_requests=max_waiting_requests, limits=limits or ServerLimits(),
                       vocab_size=_vocab_size(engine),
                       default_sampling=dict(getattr(engine, "default_sampling_params", None) or {}),
                       response_role=response_role, log_requests=log_requests, max_log_len=max_log_len,
                       model_aliases=list(model_aliases), max_logprobs=_max_logprobs(engine),
                       force_include_usage=force_include_usage, lora=lora or LoRAModels(),
                       pooler_config=getattr(engine, "pooler_config", None),
                       eos_token_ids=tuple(getattr(engine, "eos_token_ids", ())),
                       max_sequence_tokens=getattr(engine, "max_sequence_tokens", None),
                       hidden_size=getattr(getattr(engine, "arch", None), "hidden_size", None))


def _max_logprobs(engine: Any) -> int:
    config = getattr(engine, "config", None)  # a data-parallel client's view has none: the replicas' setting
    return config.model_config.max_logprobs if config is not None else getattr(engine, "max_logprobs", 20)


def _vocab_size(engine: Any) -> Optional[int]:
    arch = getattr(engine, "arch", None)
    size = getattr(arch, "vocab_size", None)
    return int(size) if size else None


async def require_api_key(request: Request) -> None:
    """401 unless the bearer token matches ``--api-key`` (when one is set)."""
    key = request.app.state.server.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise OpenAIError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`.",
                          code="invalid_api_key")


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def _guarded(work) -> Response:
    """Anything unexpected becomes an OpenAI-shaped error (500 reveals no internals)."""
    try:
        return await work
    except OpenAIError:
        raise
    except Exception as e:
        raise engine_error(e) from None


protected = APIRouter(dependencies=[Depends(require_api_key)])
public = APIRouter()


@public.get("/health")
@public.api_route("/ping", methods=["GET", "POST"])  # vLLM's alias (SageMaker's health route)
async def health(request: Request) -> Response:
    """200 while the engine loop is alive and making progress; 503 once it died or
    stopped, or while work has waited ``--health-stall-timeout`` seconds for a step to end."""
    engine = _state(request).engine
    if not engine.is_alive:
        return OpenAIError(503, "the inference engine is not running", code="engine_dead").response()
    stalled = engine.seconds_without_progress()
    if stalled > request.app.state.health_stall_timeout_s:
        return OpenAIError(503, f"the inference engine has made no progress for {stalled:.0f} s",
                           code="engine_stalled").response()
    return Response(status_code=200)


@public.get("/load")
async def load(request: Request) -> JSONResponse:
    """vLLM's load probe for routers: the requests the engine holds or is about to."""
    return JSONResponse({"server_load": _state(request).engine.num_unfinished})


@public.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": inflight.__version__})


@public.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@protected.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    state = _state(request)
    # The served names, never model_root: the filesystem layout is nobody's business.
    cards = [ModelCard(id=name, root=state.model_name, max_model_len=state.max_model_len)
             for name in [state.model_name, *state.model_aliases]]
    cards += [ModelCard(id=name, root=name, parent=lora.base_model_name or state.model_name,
                        max_model_len=state.max_model_len) for name, lora in state.lora.adapters.items()]
    return JSONResponse(dump(ModelList(data=cards)))


@protected.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await _guarded(CompletionHandler(_state(request)).create(body, request))


@protected.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await _guarded(ChatHandler(_state(request)).create(body, request))


@protected.post("/v1/embeddings")
async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    return await _guarded(EmbeddingHandler(_state(request)).create(body, request))


@protected.post("/classify")
async def create_classification(body: ClassificationRequest, request: Request) -> Response:
    return await _guarded(ClassificationHandler(_state(request)).create(body, request))


@protected.post("/score")
@protected.post("/v1/score")
async def create_score(body: ScoreRequest, request: Request) -> Response:
    return await _guarded(ScoreHandler(_state(request)).score(body, request))


@protected.post("/rerank")
@protected.post("/v1/rerank")
@protected.post("/v2/rerank")
async def create_rerank(body: RerankRequest, request: Request) -> Response:
    return await _guarded(ScoreHandler(_state(request)).rerank(body, request))


@protected.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    return await _guarded(ResponsesHandler(_state(request)).create(body, request))


@protected.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    state = _state(request)
    state.check_model(body.model)
    tok = state.tokenizer
    if body.messages is not None:
        plan = plan_tools(body, state.limits, state.renderer)
        ids = (await render_chat_with_tools(state, body, plan))["prompt_token_ids"]
    else:
        ids = await state.tokenize(body.prompt, body.add_special_tokens)
    strs = await state.pool.run(tok.convert_ids_to_tokens, ids) if hasattr(tok, "convert_ids_to_tokens") else None
    return JSONResponse(dump(TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=ids,
                                              token_strs=strs)))


@protected.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    state = _state(request)
    state.check_model(body.model)
    vocab = len(state.tokenizer)
    if any(not 0 <= t < vocab for t in body.tokens):
        raise bad_request(f"token ids must be in [0, {vocab})", "tokens")
    text = await state.pool.run(state.tokenizer.decode, body.tokens)
    return JSONResponse(dump(DetokenizeResponse(prompt=text)))


def build_app(state: ServerState, shutdown_grace_s: float = 5.0, health_stall_timeout_s: float = 60.0,
              http: Optional[HttpOptions] = None) -> FastAPI:
    """The app: starts the step thread on startup; on shutdown stops admitting,
    lets running requests finish for ``shutdown_grace_s``, aborts the rest.
    ``/health`` fails after ``health_stall_timeout_s`` seconds of pending work without a finished step.
    ``http``: CORS, root path and docs pages (default: vLLM's)."""
    http = http or HttpOptions()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            await state.engine.shutdown(shutdown_grace_s)
            state.pool.shutdown()

    app = FastAPI(title="inflight", version=inflight.__version__, lifespan=lifespan, **fastapi_kwargs(http))
    app.state.server = state
    app.state.health_stall_timeout_s = health_stall_timeout_s
    install_error_handlers(app)
    app.include_router(public)
    app.include_router(protected)
    if runtime_updates_allowed():
        app.include_router(runtime, dependencies=protected.dependencies)
    app.add_middleware(RequestGuard, limits=state.limits)
    install_http_options(app, http)  # outermost: a browser's preflight is answered before the guard
    return app


def make_uvicorn_server(app: FastAPI, host: str, port: int, *, log_level: str = "info",
                        shutdown_grace_s: float = 5.0, **kwargs: Any):
    """A uvicorn.Server for ``app`` that shuts down gracefully on SIGTERM/SIGINT
    (or ``should_exit``): stop admitting (503), let running requests finish for
    ``shutdown_grace_s``, then abort the rest so their streams end cleanly."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        exit_code = 0  # 1 once the engine crashed: the process must end so a supervisor restarts it

        async def on_tick(self, counter: int) -> bool:
            # uvicorn calls this every 0.1 s; a crashed engine is never answered with 503s forever
            if app.state.server.engine.crash is not None and not self.should_exit:
                logger.critical("the engine crashed: draining connections, then exiting with status 1")
                self.exit_code, self.should_exit = 1, True
            return await super().on_tick(counter)

        async def shutdown(self, sockets: Any = None) -> None:
            engine: AsyncLLMEngine = app.state.server.engine
            engine.stop_accepting()
            loop = asyncio.get_running_loop()
            timer = loop.call_later(shutdown_grace_s, lambda: asyncio.ensure_future(engine.abort_all()))
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    limits: ServerLimits = app.state.server.limits
    # uvicorn's own deadline (after which it cancels handlers) only backs ours up.
    # Its limit_concurrency (connections included) backs up --max-concurrent-requests,
    # leaving room for probes and idle kept-alive connections.
    backstop = None if limits.max_concurrent_requests is None else 2 * limits.max_concurrent_requests + 64
    kwargs.setdefault("limit_concurrency", backstop)
    kwargs.setdefault("timeout_keep_alive", limits.timeout_keep_alive)
    kwargs.setdefault("http", timed_h11_protocol(limits.header_timeout_s))
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(shutdown_grace_s) + 5, **kwargs)
    return GracefulServer(config)

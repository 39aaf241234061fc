"""``inflight serve [MODEL] --host --port --api-key ...`` plus every engine flag."""
from __future__ import annotations

import argparse
import logging
import os
import signal

logger = logging.getLogger(__name__)


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``serve`` subcommand (flags spelled as in ``vllm serve``)."""
    from inflight.entrypoints.engine_args import add_engine_args
    from inflight.entrypoints.openai.http_options import add_http_args
    from inflight.entrypoints.openai.limits import add_limit_args

    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model", nargs="?", default=None, help="HF folder or .gguf (default: embedded SmolLM2)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("INFLIGHT_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1 and tokenizer routes "
                        "(default: $INFLIGHT_API_KEY; /health, /metrics, /version stay open)")
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="answer 503 + Retry-After while this many requests wait (default: no limit)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds running requests may take to finish after SIGTERM before being aborted")
    p.add_argument("--health-stall-timeout", type=float, default=60.0,
                   help="/health answers 503 when work has waited this many seconds for an engine step to end")
    p.add_argument("--disable-log-stats", action="store_true", help="no periodic throughput log line")
    p.add_argument("--log-stats-interval", type=float, default=5.0, help="seconds between stats log lines")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help='LoRA adapters served under their names (needs --enable-lora): name=path or JSON '
                        '\'{"name": ..., "path": ..., "base_model_name": ...}\'')
    add_limit_args(p)
    add_http_args(p)
    add_engine_args(p)
    p.set_defaults(handler=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    """Load the engine, then serve until SIGTERM/SIGINT; returns the exit status."""
    from inflight.engine.async_engine import AsyncLLMEngine
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.engine_args import engine_kwargs_from_args
    from inflight.entrypoints.openai.http_options import http_options_from_args, uvicorn_kwargs
    from inflight.entrypoints.openai.limits import limits_from_args
    from inflight.entrypoints.openai.api_server import (build_app, build_state, default_model_name,
                                                        make_uvicorn_server)

    from inflight.entrypoints.openai.serving_lora import LoRAModels, parse_lora_module

    limits = limits_from_args(args)  # before loading: a bad --chat-template fails fast
    lora_modules = [parse_lora_module(m) for m in args.lora_modules]
    if lora_modules and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    lora = LoRAModels.from_modules(lora_modules) if args.enable_lora else None
    http = http_options_from_args(args)
    kwargs = engine_kwargs_from_args(args)
    kwargs["model"] = args.model
    names = args.served_model_name or [default_model_name(args.model)]
    model_name = kwargs["served_model_name"] = names[0]
    if kwargs.get("data_parallel_size", 1) > 1:
        from inflight.engine.dp import DPEngineClient

        async_engine = DPEngineClient(kwargs, kwargs["data_parallel_size"])
    else:
        async_engine = AsyncLLMEngine.from_factory(lambda: _loaded(LLMEngine.from_kwargs(**kwargs), lora))
    engine = async_engine.engine
    state = build_state(async_engine, model_name, api_key=args.api_key,
                        max_waiting_requests=args.max_waiting_requests,
                        log_stats=not args.disable_log_stats, log_interval_s=args.log_stats_interval,
                        limits=limits, response_role=args.response_role, log_requests=args.enable_log_requests,
                        max_log_len=args.max_log_len, model_aliases=names[1:],
                        force_include_usage=args.enable_force_include_usage, lora=lora)
    app = build_app(state, shutdown_grace_s=args.shutdown_timeout, health_stall_timeout_s=args.health_stall_timeout,
                    http=http)
    server = make_uvicorn_server(app, args.host, args.port, log_level=args.uvicorn_log_level,
                                 shutdown_grace_s=args.shutdown_timeout, **uvicorn_kwargs(http))
    logger.info("serving %s as %r on http://%s:%d/v1", engine.model_source, model_name, args.host, args.port)
    # uvicorn re-raises the signal that stopped it once it has shut down, through the
    # handlers it found installed; no-op ones make a graceful stop exit with status 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if server.exit_code:
        logger.error("server stopped after an engine crash (exit status %d)", server.exit_code)
    else:
        logger.info("server stopped")
    return server.exit_code


def _loaded(engine, lora) -> object:
    """The engine with --lora-modules' adapters loaded and checked (a bad one stops the start).
    NOTE: called on the step thread, as the model's load: torch ops on another thread
    would start a second OpenMP pool, and every later step would pay for it."""
    for req in (lora.adapters.values() if lora is not None else ()):
        engine.add_lora(req)
    return engine

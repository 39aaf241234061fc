"""``vllm serve``'s HTTP-level flags: CORS, a proxy's root path, TLS, the API docs pages,
request logging, the chat answer's role, and flags accepted for compatibility only."""
from __future__ import annotations

import argparse
import json
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any, Optional

logger = logging.getLogger(__name__)


@dataclass
class HttpOptions:
    """What the app and uvicorn are built with besides the limits."""

    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    root_path: Optional[str] = None
    disable_fastapi_docs: bool = False
    ssl: dict[str, Any] = field(default_factory=dict)  # uvicorn's ssl_* settings


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value


def add_http_args(p: argparse.ArgumentParser) -> None:
    """The flags, spelled and defaulted as in ``vllm serve``."""
    d = HttpOptions()
    p.add_argument("--allowed-origins", type=_json_list, default=d.allowed_origins,
                   help='CORS: origins browsers may call from, as JSON (default ["*"], as vLLM)')
    p.add_argument("--allowed-methods", type=_json_list, default=d.allowed_methods, help="CORS: allowed methods")
    p.add_argument("--allowed-headers", type=_json_list, default=d.allowed_headers, help="CORS: allowed headers")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    p.add_argument("--root-path", default=None, help="the path prefix a proxy serves the API under")
    p.add_argument("--disable-fastapi-docs", action="store_true", help="no /docs, /redoc or /openapi.json")
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key")
    p.add_argument("--ssl-certfile", default=None, help="... and this certificate")
    p.add_argument("--ssl-ca-certs", default=None, help="CA certificates to verify clients against")
    p.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE),
                   help="whether clients need a certificate (0 none, 1 optional, 2 required)")
    p.add_argument("--response-role", default="assistant", help="the role of chat answers (default assistant)")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="log each request: its id, prompt (cut to --max-log-len) and sampling params")
    p.add_argument("--max-log-len", type=int, default=None, help="characters and token ids of a logged prompt")
    p.add_argument("--enable-force-include-usage", action="store_true",
                   help="end every streamed answer with a usage chunk, asked for or not")
    p.add_argument("--enable-server-load-tracking", action="store_true",
                   help="accepted as `vllm serve` spells it: /load always reports the requests the engine holds")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="accepted as older `vllm serve` spells it: requests are not logged by default")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted as `vllm serve` spells it: inflight never runs code shipped with a model")


def http_options_from_args(args: argparse.Namespace) -> HttpOptions:
    """HttpOptions from parsed flags."""
    tls = {"ssl_keyfile": args.ssl_keyfile, "ssl_certfile": args.ssl_certfile, "ssl_ca_certs": args.ssl_ca_certs,
           "ssl_cert_reqs": args.ssl_cert_reqs}
    return HttpOptions(allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
                       allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials,
                       root_path=args.root_path, disable_fastapi_docs=args.disable_fastapi_docs,
                       ssl=tls if args.ssl_keyfile or args.ssl_certfile else {})


def install_http_options(app: Any, options: HttpOptions) -> None:
    """CORS on ``app`` (the docs pages are FastAPI's constructor arguments, TLS and the root path uvicorn's)."""
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins, allow_methods=options.allowed_methods,
                       allow_headers=options.allowed_headers, allow_credentials=options.allow_credentials)


def fastapi_kwargs(options: HttpOptions) -> dict[str, Any]:
    """FastAPI's constructor arguments for the docs pages."""
    return dict(openapi_url=None, docs_url=None, redoc_url=None) if options.disable_fastapi_docs else {}


def uvicorn_kwargs(options: HttpOptions) -> dict[str, Any]:
    """uvicorn's settings for TLS and the root path."""
    return {**options.ssl, **({"root_path": options.root_path} if options.root_path else {})}


def log_request(request_id: str, prompts: list[Any], params: Any, max_len: Optional[int]) -> None:
    """vLLM's request log line: the prompts (text and ids, cut to ``max_len``) and the params."""
    for p in prompts:
        text, ids = (p.get("prompt"), p.get("prompt_token_ids")) if isinstance(p, dict) else (p, None)
        if max_len is not None:
            text, ids = text[:max_len] if text else text, ids[:max_len] if ids else ids
        logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s", request_id, text, params, ids)

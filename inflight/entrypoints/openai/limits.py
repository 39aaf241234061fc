"""The server's limits on what one request or connection may cost, and their flags.

Every limit is named in the error a client gets when it breaks one, so the
client can tell what to change.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

# Fixed caps (not flags): each bounds work done for one request on a shared thread.
MAX_PROMPTS_PER_REQUEST = 256
MAX_TOKENIZE_CHARS = 1_000_000
MAX_DETOKENIZE_TOKENS = 131_072
MAX_QUOTED_CHARS = 200


@dataclass
class ServerLimits:
    """Per-request and per-connection limits of the HTTP server."""

    max_n: int = 16
    max_request_body_bytes: int = 8 * 1024 * 1024
    max_header_bytes: int = 32 * 1024
    max_concurrent_requests: Optional[int] = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    timeout_keep_alive: int = 5
    tokenizer_timeout_s: float = 20.0
    chat_template: Optional[str] = None
    allow_special_tokens_in_content: bool = False
    tool_call_parser: str = "hermes"
    reasoning_parser: Optional[str] = None
    exclude_tools_when_tool_choice_none: bool = False


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """Flags for ServerLimits (vLLM's spelling where vLLM has the flag)."""
    d = ServerLimits()
    p.add_argument("--max-n", type=int, default=d.max_n, help=f"largest `n` a request may ask for (default {d.max_n})")
    p.add_argument("--max-request-body-bytes", type=int, default=d.max_request_body_bytes,
                   help="413 for larger request bodies (default 8 MiB)")
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes,
                   help="431 for larger request headers, all together (default 32 KiB)")
    p.add_argument("--max-concurrent-requests", type=int, default=d.max_concurrent_requests,
                   help="answer 503 + Retry-After while this many HTTP requests are in flight "
                        "(/health, /metrics and /version exempt; 0: no limit; default 1024)")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                   help="close a connection whose request headers take longer than this (seconds)")
    p.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                   help="408 when a request body takes longer than this to arrive (seconds)")
    p.add_argument("--timeout-keep-alive", type=int, default=d.timeout_keep_alive,
                   help="close idle keep-alive connections after this many seconds")
    p.add_argument("--tokenizer-timeout", type=float, default=d.tokenizer_timeout_s,
                   help="503 when rendering the chat template and tokenizing take longer (seconds)")
    p.add_argument("--chat-template", default=None,
                   help="the chat template: a Jinja file or the template itself (default: the model's)")
    p.add_argument("--allow-special-tokens-in-content", action="store_true",
                   help="let special-token text in message content (e.g. <|im_start|>) become control tokens "
                        "(default: tokenized as plain text, so users cannot forge turns)")
    from inflight.entrypoints.openai.tool_parsers import ToolParserManager

    p.add_argument("--tool-call-parser", default=d.tool_call_parser, choices=sorted(ToolParserManager.tool_parsers),
                   help=f"how tool calls are read from the output (default {d.tool_call_parser})")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='accepted as in `vllm serve`; tool_choice "auto" is always on here, '
                        "its calls read by --tool-call-parser")
    from inflight.reasoning import REASONING_PARSERS

    p.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                   help="split a thinking model's <think>...</think> from its chat answers into message.reasoning; "
                        "structured output then starts after the thinking (default: no parsing)")
    p.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help='leave the tools out of the prompt when tool_choice is "none" (default: shown, not parsed)')


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """ServerLimits from parsed flags; reads the --chat-template file if it names one."""
    template = args.chat_template
    if template is not None:
        template = load_chat_template(template)
    return ServerLimits(max_n=args.max_n, max_request_body_bytes=args.max_request_body_bytes,
                        max_header_bytes=args.max_header_bytes,
                        max_concurrent_requests=args.max_concurrent_requests or None,
                        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        timeout_keep_alive=args.timeout_keep_alive, tokenizer_timeout_s=args.tokenizer_timeout,
                        chat_template=template, allow_special_tokens_in_content=args.allow_special_tokens_in_content,
                        tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none)


def load_chat_template(value: str) -> str:
    """A template given as a path (read) or inline (as vLLM's --chat-template)."""
    import os

    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if not any(c in value for c in "{%"):
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    return value


def clip(value: Any, limit: int = MAX_QUOTED_CHARS) -> str:
    """``value`` as text fit to quote in an error: at most ``limit`` characters,
    lone surrogates escaped (they cannot be encoded as UTF-8)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

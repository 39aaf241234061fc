"""`inflight serve | generate | bench | simulate | trace | proxy`."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

DEMO_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for staying focused while studying.",
    "What is 12 times 7?",
]


def _add_generate(sub) -> None:
    from inflight.entrypoints.engine_args import add_engine_args

    p = sub.add_parser("generate", help="generate text offline for one or more prompts")
    p.add_argument("model", nargs="?", default=None, help="HF folder or .gguf (default: embedded SmolLM2)")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--demo", action="store_true", help="answer a few built-in chat questions")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", type=int, default=None, dest="sampling_seed")
    add_engine_args(p)


def run_generate(args: argparse.Namespace) -> int:
    from inflight import LLM, SamplingParams
    from inflight.entrypoints.engine_args import engine_kwargs_from_args

    if not args.prompt and not args.demo:
        print("inflight generate: give --prompt TEXT (repeatable) or --demo", file=sys.stderr)
        return 2
    kw = engine_kwargs_from_args(args)
    kw["model"] = args.model
    llm = LLM(**{k: v for k, v in kw.items() if k != "model"}, model=args.model)
    sp = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        max_tokens=args.max_tokens, seed=args.sampling_seed)
    prompts = args.prompt or DEMO_QUESTIONS
    if args.demo or args.chat:
        outs = llm.chat([[{"role": "user", "content": q}] for q in prompts], sp)
    else:
        outs = llm.generate(prompts, sp)
    for q, out in zip(prompts, outs):
        c = out.outputs[0]
        ttft = out.metrics.ttft if out.metrics else None
        print(f"\n>>> {q}\n{c.text.strip()}\n[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}"
              + (f", ttft={ttft:.2f}s" if ttft is not None else "") + "]")
    return 0


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``inflight`` parser; with ``command`` (one the CLI has), only that subcommand's:
    each subcommand's module is imported to add its flags, and ``serve`` should not wait
    for the proxy's and the benchmarks' imports (httpx, rich, ...)."""
    parser = argparse.ArgumentParser(prog="inflight", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    if command in (None, "generate"):
        _add_generate(sub)
    for mod, adder, name, runner in _SUBCOMMANDS:
        if command is not None and command != name:
            continue
        try:
            module = __import__(mod, fromlist=[adder])
        except ImportError:
            continue
        getattr(module, adder)(sub)
        if runner and name in sub.choices:
            sub.choices[name].set_defaults(handler=getattr(module, runner))
    if command is not None and command not in sub.choices:  # its module did not import
        return build_parser()
    return parser


def _command_of(argv: list[str]) -> Optional[str]:
    """The subcommand ``argv`` names first, where it is one of ours (else None: the full parser)."""
    known = {"generate", *(name for _, _, name, _ in _SUBCOMMANDS)}
    return argv[0] if argv and argv[0] in known else None


# (module, parser adder, command, runner); a module that sets its own handler names no runner.
_SUBCOMMANDS = (
    ("inflight.entrypoints.openai.cli_args", "add_serve_parser", "serve", None),
    ("inflight.sim.cli", "add_simulate_parser", "simulate", "run_simulate"),
    ("inflight.sim.cli", "add_trace_parser", "trace", "run_trace"),
    ("inflight.bench.cli", "add_bench_parser", "bench", None),
    ("inflight.entrypoints.proxy", "add_proxy_parser", "proxy", None),
)


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _guarded(run_generate, args)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"unknown command {args.command}")
    return _guarded(handler, args)


def _guarded(fn, args) -> int:
    """Known user errors print one line, not a traceback."""
    from inflight.loader import ModelLoadError

    try:
        return int(fn(args) or 0)
    except (ModelLoadError, ValueError) as e:
        print(f"inflight: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

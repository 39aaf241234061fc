"""``inflight bench serve``: streaming load against a running OpenAI-compatible server.

    inflight serve --max-num-seqs 16 &
    inflight bench serve --workload chat --num-requests 64 --request-rate 4 --goodput ttft:2000 tpot:200
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
from dataclasses import asdict
from typing import Any, Optional

from inflight.bench.client import ClientConfig, run_load
from inflight.bench.common import (add_workload_args, load_requests, make_report, make_run, parse_percentiles,
                                   workload_name, write_report)
from inflight.bench.metrics import DEFAULT_PERCENTILES, format_table, parse_goodput, summarize
from inflight.bench.workload import WorkloadRequest


def add_client_args(p: argparse.ArgumentParser) -> None:
    """Load-shape flags shared by ``bench serve`` and ``bench sweep``."""
    g = p.add_argument_group("load")
    g.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    g.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="mean requests per second (default inf: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of inter-arrival times: 1 Poisson, <1 burstier, >1 steadier")
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens per request (default on)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:2000 tpot:200 (keys: ttft, tpot, e2el)")
    g.add_argument("--warmup-requests", type=int, default=1, help="short untimed requests sent first")
    g.add_argument("--api-key", default=None)
    g.add_argument("--extra-body", type=json.loads, default={},
                   help='JSON merged into every request body, e.g. \'{"response_format": {"type": "json_object"}}\'')
    g.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take")
    g.add_argument("--disable-tqdm", action="store_true")


def add_serve_bench_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="streaming load client for an OpenAI-compatible server",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    add_client_args(p)
    add_workload_args(p)
    p.add_argument("--label", default=None, help="name of this run in the report (default: derived)")
    p.add_argument("--result-file", default=None, help="write the JSON report here")
    p.set_defaults(handler=run_bench_serve)
    return p


def client_config(args: argparse.Namespace, base_url: Optional[str] = None) -> ClientConfig:
    """The ClientConfig the flags describe."""
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be at least 1")
    return ClientConfig(base_url=base_url or args.base_url, model=args.model, endpoint=args.endpoint,
                        request_rate=args.request_rate, burstiness=args.burstiness,
                        max_concurrency=args.max_concurrency, ignore_eos=args.ignore_eos,
                        temperature=args.temperature, seed=args.seed, timeout_s=args.timeout,
                        api_key=args.api_key, warmup_requests=args.warmup_requests,
                        show_progress=not args.disable_tqdm, extra_body=dict(args.extra_body))


def bench_once(cfg: ClientConfig, requests: list[WorkloadRequest], label: str,
               slo: Optional[dict[str, float]] = None, percentiles=DEFAULT_PERCENTILES,
               extra_config: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Run one load and return its report run (config, summary, per-request records)."""
    result = asyncio.run(run_load(cfg, requests))
    summary = summarize(result.records, result.duration, slo, percentiles)
    config = {k: v for k, v in asdict(cfg).items() if k not in ("api_key", "show_progress")}
    config.update(model=result.model, num_requests=len(requests), goodput_slo_ms=slo or {}, started_at=result.started_at,
                  **(extra_config or {}))
    return make_run(label, "serve", config, summary, result.records)


def default_label(cfg: ClientConfig) -> str:
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}"
    conc = f" conc={cfg.max_concurrency}" if cfg.max_concurrency else ""
    return f"serve rate={rate}{conc}"


def run_bench_serve(args: argparse.Namespace) -> int:
    """Handler of ``inflight bench serve``."""
    percentiles = parse_percentiles(args.percentiles)
    slo = parse_goodput(args.goodput)
    cfg = client_config(args)
    requests = load_requests(args)
    label = args.label or default_label(cfg)
    run = bench_once(cfg, requests, label, slo, percentiles, {"workload": workload_name(args)})
    print(format_table(f"Serving benchmark: {label}", run["summary"], percentiles))
    failures = [r for r in run["requests"] if not r["success"]]
    for r in failures[:5]:
        print(f"  failed {r['id']}: {r['error']}")
    write_report(make_report([run], percentiles), args.result_file)
    return 1 if len(failures) == len(run["requests"]) else 0  # every request failed: an error

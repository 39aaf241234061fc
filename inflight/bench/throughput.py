"""``inflight bench throughput``: offline, every request queued at once, through the
engine that ``LLM.generate`` drives; tokens/s and per-request latencies.

    inflight bench throughput --workload decode --max-num-seqs 16 --compare

Latencies are what a caller of the engine sees: a request's first token counts
when a step hands it back, its completion when its final output is handed back.
Under static scheduling outputs are held until the whole batch ends, so there TTFT
and completion time are the batch's end, as with any request-level batching.
``--compare`` runs continuous, static (padded) and static without padding one
after another on the same model, flags and requests, and prints their ratios.
"""
from __future__ import annotations

import argparse
import gc
import time
from typing import Any, Optional

from inflight.bench.common import (add_workload_args, load_requests, make_report, make_run, parse_percentiles,
                                   workload_name, write_report)
from inflight.bench.metrics import DEFAULT_PERCENTILES, RequestRecord, format_table, summarize
from inflight.bench.workload import WorkloadRequest

# label -> engine overrides
MODES: dict[str, dict[str, Any]] = {
    "continuous": {"scheduling": "continuous"},
    "static": {"scheduling": "static", "static_padding": True},
    "static-nopad": {"scheduling": "static", "static_padding": False},
}


def add_throughput_parser(sub) -> argparse.ArgumentParser:
    from inflight.entrypoints.engine_args import add_engine_args

    p = sub.add_parser("throughput", help="offline throughput and latencies through the engine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, help="HF folder or .gguf (default: embedded SmolLM2)")
    add_workload_args(p, default="decode", engine_flags=True)
    p.add_argument("--compare", action="store_true",
                   help="run continuous, static and static-nopad in turn (ignores --scheduling)")
    p.add_argument("--modes", default=None, help=f"comma list of modes to run, from {', '.join(MODES)}")
    p.add_argument("--warmup-requests", type=int, default=2, help="short untimed requests run first")
    p.add_argument("--result-file", default=None, help="write the JSON report here")
    p.add_argument("--disable-tqdm", action="store_true")
    add_engine_args(p)
    p.set_defaults(handler=run_bench_throughput)
    return p


def record_step_outputs(outs, recs: dict[str, RequestRecord], last: dict[str, float], now: float) -> int:
    """Fold one step's RequestOutputs into their records (TTFT, inter-token gaps,
    end) at time ``now``; ``last`` holds each request's previous token time.
    Returns how many requests finished."""
    finished = 0
    for out in outs:
        rec = recs[out.request_id]
        if out.outputs[0].delta_token_ids or out.finished:
            if rec.ttft is None:
                rec.ttft = now - rec.start
            else:
                rec.itl.append(now - last[out.request_id])
            last[out.request_id] = now
        if out.finished:
            rec.e2e, rec.success = now - rec.start, True
            rec.output_tokens, rec.prompt_tokens = len(out.outputs[0].token_ids), len(out.prompt_token_ids)
            finished += 1
    return finished


def run_offline(llm, requests: list[WorkloadRequest], show_progress: bool = True,
                lora_requests: Optional[list] = None) -> tuple[list[RequestRecord], float]:
    """Queue every request at once, step the engine to the end; records in input order.
    ``lora_requests``: each request's LoRA adapter (or None)."""
    from tqdm.auto import tqdm

    from inflight import SamplingParams

    engine = llm.llm_engine
    recs = {f"bench-{i}": RequestRecord(id=r.id, prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens)
            for i, r in enumerate(requests)}
    last: dict[str, float] = {}
    bar = tqdm(total=len(requests), desc="Requests", dynamic_ncols=True, disable=not show_progress)
    t0 = time.perf_counter()
    for i, ((rid, rec), r) in enumerate(zip(recs.items(), requests)):
        lora = {"lora_request": lora_requests[i]} if lora_requests and lora_requests[i] is not None else {}
        engine.add_request(rid, r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True),
                           **lora)
        rec.start = time.perf_counter() - t0
    try:
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter() - t0
            bar.update(record_step_outputs(outs, recs, last, now))
    finally:
        bar.close()
        pending = [rid for rid, rec in recs.items() if not rec.success]
        if pending:
            engine.abort_request(pending)
    return list(recs.values()), time.perf_counter() - t0


def _warmup(llm, requests: list[WorkloadRequest], n: int) -> None:
    if n > 0:
        short = [WorkloadRequest(f"warmup-{i}", requests[i % len(requests)].prompt, 0, 4) for i in range(n)]
        run_offline(llm, short, show_progress=False)


def bench_mode(engine_kwargs: dict[str, Any], mode: str, requests: list[WorkloadRequest], warmup: int,
               percentiles=DEFAULT_PERCENTILES, show_progress: bool = True) -> dict[str, Any]:
    """Build an engine in ``mode``, run the workload once, return the report run."""
    from inflight import LLM

    kw = {**engine_kwargs, **MODES[mode]}
    llm = LLM(**kw)
    try:
        _warmup(llm, requests, warmup)
        started_at = time.time()
        records, wall = run_offline(llm, requests, show_progress)
    finally:
        del llm
        gc.collect()
    summary = summarize(records, wall, None, percentiles)
    summary["exact_output_tokens"] = float(all(r.output_tokens == r.max_tokens for r in records))
    config = {k: v for k, v in kw.items() if v is not None}
    config.update(mode=mode, num_requests=len(requests), started_at=started_at)
    return make_run(mode, "throughput", config, summary, records)


def _modes(args: argparse.Namespace) -> list[str]:
    if args.compare:
        return list(MODES)
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            raise ValueError(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
        return modes
    if args.scheduling == "static":
        return ["static" if args.static_padding else "static-nopad"]
    return ["continuous"]


def comparison_table(runs: list[dict[str, Any]]) -> str:
    """One line per mode: throughput, ratio to the first mode, TTFT / E2E percentiles."""
    base = runs[0]["summary"]["output_throughput"]
    head = f"{'mode':<14}{'out tok/s':>10}{'ratio':>7}{'TTFT p50':>10}{'TTFT p99':>10}" \
           f"{'TPOT p50':>10}{'TPOT p99':>10}{'E2E p50':>10}{'E2E p99':>10}  (ms)"
    lines = [head]
    for run in runs:
        s = run["summary"]
        lines.append(f"{run['label']:<14}{s['output_throughput']:>10.1f}{s['output_throughput'] / base:>7.2f}"
                     f"{s['ttft_p50_ms']:>10.0f}{s['ttft_p99_ms']:>10.0f}{s['tpot_p50_ms']:>10.1f}"
                     f"{s['tpot_p99_ms']:>10.1f}{s['e2el_p50_ms']:>10.0f}{s['e2el_p99_ms']:>10.0f}")
    return "\n".join(lines)


def run_bench_throughput(args: argparse.Namespace) -> int:
    """Handler of ``inflight bench throughput``."""
    from inflight.entrypoints.engine_args import engine_kwargs_from_args
    from inflight.loader import load_tokenizer

    percentiles = parse_percentiles(args.percentiles)
    kw = engine_kwargs_from_args(args)
    kw["model"] = args.model
    modes = _modes(args)
    tokenizer = None if args.workload_file else load_tokenizer(args.tokenizer or args.model)
    requests = load_requests(args, tokenizer)
    runs = []
    for mode in modes:
        run = bench_mode(kw, mode, requests, args.warmup_requests, percentiles, not args.disable_tqdm)
        run["config"]["workload"] = workload_name(args)
        print(format_table(f"Offline throughput: {mode}", run["summary"], percentiles))
        runs.append(run)
    if len(runs) > 1:
        print(comparison_table(runs))
    write_report(make_report(runs, percentiles), args.result_file)
    bad = [r["label"] for r in runs if r["summary"]["failed"] or not r["summary"]["exact_output_tokens"]]
    if bad:
        print(f"WARNING: incomplete or inexact outputs in: {', '.join(bad)}")
    return 1 if bad else 0

"""Beam search served by inflight and by vLLM's CPU build, in one sitting: the same SmolLM2
weights, `POST /v1/completions` with `"use_beam_search": true` (`n` is the beam width).

    .venv/bin/python benchmarks/peers/beam_search.py --out benchmarks/results/peers_vllm_beam_search.json
    .venv/bin/python benchmarks/peers/beam_search.py --num-requests 2 --repeats 1  # a check

Every request at once: --num-requests prompts of 16-64 tokens, each a search of width
--beam-width for up to --max-tokens tokens. Both servers are up for the whole sitting;
--repeats rounds with prompts new to both (the same for both), the order reversed every
round; medians. `--ignore-eos` makes both run every round (vLLM always does; inflight
otherwise stops a search once no live beam can beat the finished ones). The two servers'
beams for the same prompt are compared (equal texts, best first).
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import httpx  # noqa: E402

from compare import apply_isa_cap  # noqa: E402
from embeddings import (alternating_rounds, make_inputs, medians_into, report, sitting_parser,  # noqa: E402
                        sitting_summary)
from servers import SERVED_NAME  # noqa: E402


async def run_once(url: str, prompts: list[str], width: int, max_tokens: int, ignore_eos: bool) -> dict:
    """Every search at once: searches/s, output tokens/s, latency percentiles, the beams' texts."""
    lat, tokens, out_tokens, beams = [], 0, 0, {}

    async def one(client: httpx.AsyncClient, i: int, prompt: str) -> None:
        nonlocal tokens, out_tokens
        body = {"model": SERVED_NAME, "prompt": prompt, "n": width, "max_tokens": max_tokens,
                "use_beam_search": True, "ignore_eos": ignore_eos, "temperature": 0.0}
        t0 = time.perf_counter()
        r = await client.post("/v1/completions", json=body)
        r.raise_for_status()
        lat.append(time.perf_counter() - t0)
        usage = r.json()["usage"]
        tokens += usage["prompt_tokens"]
        out_tokens += usage["completion_tokens"]
        beams[i] = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        await one(client, -1, "warm up")
        lat.clear()
        tokens = out_tokens = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i, p) for i, p in enumerate(prompts)))
        duration = time.perf_counter() - t0
    return {"searches_per_s": len(prompts) / duration, "output_tokens_per_s": out_tokens / duration,
            **sitting_summary(lat, tokens, duration), "beams": [beams[i] for i in range(len(prompts))]}


def parse_args():
    ap = sitting_parser(__doc__)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ignore-eos", action="store_true")
    args = ap.parse_args()
    apply_isa_cap(args)
    args.systems = [s for s in args.systems.split(",") if s]
    args.vllm_preload, args.baseline, args.baseline_args = True, None, ""
    return args


def main() -> int:
    args = parse_args()
    results, runs = alternating_rounds(
        args, lambda tmp: [make_inputs(args.num_requests, (16, 64), 3000 + rnd, tmp) for rnd in range(args.repeats)],
        lambda url, prompts: run_once(url, prompts, args.beam_width, args.max_tokens, args.ignore_eos),
        lambda r: (f"{r['searches_per_s']:.2f} searches/s, {r['output_tokens_per_s']:.0f} out tok/s, "
                   f"p50 {r['latency_p50_s']:.2f} s, p99 {r['latency_p99_s']:.2f} s"))
    medians_into(results, runs, "beams")
    if len(args.systems) == 2:
        a, b = (runs[s] for s in args.systems)
        pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra["beams"], rb["beams"])]
        results["same_best_beam"] = sum(x[0] == y[0] for x, y in pairs) / len(pairs)
        results["same_beams"] = sum(x == y for x, y in pairs) / len(pairs)
        results["ratio_searches_per_s"] = (results["runs"]["inflight"]["median"]["searches_per_s"]
                                           / results["runs"]["vllm"]["median"]["searches_per_s"])
    return report(results, args.out, ("runs", "same_best_beam", "same_beams", "ratio_searches_per_s"))


if __name__ == "__main__":
    sys.exit(main())

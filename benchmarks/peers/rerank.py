"""A cross-encoder reranker served by inflight and by vLLM's CPU build, in one sitting:
SmolLM2-135M with a random one-label classifier head (`LlamaForSequenceClassification`,
which both serve as a pooling model), over `POST /rerank`.

    .venv/bin/python benchmarks/peers/rerank.py --out benchmarks/results/peers_vllm_rerank.json

The reranker folder is made once from make_hf_folder.py's (the head seeded, so both servers
load the same weights). Every request at once: --num-requests queries of 8-32 tokens, each
with --docs-per-request documents of 64-256 tokens; each pair is one prompt. Both servers
are up for the whole sitting; --repeats rounds with new texts (the same for both), the order
reversed every round; medians. The two servers' scores for the same request are compared.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import httpx  # noqa: E402

from embeddings import (alternating_rounds, make_inputs, medians_into, report, sitting_args,  # noqa: E402
                        sitting_parser, sitting_summary)
from make_hf_folder import DEFAULT_OUT as DEFAULT_HF_FOLDER  # noqa: E402
from servers import SERVED_NAME  # noqa: E402


def make_reranker(hf_folder: str, out: str) -> str:
    """``hf_folder``'s model with a one-label classifier head (seeded), saved to ``out`` once."""
    if not os.path.isfile(os.path.join(out, "config.json")):
        import torch
        import transformers

        torch.manual_seed(0)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(hf_folder, num_labels=1,
                                                                                dtype=torch.float32)
        model.config.pad_token_id = model.config.eos_token_id
        model.config.id2label, model.config.label2id = {0: "relevant"}, {"relevant": 0}
        model.save_pretrained(out)
        transformers.AutoTokenizer.from_pretrained(hf_folder).save_pretrained(out)
    return out


async def run_once(url: str, requests: list[dict]) -> dict:
    """Every rerank request at once; pairs/s, prompt tok/s, latency percentiles, the scores."""
    lat, tokens, scores = [], 0, {}

    async def one(client: httpx.AsyncClient, i: int, body: dict) -> None:
        nonlocal tokens
        t0 = time.perf_counter()
        r = await client.post("/rerank", json={"model": SERVED_NAME, **body})
        r.raise_for_status()
        lat.append(time.perf_counter() - t0)
        tokens += r.json()["usage"]["prompt_tokens"]
        scores[i] = {x["index"]: x["relevance_score"] for x in r.json()["results"]}

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        await one(client, -1, {"query": "warm up", "documents": ["a", "b"]})
        lat.clear()
        tokens = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i, b) for i, b in enumerate(requests)))
        duration = time.perf_counter() - t0
    pairs = sum(len(b["documents"]) for b in requests)
    return {"pairs_per_s": pairs / duration, **sitting_summary(lat, tokens, duration),
            "scores": [scores[i] for i in range(len(requests))]}


def parse_args() -> argparse.Namespace:
    ap = sitting_parser(__doc__)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--docs-per-request", type=int, default=8)
    ap.add_argument("--max-doc-tokens", type=int, default=256,
                    help="the longest document, in the embedded tokenizer's tokens (a pair must fit the model)")
    ap.add_argument("--reranker-folder", default=DEFAULT_HF_FOLDER.rstrip("/") + "-reranker")
    args = sitting_args(ap)
    # both serve the reranker folder (vLLM's --model, inflight's positional model)
    args.hf_folder = args.inflight_model = make_reranker(args.hf_folder, args.reranker_folder)
    return args


def main() -> int:
    args = parse_args()

    def make_rounds(tmp: str) -> list:
        rounds, k = [], args.docs_per_request
        for rnd in range(args.repeats):
            queries = make_inputs(args.num_requests, (8, 32), 1000 + rnd, tmp)
            docs = make_inputs(args.num_requests * k, (64, args.max_doc_tokens), 2000 + rnd, tmp)
            rounds.append([{"query": q, "documents": docs[i * k:(i + 1) * k]} for i, q in enumerate(queries)])
        return rounds

    results, runs = alternating_rounds(
        args, make_rounds, run_once,
        lambda r: (f"{r['pairs_per_s']:.1f} pairs/s, {r['prompt_tokens_per_s']:.0f} tok/s, "
                   f"p50 {r['latency_p50_s']:.2f} s, p99 {r['latency_p99_s']:.2f} s"))
    medians_into(results, runs, "scores")
    if len(args.systems) == 2:
        a, b = (runs[s] for s in args.systems)
        results["max_score_difference"] = max(abs(x[d] - y[d]) for ra, rb in zip(a, b)
                                              for x, y in zip(ra["scores"], rb["scores"]) for d in x)
        results["ratio_pairs_per_s"] = (results["runs"]["inflight"]["median"]["pairs_per_s"]
                                        / results["runs"]["vllm"]["median"]["pairs_per_s"])
    return report(results, args.out, ("runs", "max_score_difference", "ratio_pairs_per_s"))


if __name__ == "__main__":
    sys.exit(main())

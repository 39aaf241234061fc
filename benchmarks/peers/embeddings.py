"""Embeddings served by inflight and by vLLM's CPU build, in one sitting: both as pooling
models (`--runner pooling`: the last token's final hidden state, L2-normalized) of the same
SmolLM2 weights, over `POST /v1/embeddings`.

    .venv/bin/python benchmarks/peers/embeddings.py --out benchmarks/results/peers_vllm_embeddings.json
    .venv/bin/python benchmarks/peers/embeddings.py --num-docs 8 --num-queries 8 --repeats 1  # a check

Two workloads, every request sent at once: `docs`, documents of 128-512 tokens, 16 to a
request (indexing a corpus for retrieval, as OpenAI's clients batch inputs), and `queries`,
texts of 8-32 tokens, one to a request (the questions asked of it). Both servers are up for
the whole sitting; each round runs every workload on both, the order reversed from one
workload to the next, with texts new to both servers (the same for both: so no round is
served from a prefix cache), and the table gives medians over --repeats rounds. The embeddings of the two
servers are compared too (cosine similarity, the same weights in the same dtype). Run
setup_vllm.sh and make_hf_folder.py first (README.md here). `--cap-isa avx2` runs the
sitting as on an AVX2+FMA CPU, as compare.py does.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import httpx  # noqa: E402

from compare import ISA_CAPS, apply_isa_cap, start_server  # noqa: E402
from cpu_serving import workload_file  # noqa: E402
from make_hf_folder import DEFAULT_OUT as DEFAULT_HF_FOLDER  # noqa: E402
from servers import DEFAULT_VLLM_VENV, SERVED_NAME, cpu_facts  # noqa: E402

from inflight.bench.common import json_safe, machine_info  # noqa: E402

WORKLOADS = {"docs": (128, 512), "queries": (8, 32)}  # token lengths, uniform
PER_REQUEST = {"docs": 16, "queries": 1}  # inputs in one request


def make_inputs(n: int, lengths: tuple[int, int], seed: int, tmp: str) -> list[str]:
    """``n`` texts of the given token lengths, cut from the longprompt workload's words."""
    from inflight.loader import load_tokenizer

    tok = load_tokenizer()
    words = " ".join(json.loads(line)["prompt"] for line in open(workload_file("longprompt", tmp))).split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        want, start = rng.randint(*lengths), rng.randrange(len(words) - 1000)
        text = " ".join(words[start:start + want])  # a word is at least one token: cut down from here
        ids = tok(text, add_special_tokens=False).input_ids[:want]
        out.append(tok.decode(ids))
    return out


async def run_once(url: str, texts: list[str], per_request: int = 1) -> dict:
    """Every request at once, ``per_request`` texts each; throughput and latency percentiles."""
    lat: list[float] = []
    tokens = 0

    async def one(client: httpx.AsyncClient, text) -> None:
        nonlocal tokens
        t0 = time.perf_counter()
        r = await client.post("/v1/embeddings", json={"model": SERVED_NAME, "input": text, "encoding_format": "float"})
        r.raise_for_status()
        lat.append(time.perf_counter() - t0)
        tokens += r.json()["usage"]["prompt_tokens"]

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        await one(client, "warm up")
        lat.clear()
        tokens = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, texts[i:i + per_request]) for i in range(0, len(texts), per_request)))
        duration = time.perf_counter() - t0
    return {"inputs_per_s": len(texts) / duration, **sitting_summary(lat, tokens, duration)}


def sitting_summary(latencies: list[float], tokens: int, duration: float) -> dict:
    """Duration, prompt tokens (per second) and the requests' latency p50 and p99."""
    lat = sorted(latencies)
    return {"duration_s": duration, "prompt_tokens_per_s": tokens / duration, "prompt_tokens": tokens,
            "latency_p50_s": lat[len(lat) // 2], "latency_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def embeddings_of(url: str, texts: list[str]):
    import torch

    r = httpx.post(url + "/v1/embeddings", json={"model": SERVED_NAME, "input": texts}, timeout=600)
    r.raise_for_status()
    return torch.tensor([d["embedding"] for d in r.json()["data"]])


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def sitting_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a sitting of pooling servers (this script's and rerank.py's)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="vllm,inflight")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", DEFAULT_VLLM_VENV))
    ap.add_argument("--hf-folder", default=DEFAULT_HF_FOLDER)
    ap.add_argument("--vllm-dtype", default=None, choices=["float32", "bfloat16"],
                    help="vLLM's --dtype (default: what inflight's \"auto\" resolves to on this CPU)")
    ap.add_argument("--vllm-args", default="", help="more flags for vLLM's server")
    ap.add_argument("--inflight-args", default="", help="more flags for `inflight serve`")
    ap.add_argument("--inflight-model", default=None,
                    help="the model `inflight serve` loads (default: the embedded GGUF, SmolLM2 as the HF folder)")
    ap.add_argument("--idle-after-start", type=float, default=30.0)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--cap-isa", default=None, choices=sorted(ISA_CAPS),
                    help="run both servers as on a CPU with only this ISA (compare.py's --cap-isa)")
    return ap


def sitting_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed flags, with what servers.py reads: both servers run as pooling models."""
    args = ap.parse_args()
    apply_isa_cap(args)
    args.systems = [s for s in args.systems.split(",") if s]
    args.vllm_args = f"--runner pooling {args.vllm_args}"
    args.inflight_args = f"--runner pooling {args.inflight_args}"
    args.vllm_preload, args.baseline, args.baseline_args = True, None, ""
    return args


def start_servers(args: argparse.Namespace, log_dir: str, stack: contextlib.ExitStack, results: dict) -> dict:
    """Every system's server, up until ``stack`` closes, then idle for --idle-after-start; their URLs."""
    urls = {}
    for system in args.systems:
        rec = start_server(system, args, log_dir, stack)
        urls[system] = rec.pop("url")
        results["systems"][system] = rec
    time.sleep(args.idle_after_start)
    return urls


def alternating_rounds(args: argparse.Namespace, make_rounds: Callable[[str], list],
                       run: Callable[[str, Any], dict], line: Callable[[dict], str]) -> tuple[dict, dict]:
    """A sitting of one workload (rerank.py's, beam_search.py's): every system's server up for
    the whole of it, each round's inputs (``make_rounds(tmp)``: one entry a round) run on every
    system, the order reversed every round, a line each on stderr. Returns the results' header
    and each system's runs."""
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "argv": sys.argv, "cpu": cpu_facts(),
                     "machine": machine_info(), "vllm_dtype": args.vllm_dtype, "systems": {}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log_dir = os.path.splitext(os.path.abspath(args.out))[0] + "-logs" if args.out else tmp
        os.makedirs(log_dir, exist_ok=True)
        rounds = make_rounds(tmp)
        urls = start_servers(args, log_dir, stack, results)
        runs: dict = {s: [] for s in args.systems}
        for rnd, inputs in enumerate(rounds):
            for system in (args.systems if rnd % 2 == 0 else args.systems[::-1]):
                r = asyncio.run(run(urls[system], inputs))
                runs[system].append(r)
                print(f"[{system}] round {rnd}: {line(r)}", file=sys.stderr, flush=True)
    return results, runs


def medians_into(results: dict, runs: dict, drop: str) -> None:
    """Each system's runs (without the ``drop`` field) and their medians into ``results``."""
    for system, rs in runs.items():
        plain = [{k: v for k, v in r.items() if k != drop} for r in rs]
        results["runs"][system] = {"median": median_of(plain), "runs": plain}


def report(results: dict, out: str | None, keys: tuple[str, ...]) -> int:
    """Print ``keys`` of ``results`` and write it all to ``out`` (if given); 0."""
    print(json.dumps({k: results[k] for k in keys if k in results}, indent=1, default=str)[:3000])
    if out:
        with open(out, "w") as f:
            json.dump(json_safe(results), f, indent=1, allow_nan=False)
    return 0


def parse_args() -> argparse.Namespace:
    ap = sitting_parser(__doc__)
    ap.add_argument("--num-docs", type=int, default=256)
    ap.add_argument("--num-queries", type=int, default=512)
    ap.add_argument("--max-doc-tokens", type=int, default=WORKLOADS["docs"][1],
                    help="the longest document (a BERT's positions end at 512)")
    return sitting_args(ap)


def main() -> int:
    args = parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "argv": sys.argv, "cpu": cpu_facts(),
                     "machine": machine_info(), "isa_cap": ISA_CAPS.get(args.cap_isa), "vllm_dtype": args.vllm_dtype,
                     "inputs_per_request": PER_REQUEST, "systems": {}, "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log_dir = os.path.splitext(os.path.abspath(args.out))[0] + "-logs" if args.out else tmp
        os.makedirs(log_dir, exist_ok=True)
        sizes = {"docs": args.num_docs, "queries": args.num_queries}
        # new texts every round (each server has its own cache: both get the same ones)
        lengths = {**WORKLOADS, "docs": (WORKLOADS["docs"][0], args.max_doc_tokens)}
        inputs = {name: [make_inputs(sizes[name], lengths[name], 100 * rnd + i, tmp) for rnd in range(args.repeats)]
                  for i, name in enumerate(WORKLOADS)}
        urls = start_servers(args, log_dir, stack, results)
        runs: dict = {(w, s): [] for w in inputs for s in args.systems}
        for rnd in range(args.repeats):
            for i, name in enumerate(inputs):
                order = args.systems if (rnd + i) % 2 == 0 else args.systems[::-1]
                for system in order:
                    r = asyncio.run(run_once(urls[system], inputs[name][rnd], PER_REQUEST[name]))
                    runs[(name, system)].append(r)
                    print(f"[{system}] {name} round {rnd}: {r['inputs_per_s']:.1f} inputs/s, "
                          f"{r['prompt_tokens_per_s']:.0f} tok/s, p99 {r['latency_p99_s']:.2f} s",
                          file=sys.stderr, flush=True)
        for name in inputs:
            per = results["workloads"][name] = {s: {"median": median_of(runs[(name, s)]), "runs": runs[(name, s)]}
                                                for s in args.systems}
            if "vllm" in per and "inflight" in per:
                per["ratio_inputs_per_s"] = (per["inflight"]["median"]["inputs_per_s"]
                                             / per["vllm"]["median"]["inputs_per_s"])
        if len(urls) == 2:
            import torch
            a, b = (embeddings_of(urls[s], inputs["docs"][0][:16]) for s in args.systems)
            results["min_cosine_between_systems"] = torch.nn.functional.cosine_similarity(a, b).min().item()
    print(table(results, args.systems))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(json_safe(results), f, indent=1, allow_nan=False)
    return 0


def table(results: dict, systems: list[str]) -> str:
    lines = ["| workload | " + " | ".join(f"{s}: inputs/s, tok/s, p50 s, p99 s" for s in systems) + " | ratio |",
             "|---|" + "---|" * (len(systems) + 1)]
    for name, per in results["workloads"].items():
        cells = [f"{m['inputs_per_s']:.1f}, {m['prompt_tokens_per_s']:.0f}, {m['latency_p50_s']:.2f}, "
                 f"{m['latency_p99_s']:.2f}" for m in (per[s]["median"] for s in systems)]
        ratio = per.get("ratio_inputs_per_s")
        lines.append(f"| {name} | " + " | ".join(cells) + (f" | {ratio:.2f}x |" if ratio else " | |"))
    if "min_cosine_between_systems" in results:
        lines.append("\nmin cosine similarity between the systems' embeddings: "
                     f"{results['min_cosine_between_systems']:.5f}")
    lines.append("start-up: " + ", ".join(f"{s} {results['systems'][s]['startup_s']:.1f} s" for s in systems))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""Prefill/decode disaggregation against one colocated instance on the same cores.

    python benchmarks/disagg.py [--model M] [--cores 0,1] [--chat-rate 1.0] [--long-every 4]
                                [--num-chat 64] [--num-long 8] [--out out/disagg.json]

Mixed load: the chat workload as a Poisson stream plus a longprompt request every
``--long-every`` seconds. Runs:

* ``colocated``: one ``inflight serve`` on every core of ``--cores``;
* ``disagg``: a prefill instance (kv_producer) on the first half of the cores, a decode
  instance (kv_consumer) on the rest, ``inflight proxy`` in front (on a 2-core machine:
  one core each, against one instance on both).

Reports the chat requests' decode TPOT p50/p99 and TTFT per run (the target: TPOT p99
with disaggregation, where long prefills no longer stall the decode batch), and the
transfer cost, milliseconds per 1,000 prompt tokens moved, from a separate
in-process pull loop (a producer engine on its own step thread, a consumer pulling
prompts of ``--transfer-tokens`` tokens). Needs a quiet machine; ``--num-chat 4
--num-long 1 --max-tokens 8`` is a smoke run. Workloads come from
``--workload-dir`` (../shared/workloads) when present, else from the generator.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from typing import Optional

import httpx

from inflight.bench.client import ClientConfig, run_load
from inflight.bench.metrics import summarize
from inflight.bench.workload import WorkloadRequest, generate, load_jsonl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], cores: list[int]) -> subprocess.Popen:
    """Start ``cmd`` pinned to ``cores`` (taskset, where it exists) with one OpenMP thread each."""
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores))}
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", ",".join(map(str, cores))] + cmd
    return subprocess.Popen(cmd, env=env)


def serve_cmd(args: argparse.Namespace, port: int, kv: Optional[dict] = None) -> list[str]:
    cmd = [sys.executable, "-m", "inflight.entrypoints.cli", "serve"] + ([args.model] if args.model else [])
    cmd += ["--port", str(port), "--dtype", args.dtype, "--disable-log-stats", "--uvicorn-log-level", "warning"]
    if args.kv_cache_memory:
        cmd += ["--kv-cache-memory", str(args.kv_cache_memory)]
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    return cmd


def wait_healthy(url: str, procs: list[subprocess.Popen], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a server exited during start-up")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def workloads(args: argparse.Namespace) -> tuple[list[WorkloadRequest], list[WorkloadRequest]]:
    """(chat, longprompt) requests, ``max_tokens`` capped at ``--max-tokens``."""
    def load(name: str, n: int) -> list[WorkloadRequest]:
        path = os.path.join(args.workload_dir, f"{name}.jsonl")
        if os.path.exists(path):
            reqs = load_jsonl(path)
        else:
            from inflight.loader import load_model
            reqs = generate(name, load_model(args.model).tokenizer)
        reqs = reqs[:n]
        return [replace(r, max_tokens=min(r.max_tokens, args.max_tokens)) for r in reqs] if args.max_tokens else reqs

    return load("chat", args.num_chat), load("longprompt", args.num_long)


async def mixed_load(url: str, args: argparse.Namespace, chat, long) -> dict:
    base = ClientConfig(base_url=url, show_progress=False, seed=args.seed)
    chat_cfg = replace(base, request_rate=args.chat_rate)
    long_cfg = replace(base, request_rate=1.0 / args.long_every, burstiness=100.0)  # nearly regular
    res_chat, res_long = await asyncio.gather(run_load(chat_cfg, chat), run_load(long_cfg, long))
    return {"chat": summarize(res_chat.records, res_chat.duration),
            "longprompt": summarize(res_long.records, res_long.duration)}


def run_colocated(args: argparse.Namespace, cores: list[int], chat, long) -> dict:
    port = free_port()
    procs = [launch(serve_cmd(args, port), cores)]
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, procs)
        return asyncio.run(mixed_load(url, args, chat, long))
    finally:
        stop(procs)


def run_disagg(args: argparse.Namespace, cores: list[int], chat, long) -> dict:
    half = max(len(cores) // 2, 1)
    p_port, d_port, x_port = free_port(), free_port(), free_port()
    procs = [launch(serve_cmd(args, p_port, {"kv_role": "kv_producer", "kv_port": 0}), cores[:half]),
             launch(serve_cmd(args, d_port, {"kv_role": "kv_consumer"}), cores[half:] or cores)]
    try:
        urls = [f"http://127.0.0.1:{p}" for p in (p_port, d_port)]
        for u in urls:
            wait_healthy(u, procs)
        procs.append(subprocess.Popen([sys.executable, "-m", "inflight.entrypoints.cli", "proxy", "--prefill",
                                       urls[0], "--decode", urls[1], "--port", str(x_port)]))
        url = f"http://127.0.0.1:{x_port}"
        wait_healthy(url, procs)
        return asyncio.run(mixed_load(url, args, chat, long))
    finally:
        stop(procs)


def transfer_cost(args: argparse.Namespace) -> dict:
    """Milliseconds per 1,000 prompt tokens pulled from a producer on its own step thread."""
    from inflight.engine.async_engine import AsyncLLMEngine
    from inflight.engine.llm_engine import LLMEngine
    from inflight.sampling_params import SamplingParams

    kw = dict(model=args.model, dtype=args.dtype, kv_cache_memory=args.kv_cache_memory or 2**30)
    producer = AsyncLLMEngine.from_factory(lambda: LLMEngine.from_kwargs(
        **kw, kv_transfer_config={"kv_role": "kv_producer", "kv_port": 0}))
    producer.start()
    consumer = LLMEngine.from_kwargs(**kw, kv_transfer_config={"kv_role": "kv_consumer"},
                                     enable_prefix_caching=False)
    conn = producer.engine.kv_connector
    n, vocab = args.transfer_tokens, consumer.arch.vocab_size
    warm: dict = {}
    for i in range(args.transfer_repeats + 1):  # the first pull also connects the pair: not counted
        if i == 1:
            warm = consumer.stats()
        prompt = [(100 + i * 31 + j * 7) % vocab for j in range(n)]
        rid = f"t{i}"
        prefill = SamplingParams(temperature=0, max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        producer.call_sync(lambda eng, p=prompt, r=rid: eng.add_request(r, p, prefill))
        while rid not in conn.held:
            time.sleep(0.005)
        kv = conn.kv_transfer_params(rid)
        consumer.add_request(f"c{i}", prompt, SamplingParams(temperature=0, max_tokens=1,
                                                             extra_args={"kv_transfer_params": kv}))
        while consumer.has_unfinished_requests():
            consumer.step()
    s = {k: v - warm.get(k, 0) for k, v in consumer.stats().items()}
    stopper = asyncio.new_event_loop()
    stopper.run_until_complete(producer.shutdown())
    tokens, seconds = s["kv_transfer_tokens"], s["kv_transfer_seconds"]
    return {"pulls": s["kv_transfer_pulls"], "failures": s["kv_transfer_failures"], "tokens_moved": tokens,
            "ms_per_1000_tokens": 1e6 * seconds / tokens if tokens else math.nan}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-memory", type=int, default=None)
    ap.add_argument("--cores", default=None, help="CPU cores to use, e.g. 0,1 (default: all)")
    ap.add_argument("--workload-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                           "workloads"))
    ap.add_argument("--num-chat", type=int, default=64)
    ap.add_argument("--num-long", type=int, default=8)
    ap.add_argument("--chat-rate", type=float, default=1.0, help="chat requests per second (Poisson)")
    ap.add_argument("--long-every", type=float, default=4.0, help="seconds between longprompt requests")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap every request's max_tokens")
    ap.add_argument("--transfer-tokens", type=int, default=2000)
    ap.add_argument("--transfer-repeats", type=int, default=5)
    ap.add_argument("--runs", default="colocated,disagg,transfer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    runs = args.runs.split(",")
    chat, long = workloads(args) if {"colocated", "disagg"} & set(runs) else ([], [])
    result: dict = {"cores": cores, "num_chat": len(chat), "num_long": len(long)}
    if "colocated" in runs:
        result["colocated"] = run_colocated(args, cores, chat, long)
    if "disagg" in runs:
        result["disagg"] = run_disagg(args, cores, chat, long)
    if "transfer" in runs:
        result["transfer"] = transfer_cost(args)
    for name in ("colocated", "disagg"):
        if name in result:
            c = result[name]["chat"]
            print(f"{name:>10}: chat TPOT p50 {c['tpot_p50_ms']:.1f} ms, p99 {c['tpot_p99_ms']:.1f} ms; "
                  f"TTFT p50 {c['ttft_p50_ms']:.0f} ms, p99 {c['ttft_p99_ms']:.0f} ms; "
                  f"{c['completed']}/{c['num_requests']} completed")
    if "transfer" in result:
        t = result["transfer"]
        print(f"  transfer: {t['ms_per_1000_tokens']:.2f} ms per 1,000 prompt tokens "
              f"({t['pulls']} pulls, {t['tokens_moved']} tokens, {t['failures']} failures)")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

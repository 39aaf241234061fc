"""CPU serving benchmark: every request of a workload sent at once to
`inflight serve`, streaming, ignore_eos; output tok/s, TTFT/TPOT p99 and model
FLOPs utilisation against the matmul peak, in the dtype the server runs, measured
in the same run (the higher of a burst just before and one just after each workload):
MFU by the convention of 2 x every parameter per token processed, and MFU* by the FLOPs
the work needs (needed_flops).

    python benchmarks/cpu_serving.py [--workloads chat decode longprompt prefix] [--out out/cpu_serving.json]

Workloads are read from ../shared/workloads/NAME.jsonl when present, else built by
the project's generator (same shapes). Extra server flags go after `--`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

from inflight.bench.sweep import free_port, wait_healthy
from inflight.bench.workload import load_jsonl

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads")
DEFAULT_SERVER_FLAGS: list[str] = []  # the defaults a newcomer runs


def _median_rate(matmul, n: int, repeats: int, warmup_s: float) -> float:
    """GFLOP/s of ``matmul`` (an n x n x n product), the median of ``repeats`` calls after
    ``warmup_s`` of calls (the first ones run at a fraction of the steady rate)."""
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        matmul()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        matmul()
        rates.append(2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def matmul_peak_gflops(n: int = 2048, repeats: int = 20, warmup_s: float = 1.0,
                       dtype: torch.dtype | None = None) -> float:
    """The GEMM rate this machine reaches now on a large square product in ``dtype``
    (default: what dtype "auto" picks here: bf16 with bf16 units, else fp32): the faster of
    torch's matmul and inflight's own packed GEMM, since torch's can miss a CPU's widest
    vectors (on an AMD Zen 5, torch's fp32 matmul ran well below our fp32 GEMM, and vLLM's
    MFU against it read over 100%)."""
    from inflight.kernels.cpu.packing import packed_linear_class
    if dtype is None:
        from inflight.platforms import current_platform
        dtype = current_platform("cpu").resolve_dtype("auto")
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    rates = [_median_rate(lambda: a @ b, n, repeats, warmup_s)]
    linear_class = packed_linear_class(dtype)
    if linear_class is not None:
        linear = linear_class(b, None)
        with torch.inference_mode():
            rates.append(_median_rate(lambda: linear(a), n, repeats, warmup_s))
    return max(rates)


def prefix_cache_hits(url: str) -> float:
    """Prompt tokens the server has served from its prefix cache since it started (they cost
    no FLOPs): inflight's counter, or vLLM's (``vllm:prefix_cache_hits_total``, in tokens)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("inflight:prefix_cache_hits_total", "prefix_cache_hits_total",
                                   "vllm:prefix_cache_hits_total")))


def flops_per_token(hf_config: dict) -> float:
    """2 x the parameters each processed token passes through (projections, MLP, lm_head)."""
    h, i, n = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["num_hidden_layers"]
    heads, kv = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    d = hf_config.get("head_dim") or h // heads
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * i
    return 2.0 * (n * per_layer + hf_config["vocab_size"] * h)


def needed_flops(hf_config: dict, requests: list[tuple[int, int]], hits: float) -> float:
    """The FLOPs that serving ``requests`` ((prompt tokens, output tokens) each) takes at the
    least, where flops_per_token's convention counts 2 x every parameter for every token:
    the layers' projections for each token computed (the prompt's and each output token's
    but the last, less the ``hits`` prompt tokens a prefix cache served), lm_head only where a
    token is sampled (once per output token: no other position needs logits), and attention's
    two products (QK^T, PV) over each computed token's keys (causal, no sliding window). The
    hits are taken as an even share of every request's first prompt tokens."""
    h, i, n = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["num_hidden_layers"]
    heads, kv = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    d = hf_config.get("head_dim") or h // heads
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * i
    share = hits / len(requests) if requests else 0.0
    total = 0.0
    for prompt, output in requests:
        first, end = min(share, prompt), prompt + output - 1  # positions [first, end) computed
        keys = (end * (end + 1) - first * (first + 1)) / 2  # the position t reads t + 1 keys
        total += 2 * n * per_layer * (end - first) + 2 * hf_config["vocab_size"] * h * output + 4 * n * heads * d * keys
    return total


def add_mfu(s: dict, hits: float, peaks: list[float], fpt: float, hf_config: dict,
            requests: list[tuple[int, int]]) -> None:
    """A run's summary ``s`` gets its model FLOPs utilisation against the matmul peak measured
    around it (the higher of the bursts ``peaks``: a low burst would inflate MFU): MFU by
    2 x every parameter per token processed (``fpt``), MFU* by the FLOPs the work needs
    (needed_flops over ``requests``' prompt and output lengths; left out where a prompt's
    length is unknown, < 0). The ``hits`` prompt tokens the prefix cache served cost no FLOPs."""
    peak = max(peaks)
    tokens = s["total_input_tokens"] + s["total_output_tokens"] - hits
    s.update(matmul_peak_gflops=peak, matmul_peak_gflops_bursts=peaks, prefix_cache_hit_tokens=hits,
             tokens_processed=tokens, mfu=tokens * fpt / s["duration_s"] / (peak * 1e9))
    if requests and min(p for p, _ in requests) >= 0:
        s["mfu_needed"] = needed_flops(hf_config, requests, hits) / s["duration_s"] / (peak * 1e9)


def median_summary(runs: list[dict]) -> dict:
    """One record for repeated runs of a workload on one server: each number the median over
    the runs (TTFT p99's is the median of the runs' p99s) but ``failed``, their sum (a median
    would hide a run's failures), a field that is not a number kept where every run has it
    alike, and the runs themselves under "runs". One run is itself."""
    if len(runs) == 1:
        return runs[0]
    out: dict = {}
    for key in runs[0]:
        vals = [r.get(key) for r in runs]
        if key == "failed":
            out[key] = sum(vals)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[key] = statistics.median(vals)
        elif all(v == vals[0] for v in vals):
            out[key] = vals[0]
    out.update(repeats=len(runs), runs=runs)
    return out


def workload_file(name: str, tmp: str) -> str:
    path = os.path.join(SHARED, f"{name}.jsonl")
    if os.path.exists(path):
        return path
    from inflight.bench.workload import generate, save_jsonl
    from inflight.loader import load_tokenizer
    out = os.path.join(tmp, f"{name}.jsonl")
    save_jsonl(generate(name, load_tokenizer()), out)
    return out


def run_workload(name: str, server_flags: list[str], tmp: str, inflight_bin: str,
                 server_pythonpath: str | None = None) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    if server_pythonpath:  # serve another checkout's code (a before/after comparison)
        env["PYTHONPATH"] = server_pythonpath
    proc = subprocess.Popen([sys.executable, "-m", "inflight.entrypoints.cli", "serve", "--port", str(port),
                             *server_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            cwd=server_pythonpath)  # `-m` puts the working directory first on sys.path
    try:
        wait_healthy(url, proc, timeout=300)
        result = os.path.join(tmp, f"{name}.json")
        subprocess.run([inflight_bin, "bench", "serve", "--base-url", url, "--workload-file", workload_file(name, tmp),
                        "--ignore-eos", "--disable-tqdm", "--result-file", result, "--label", name],
                       check=True, stdout=sys.stderr)
        with open(result) as f:
            summary = json.load(f)["runs"][0]["summary"]
        summary["prefix_cache_hit_tokens"] = prefix_cache_hits(url)
        return summary
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["chat", "decode", "longprompt", "prefix"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--server-pythonpath", default=None,
                    help="run the server from this checkout (e.g. a `git worktree` of an older commit)")
    ap.add_argument("server_flags", nargs="*", help="flags for `inflight serve` (after --)")
    args = ap.parse_args()
    flags = args.server_flags or DEFAULT_SERVER_FLAGS
    inflight_bin = os.path.join(os.path.dirname(sys.executable), "inflight")
    from inflight.loader import load_model
    hf_config = load_model(None).hf_config
    fpt = flops_per_token(hf_config)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "server_flags": flags,
               "flops_per_token": fpt, "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            # NOTE: one burst of matmuls hit by another tenant reads low, and a low peak
            # inflates MFU; a burst before and one after the workload, the higher taken,
            # keeps the MFU conservative.
            peaks = [matmul_peak_gflops()]
            s = run_workload(name, flags, tmp, inflight_bin, args.server_pythonpath)
            peaks.append(matmul_peak_gflops())
            reqs = [(r.prompt_tokens, r.max_tokens) for r in load_jsonl(workload_file(name, tmp))]
            add_mfu(s, s["prefix_cache_hit_tokens"], peaks, fpt, hf_config, reqs)
            results["workloads"][name] = s
            tokens, peak = s["tokens_processed"], s["matmul_peak_gflops"]
            print(f"{name:>10}: {s['output_throughput']:7.1f} out tok/s  TTFT p99 {s['ttft_p99_ms'] / 1e3:6.1f} s  "
                  f"TPOT p99 {s['tpot_p99_ms'] / 1e3:5.2f} s  {tokens / s['duration_s']:6.0f} proc tok/s  "
                  f"MFU {s['mfu']:.0%}, MFU* {s.get('mfu_needed', float('nan')):.0%} (peak {peak:.0f} GFLOP/s)",
                  flush=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

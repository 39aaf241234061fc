"""inflight against vLLM's CPU build and llama.cpp's server, in one sitting, on the same workloads
and client.

    .venv/bin/python benchmarks/peers/compare.py --out benchmarks/results/peers-vllm.json
    .venv/bin/python benchmarks/peers/compare.py --workloads chat --num-requests 4 --max-tokens-cap 16  # a check
    .venv/bin/python benchmarks/peers/compare.py --systems llamacpp,inflight --out ...  # against llama.cpp

Each system gets one server (vLLM first, then inflight, by --systems), started on
a free local port; its start-up time is from process start to the first /health
200. By default each server runs every workload and stops before the next starts;
`--interleave` starts them all first and runs each workload on every server in
turn, vLLM first on the first workload, inflight first on the next and so on, so
that a host whose speed drifts over the sitting (a shared VM's does) weighs on
both sides of each ratio alike. Every workload (../shared/workloads/NAME.jsonl, else the project's generator)
then runs against it with `inflight bench`'s streaming client: every request at
once (or --max-concurrency at a time), ignore_eos, temperature 0, one short untimed warm-up
request first. `--repeats N` runs each workload N times on each server (interleaved: the
order flips every run) and reports each figure's median over them; the runs and each
repeat's ratio stay in the JSON. Run benchmarks/peers/setup_vllm.sh and make_hf_folder.py first, or
setup_llamacpp.sh for llama.cpp (README.md here).
Server logs go to OUT-logs/ beside --out (else a temporary folder, removed).

`--cap-isa avx2` runs the whole sitting as on an AVX2+FMA CPU, on a CPU with more
(AVX-512): inflight's kernels at that level, torch's own kernels, oneDNN and MKL capped
there too (ISA_CAPS), for both servers and for the matmul peak, and vLLM loads its AVX2
kernel build (cap_avx2/sitecustomize.py). `--cap-isa avx512` does the same as on an
AVX-512F CPU without bf16, VNNI or AMX (Skylake-SP's set; vLLM's `_C_AVX512` build). A
check of those figures where no such host is at hand; the caches and memory stay the host's.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: cpu_serving's workload lookup
sys.path.insert(0, HERE)  # servers.py beside this file, wherever it is started from

from cpu_serving import (add_mfu, flops_per_token, matmul_peak_gflops, median_summary,  # noqa: E402
                         prefix_cache_hits, workload_file)
from make_hf_folder import DEFAULT_OUT as DEFAULT_HF_FOLDER  # noqa: E402
from servers import DEFAULT_LLAMA_SERVER, DEFAULT_VLLM_VENV, SERVED_NAME, SERVERS, cpu_facts, version_of  # noqa: E402

from inflight.bench.client import ClientConfig  # noqa: E402
from inflight.bench.common import json_safe, machine_info  # noqa: E402
from inflight.bench.serve import bench_once  # noqa: E402
from inflight.bench.sweep import ServerProcess, free_port  # noqa: E402
from inflight.bench.workload import load_jsonl  # noqa: E402

WORKLOADS = ["chat", "decode", "longprompt", "prefix"]
# The variables that cap each library's vector ISA: inflight's kernels (kernels/cpu/isa.py),
# torch's vectorized ops, oneDNN (torch's mkldnn linears, vLLM's GEMM) and MKL (torch's sgemm).
ISA_CAPS = {"avx2": {"INFLIGHT_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
            "avx512": {"INFLIGHT_CPU_ISA": "avx512", "ATEN_CPU_CAPABILITY": "avx512",
                       "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"}}


def load_workloads(args: argparse.Namespace, tmp: str) -> dict:
    """name -> requests, cut to --num-requests and capped at --max-tokens-cap."""
    out = {}
    for name in args.workloads:
        reqs = load_jsonl(workload_file(name, tmp))[:args.num_requests or None]
        if args.max_tokens_cap:
            reqs = [dataclasses.replace(r, max_tokens=min(r.max_tokens, args.max_tokens_cap)) for r in reqs]
        out[name] = reqs
    return out


def start_server(system: str, args: argparse.Namespace, log_dir: str, stack: contextlib.ExitStack) -> dict:
    """Start one server (it stops when ``stack`` closes) and time its start-up; returns
    its record, with the URL under "url"."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd, extra_env = SERVERS[system](args, port)
    log = os.path.join(log_dir, f"server-{system}.log")
    # `env K=V ... cmd`: the variables reach the server (ServerProcess takes no env) and
    # the logged command is the whole recipe; env execs, so the PID is the server's.
    argv = ["env", *(f"{k}={v}" for k, v in extra_env.items()), *cmd] if extra_env else cmd
    print(f"[{system}] starting: {shlex.join(argv)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    stack.enter_context(ServerProcess(argv, url, log, args.startup_timeout))  # returns once /health says 200
    startup_s = time.monotonic() - t0
    print(f"[{system}] healthy after {startup_s:.1f} s (log: {log})", file=sys.stderr, flush=True)
    return {"command": cmd, "env": extra_env, "version": version_of(args, system), "startup_s": startup_s,
            "log": log, "url": url}


def run_workload(system: str, url: str, name: str, reqs: list, args: argparse.Namespace) -> dict:
    """One workload against a running server: the client's summary, with MFU."""
    cfg = ClientConfig(base_url=url, model=args.model_name or SERVED_NAME, ignore_eos=True, temperature=0.0,
                       warmup_requests=1, show_progress=False, max_concurrency=args.max_concurrency)
    # the peak in the dtype the server computes in: vLLM's --dtype, inflight's "auto". None for
    # llama.cpp: it computes on the GGUF's quantized weights, whose rate no float matmul bounds,
    # and its /metrics counts no prefix-cache hits.
    counts_hits = system != "llamacpp"
    mfu = args.mfu and counts_hits
    peak_dtype = getattr(torch, args.vllm_dtype) if system == "vllm" else None
    peaks = [matmul_peak_gflops(dtype=peak_dtype)] if mfu else []
    hits = prefix_cache_hits(url) if counts_hits else 0.0  # the counter runs from start-up
    s = bench_once(cfg, reqs, f"{system} {name}", extra_config={"workload": name})["summary"]
    if counts_hits:
        s["prefix_cache_hit_tokens"] = prefix_cache_hits(url) - hits
    if mfu:
        peaks.append(matmul_peak_gflops(dtype=peak_dtype))
        add_mfu(s, s["prefix_cache_hit_tokens"], peaks, args.flops_per_token, args.hf_config,
                [(r.prompt_tokens, r.max_tokens) for r in reqs])
    print(f"[{system}] {name}: {s['output_throughput']:.1f} out tok/s, {s['failed']:.0f} failed, "
          f"{s['duration_s']:.1f} s", file=sys.stderr, flush=True)
    return s


def run_sitting(systems: list[str], args: argparse.Namespace, workloads: dict, log_dir: str, results: dict) -> None:
    """Every workload on every system, --repeats times, into ``results`` (each system's record
    the median of its runs, median_summary). By default one server at a time, all workloads
    each; with --interleave every server up at once and each workload run on all of them back
    to back, the order reversed from one run of a workload to the next, so that a drift of the
    host's speed falls on both sides of every ratio alike."""
    runs: dict = {(name, system): [] for name in workloads for system in systems}

    def run(system: str, url: str, name: str) -> None:
        done = runs[name, system]
        done.append(run_workload(system, url, name, workloads[name], args))
        # NOTE: a server keeps a run's prompts in its prefix cache until other work evicts them:
        # a repeat that finds them there measures a warm cache, not the workload's prefill
        if len(done) > 1 and done[-1].get("prefix_cache_hit_tokens", 0) > done[0].get("prefix_cache_hit_tokens", 0):
            done[-1]["warm_prefix_cache"] = True
            print(f"[{system}] {name}: WARNING this run found {done[-1]['prefix_cache_hit_tokens']:.0f} prompt "
                  f"tokens in the prefix cache against {done[0]['prefix_cache_hit_tokens']:.0f} in the first: an "
                  "earlier run cached its prompts (run other workloads between repeats)", file=sys.stderr, flush=True)
        results["workloads"][name][system] = record = median_summary(done)
        if warm := sum(bool(r.get("warm_prefix_cache")) for r in done):
            record["warm_prefix_cache_runs"] = warm

    if not args.interleave:
        for system in systems:
            with contextlib.ExitStack() as stack:
                server = start_server(system, args, log_dir, stack)
                results["systems"][system] = {k: v for k, v in server.items() if k != "url"}
                time.sleep(args.idle_after_start)  # a server started before its traffic arrives
                for _ in range(args.repeats):
                    for name in workloads:
                        run(system, server["url"], name)
        return
    with contextlib.ExitStack() as stack:
        servers = {system: start_server(system, args, log_dir, stack) for system in systems}
        for system, server in servers.items():
            results["systems"][system] = {k: v for k, v in server.items() if k != "url"}
        time.sleep(args.idle_after_start)
        for rep in range(args.repeats):
            for i, name in enumerate(workloads):
                for system in (systems if (i + rep) % 2 == 0 else systems[::-1]):
                    run(system, servers[system]["url"], name)
            add_ratios(results)
            write_results(results, args.out)  # a sitting cut short keeps its finished repeats


def table(results: dict, systems: list[str]) -> str:
    """Per workload, one row per system, then inflight / vLLM of output tok/s."""
    lines = [f"{'workload':<11}{'system':<10}{'out tok/s':>10}{'TTFT p50 s':>11}{'TTFT p99 s':>11}"
             f"{'TPOT p50 ms':>12}{'TPOT p99 ms':>12}{'failed':>7}{'MFU':>6}{'MFU*':>6}"]
    for name, per_system in results["workloads"].items():
        for system in systems:
            s = per_system.get(system)
            if s:
                lines.append(f"{name:<11}{system:<10}{s['output_throughput']:>10.1f}{s['ttft_p50_ms'] / 1e3:>11.2f}"
                             f"{s['ttft_p99_ms'] / 1e3:>11.2f}{s['tpot_p50_ms']:>12.1f}{s['tpot_p99_ms']:>12.1f}"
                             f"{s['failed']:>7.0f}" + "".join(f"{s[k]:>6.0%}" for k in ("mfu", "mfu_needed") if k in s))
        for key, peer in (("ratio_output_throughput", "vLLM"), ("ratio_llamacpp", "llama.cpp"),
                          ("ratio_baseline", "baseline")):
            if key in per_system:
                each = per_system.get(key + "_runs")
                lines.append(f"{name:<11}{'ratio':<10}{per_system[key]:>9.2f}x  (inflight / {peer})" +
                             (f"; runs {', '.join(f'{r:.2f}' for r in each)}" if each else ""))
    lines.append("start-up (process start -> /health 200): " + ", ".join(
        f"{sys_} {results['systems'][sys_]['startup_s']:.1f} s" for sys_ in systems if sys_ in results["systems"]))
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    """The command line, checked; re-executes this script under --cap-isa's environment."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list (default: all four)")
    ap.add_argument("--num-requests", type=int, default=None, help="first N requests of each workload (a check)")
    ap.add_argument("--max-tokens-cap", type=int, default=None, help="cap every max_tokens (a check)")
    ap.add_argument("--max-concurrency", type=int, default=None,
                    help="requests in flight at most (default: every request at once); 1 times one user's stream")
    ap.add_argument("--systems", default="vllm,inflight", help="comma list, run in this order")
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", DEFAULT_VLLM_VENV))
    ap.add_argument("--hf-folder", default=DEFAULT_HF_FOLDER, help="made by make_hf_folder.py")
    ap.add_argument("--vllm-preload", action=argparse.BooleanOptionalAction, default=True,
                    help="LD_PRELOAD tcmalloc and libiomp5 for vLLM, as its CPU guide says (default on)")
    ap.add_argument("--vllm-args", default="", help="more flags for vLLM's server, one string")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", DEFAULT_LLAMA_SERVER),
                    help="llama.cpp's server binary, for the 'llamacpp' system (setup_llamacpp.sh builds it)")
    ap.add_argument("--llamacpp-model", default=None, help="the GGUF llama-server loads (default: the embedded one)")
    ap.add_argument("--llamacpp-parallel", type=int, default=32,
                    help="llama-server's slots (-np; default 32), each with its own 4,096 tokens of KV")
    ap.add_argument("--llamacpp-args", default="", help="more flags for llama-server, one string")
    ap.add_argument("--inflight-args", default="", help="more flags for `inflight serve`, one string")
    ap.add_argument("--inflight-model", default=None,
                    help="the model `inflight serve` loads (default: the embedded GGUF), e.g. the --hf-folder")
    ap.add_argument("--model-name", default=None,
                    help="the model the client asks for (default: the served name; e.g. a LoRA adapter's name)")
    ap.add_argument("--baseline", default=None, help="checkout for the 'baseline' system (e.g. a git worktree)")
    ap.add_argument("--baseline-args", default="", help="more flags for the baseline's server only, one string")
    ap.add_argument("--vllm-dtype", default=None, choices=["float32", "bfloat16"],
                    help="vLLM's --dtype (default: what inflight's \"auto\" resolves to on this CPU)")
    ap.add_argument("--mfu", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the fp32 matmul peak around each workload and report MFU")
    ap.add_argument("--idle-after-start", type=float, default=0.0,
                    help="seconds each server sits idle after /health before its first workload")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each workload on each server; each figure the median over them")
    ap.add_argument("--interleave", action="store_true",
                    help="all servers up at once, each workload on each in turn (order reversed every workload)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds a server may take to be healthy")
    ap.add_argument("--cap-isa", default=None, choices=sorted(ISA_CAPS),
                    help="run both servers and the peak as on a CPU with only this ISA (see above)")
    args = ap.parse_args()
    apply_isa_cap(args)
    args.workloads = [w for w in args.workloads.split(",") if w]
    systems = [s for s in args.systems.split(",") if s]
    if args.mfu:  # the model's FLOPs per token, read once (loading the model config reads the weights' cache)
        from inflight.loader import load_model
        args.hf_config = load_model(None).hf_config
        args.flops_per_token = flops_per_token(args.hf_config)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if unknown := [s for s in systems if s not in SERVERS]:
        ap.error(f"unknown system(s) {unknown}; choose from {list(SERVERS)}")
    if "vllm" in systems and not os.path.isfile(os.path.join(args.hf_folder, "config.json")):
        ap.error(f"no HF folder at {args.hf_folder}: run benchmarks/peers/make_hf_folder.py first")
    if "llamacpp" in systems and not os.access(args.llama_server, os.X_OK):
        ap.error(f"no llama-server at {args.llama_server}: run benchmarks/peers/setup_llamacpp.sh first")
    args.systems = systems
    return args


def apply_isa_cap(args: argparse.Namespace) -> None:
    """Run as on a CPU of ``args.cap_isa`` (re-executing under its variables), and default
    ``args.vllm_dtype`` to what inflight's "auto" resolves to there."""
    if args.cap_isa and any(os.environ.get(k) != v for k, v in ISA_CAPS[args.cap_isa].items()):
        # NOTE: torch, MKL and oneDNN read their caps when loaded: start again with them set
        # (the servers inherit this environment).
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **ISA_CAPS[args.cap_isa]})
    if args.vllm_dtype is None:
        from inflight.platforms import current_platform
        args.vllm_dtype = str(current_platform("cpu").resolve_dtype("auto")).removeprefix("torch.")


def add_ratios(results: dict) -> None:
    """inflight's output throughput over vLLM's, llama.cpp's and the baseline's, per workload
    (of the medians, with repeats; each repeat's own ratio under KEY_runs as well)."""
    keys = {"vllm": "ratio_output_throughput", "llamacpp": "ratio_llamacpp", "baseline": "ratio_baseline"}
    for per_system in results["workloads"].values():
        for peer, key in keys.items():
            if peer in per_system and "inflight" in per_system and per_system[peer]["output_throughput"]:
                ours, theirs = per_system["inflight"], per_system[peer]
                per_system[key] = ours["output_throughput"] / theirs["output_throughput"]
                if "runs" in ours and "runs" in theirs:
                    per_system[key + "_runs"] = [a["output_throughput"] / b["output_throughput"]
                                                 for a, b in zip(ours["runs"], theirs["runs"])]


def write_results(results: dict, out: str | None) -> None:
    """The sitting's results as JSON at ``out`` (nowhere when None)."""
    if out:
        with open(out, "w") as f:
            json.dump(json_safe(results), f, indent=1, allow_nan=False)


def main() -> int:
    args = parse_args()
    systems = args.systems
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "argv": sys.argv, "cpu": cpu_facts(),
               "machine": machine_info(), "client": {"request_rate": "inf", "max_concurrency": args.max_concurrency,
                                                     "ignore_eos": True, "stream": True,
                                                     "temperature": 0.0, "warmup_requests": 1},
               "isa_cap": ISA_CAPS.get(args.cap_isa), "num_requests": args.num_requests,
               "max_tokens_cap": args.max_tokens_cap, "repeats": args.repeats, "systems": {},
               "workloads": {name: {} for name in args.workloads}}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = os.path.splitext(os.path.abspath(args.out))[0] + "-logs" if args.out else tmp
        os.makedirs(log_dir, exist_ok=True)
        workloads = load_workloads(args, tmp)
        run_sitting(systems, args, workloads, log_dir, results)
        add_ratios(results)
        print(table(results, systems))
    write_results(results, args.out)
    if args.out:
        print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

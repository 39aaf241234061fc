"""Data parallelism on the prefix workload: `inflight serve` with one engine process
against `--data-parallel-size N` (each replica its share of the cores), the same
requests sent by `inflight bench serve`; output tok/s, TTFT/TPOT and, per replica,
the router's decisions and the prefix-cache hit rate read from /metrics.

    python benchmarks/dp_prefix.py [--dp 1 2] [--workload prefix] [--num-requests 96] \\
        [--out out/dp_prefix.json] [-- extra server flags]

Run it on a quiet machine: every configuration shares the same cores in turn.
`--num-requests 8 --model tiny.gguf` makes a quick check that it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

from inflight.bench.sweep import ServerProcess, free_port

INFLIGHT = [sys.executable, "-m", "inflight.entrypoints.cli"]


def per_replica(metrics_text: str) -> dict[str, dict[str, float]]:
    """engine index -> routed requests by reason, prefix-cache queries and hits."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    wanted = {"inflight:router_requests_total": "routed_", "inflight:prefix_cache_queries_total": "queries",
              "inflight:prefix_cache_hits_total": "hits"}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            key = wanted.get(s.name)
            if key is None:
                continue
            row = out.setdefault(s.labels.get("engine", "0"), {})
            name = key + s.labels["reason"] if key == "routed_" else key
            row[name] = row.get(name, 0.0) + s.value
    return out


def run_one(dp: int, args: argparse.Namespace, server_flags: list[str], workdir: str) -> dict:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = INFLIGHT + ["serve"] + ([args.model] if args.model else []) + ["--port", str(port),
                                                                         "--disable-log-stats"]
    cmd += (["--data-parallel-size", str(dp)] if dp > 1 else []) + server_flags
    result_file = os.path.join(workdir, f"dp{dp}.json")
    with ServerProcess(cmd, base_url, os.path.join(workdir, f"server_dp{dp}.log"), args.startup_timeout):
        bench = INFLIGHT + ["bench", "serve", "--base-url", base_url, "--workload", args.workload,
                            "--label", f"dp={dp}", "--result-file", result_file, "--disable-tqdm"]
        if args.num_requests:
            bench += ["--num-requests", str(args.num_requests)]
        if args.model:
            bench += ["--tokenizer", args.model]
        subprocess.run(bench, check=True)
        with urllib.request.urlopen(base_url + "/metrics") as r:
            replicas = per_replica(r.read().decode())
    with open(result_file) as f:
        run = json.load(f)["runs"][0]
    run["replicas"] = replicas
    return run


def main() -> int:
    argv = sys.argv[1:]
    server_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, nargs="+", default=[1, 2], help="data_parallel_size values to compare")
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: the embedded SmolLM2)")
    p.add_argument("--workload", default="prefix")
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="write every run (with per-replica counters) here as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        runs = [run_one(dp, args, server_flags, workdir) for dp in args.dp]
    print(f"\n{'config':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9}  per replica "
          "(routed prefix/load/balance, prefix hit rate)")
    for run in runs:
        s = run["summary"]
        cells = []
        for engine, row in sorted(run["replicas"].items()):
            rate = row.get("hits", 0.0) / row["queries"] if row.get("queries") else 0.0
            cells.append(f"#{engine}: {row.get('routed_prefix', 0):.0f}/{row.get('routed_load', 0):.0f}/"
                         f"{row.get('routed_balance', 0):.0f}, {100 * rate:.0f}%")
        print(f"{run['label']:>8} {s['output_throughput']:10.1f} {s['ttft_p50_ms']:9.0f} {s['ttft_p99_ms']:9.0f} "
              f"{s['tpot_p50_ms']:9.1f}  " + "; ".join(cells))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
        print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

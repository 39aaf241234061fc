"""Markdown tables from `inflight bench` reports (the tables of benchmarks/README.md).

    python benchmarks/results_table.py out/offline-decode-mns16.json out/offline-decode-mns64.json
    python benchmarks/results_table.py --knee out/knee/sweep.json

Each run's throughput ratio is against the first run of its report file (the
continuous one, for `bench throughput --compare` and `bench sweep --schedulings
continuous,static`, at the same max_num_seqs).
"""
from __future__ import annotations

import argparse
import json
import sys


def _s(ms) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}"


def _ms(ms) -> str:
    return "-" if ms is None else f"{ms:.0f}"


def _setting(run: dict, key: str):
    cfg = run["config"]
    return cfg.get("server", {}).get(key, cfg.get(key))


def compare_rows(paths: list[str]) -> list[str]:
    rows = ["| workload | max_num_seqs | scheduling | output tok/s | vs continuous | TTFT p50 / p99 (s) "
            "| TPOT p50 / p99 (ms) | E2E p50 / p99 (s) |", "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        runs = json.load(open(path))["runs"]
        for run in runs:
            s = run["summary"]
            base = next((r["summary"]["output_throughput"] for r in runs
                         if _setting(r, "max_num_seqs") == _setting(run, "max_num_seqs")), s["output_throughput"])
            rows.append(f"| {run['config'].get('workload', '')} | {_setting(run, 'max_num_seqs')} | "
                        f"{run['config'].get('mode') or _setting(run, 'scheduling')} | "
                        f"{s['output_throughput']:.0f} | {s['output_throughput'] / base:.2f}x | "
                        f"{_s(s['ttft_p50_ms'])} / {_s(s['ttft_p99_ms'])} | "
                        f"{_ms(s['tpot_p50_ms'])} / {_ms(s['tpot_p99_ms'])} | "
                        f"{_s(s['e2el_p50_ms'])} / {_s(s['e2el_p99_ms'])} |")
    return rows


def knee_rows(paths: list[str]) -> list[str]:
    rows = ["| max_num_seqs | output tok/s | total tok/s | TPOT p50 / p99 (ms) | ITL p99 (ms) "
            "| TTFT p50 / p99 (s) | goodput (req/s) |", "|---|---|---|---|---|---|---|"]
    for path in paths:
        for run in json.load(open(path))["runs"]:
            s = run["summary"]
            good = "-" if s.get("goodput") is None else f"{s['goodput']:.2f}"
            rows.append(f"| {_setting(run, 'max_num_seqs')} | {s['output_throughput']:.0f} | "
                        f"{s['total_token_throughput']:.0f} | {_ms(s['tpot_p50_ms'])} / {_ms(s['tpot_p99_ms'])} | "
                        f"{_ms(s['itl_p99_ms'])} | {_s(s['ttft_p50_ms'])} / {_s(s['ttft_p99_ms'])} | {good} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--knee", action="store_true", help="one row per max_num_seqs (a sweep report)")
    args = ap.parse_args()
    print("\n".join(knee_rows(args.reports) if args.knee else compare_rows(args.reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``inflight bench serve | throughput | sweep | plot``."""
from __future__ import annotations

import argparse


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` and its subcommands; every leaf sets ``handler``."""
    from inflight.bench.serve import add_serve_bench_parser
    from inflight.bench.sweep import add_sweep_parser
    from inflight.bench.throughput import add_throughput_parser

    p = subparsers.add_parser("bench", help="benchmarks: serving load, offline throughput, sweeps, plots")
    sub = p.add_subparsers(dest="bench_command", required=True, metavar="{serve,throughput,sweep,plot}")
    add_serve_bench_parser(sub)
    add_throughput_parser(sub)
    add_sweep_parser(sub)
    _add_plot_parser(sub)
    return p


def _add_plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw the plots of saved reports (JSON from serve / throughput / sweep)")
    p.add_argument("reports", nargs="+", help="JSON report files")
    p.add_argument("--out-dir", default=".", help="where the PNGs go")
    p.add_argument("--tpot-slo-ms", type=float, default=None, help="draw this TPOT SLO on the knee plot")
    p.set_defaults(handler=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    """Handler of ``inflight bench plot``."""
    from inflight.bench.common import read_runs
    from inflight.bench.plots import plot_all

    paths = plot_all(read_runs(args.reports), args.out_dir, args.tpot_slo_ms)
    for path in paths:
        print(f"plot written to {path}")
    if not paths:
        print("nothing to plot: give runs of several max_num_seqs, or 2-6 runs to compare")
    return 0 if paths else 1

"""``inflight bench sweep``: the server at several ``max_num_seqs`` (and schedulings,
and request rates), ``bench serve`` against each, one CSV and the plots.

    inflight bench sweep --max-num-seqs 1,4,16,64 --workload decode --num-requests 64 \\
        --schedulings continuous,static --goodput tpot:200 --out-dir bench-out

For every (scheduling, max_num_seqs) a fresh ``inflight serve`` subprocess starts
on a free port (its log goes to OUT_DIR/server-*.log); once /health answers 200,
each request rate runs the same saved workload (OUT_DIR/workload.jsonl). Then
OUT_DIR holds sweep.csv, sweep.json (every per-request record) and the PNGs.
``--server-cmd`` runs another server instead, e.g.
``"vllm serve M --port {port} --max-num-seqs {max_num_seqs}"``.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from inflight.bench.common import (add_workload_args, load_requests, make_report, parse_percentiles,
                                   workload_name, write_report)
from inflight.bench.metrics import parse_goodput
from inflight.bench.plots import plot_all
from inflight.bench.serve import add_client_args, bench_once, client_config
from inflight.bench.workload import save_jsonl

SCHEDULINGS = {"continuous": [], "static": ["--scheduling", "static", "--static-padding"],
               "static-nopad": ["--scheduling", "static", "--no-static-padding"]}
CSV_KEYS = ("label", "scheduling", "max_num_seqs", "request_rate")


def add_sweep_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sweep", help="bench serve across max_num_seqs / rates / schedulings; CSV and plots",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-num-seqs", default="1,4,16,64", help="comma list of server max_num_seqs values")
    p.add_argument("--request-rates", default="inf", help="comma list of rates (req/s; inf: all at once)")
    p.add_argument("--schedulings", default="continuous", help=f"comma list from {', '.join(SCHEDULINGS)}")
    p.add_argument("--out-dir", default="bench-out", help="where the CSV, JSON, logs and plots go")
    p.add_argument("--dtype", default="auto", help="server --dtype (auto: what `inflight serve` picks)")
    p.add_argument("--server-args", default="", help="more flags for `inflight serve`, one string")
    p.add_argument("--server-cmd", default=None,
                   help="run this server instead (format fields: {port} {max_num_seqs} {scheduling})")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--tpot-slo-ms", type=float, default=None,
                   help="TPOT p99 SLO to pick max_num_seqs by (default: --goodput's tpot)")
    add_client_args(p)
    add_workload_args(p, default="decode")
    p.set_defaults(handler=run_sweep)
    return p


@dataclass
class ServerProcess:
    """A server subprocess that is healthy inside the ``with`` block and gone after it."""

    cmd: list[str]
    base_url: str
    log_path: str
    startup_timeout: float = 600.0
    proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "ServerProcess":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.base_url, self.proc, self.startup_timeout, self.log_path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float, log_path: str = "") -> None:
    """Poll GET /health until 200; raise if the process exits or time runs out."""
    # No proxy handler: a proxy from the environment must not sit between us and the server.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was healthy "
                               f"(see {log_path})")
        try:
            with opener.open(base_url + "/health", timeout=2.0) as resp:
                if resp.status == 200:
                    return
        except OSError:  # refused, reset, timed out, or an HTTP error status
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {timeout:.0f} s (see {log_path})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, scheduling: str, max_num_seqs: int, port: int) -> list[str]:
    """The command line of one server: ours with the sweep's flags, or ``--server-cmd`` filled in."""
    if args.server_cmd:
        return shlex.split(args.server_cmd.format(port=port, max_num_seqs=max_num_seqs, scheduling=scheduling))
    return [sys.executable, "-m", "inflight.entrypoints.cli", "serve", "--port", str(port),
            "--max-num-seqs", str(max_num_seqs), "--dtype", args.dtype, "--disable-log-stats",
            "--uvicorn-log-level", "warning", *SCHEDULINGS[scheduling], *shlex.split(args.server_args)]


def _list(text: str, cast) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def write_csv(runs: list[dict[str, Any]], path: str) -> str:
    """One row per run: its settings, then every summary number."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run["summary"] if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*CSV_KEYS, *keys])
        w.writeheader()
        for run in runs:
            srv = run["config"].get("server", {})
            w.writerow({"label": run["label"], **{k: srv.get(k, "") for k in CSV_KEYS[1:]}, **run["summary"]})
    return path


def pick_max_num_seqs(runs: list[dict[str, Any]], tpot_slo_ms: float) -> Optional[dict[str, Any]]:
    """The continuous run with the highest output tokens/s whose TPOT p99 meets the SLO."""
    ok = [r for r in runs if r["config"].get("server", {}).get("scheduling") == "continuous"
          and (r["summary"].get("tpot_p99_ms") or math.inf) <= tpot_slo_ms and not r["summary"]["failed"]]
    return max(ok, key=lambda r: r["summary"]["output_throughput"], default=None)


def sweep_table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'scheduling':<13}{'mns':>5}{'rate':>7}{'out tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}"
             f"{'TPOT p50':>10}{'TPOT p99':>10}{'failed':>7}{'goodput':>9}"]
    for r in runs:
        s, srv = r["summary"], r["config"]["server"]
        lines.append(f"{srv['scheduling']:<13}{srv['max_num_seqs']:>5}{srv['request_rate']:>7g}"
                     f"{s['output_throughput']:>10.1f}{s['ttft_p50_ms']:>10.0f}{s['ttft_p99_ms']:>10.0f}"
                     f"{s['tpot_p50_ms']:>10.1f}{s['tpot_p99_ms']:>10.1f}{s['failed']:>7.0f}"
                     f"{s.get('goodput', math.nan):>9.2f}")
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace) -> int:
    """Handler of ``inflight bench sweep``."""
    percentiles, slo = parse_percentiles(args.percentiles), parse_goodput(args.goodput)
    mns_values, rates = _list(args.max_num_seqs, int), _list(args.request_rates, float)
    schedulings = _list(args.schedulings, str)
    if unknown := [s for s in schedulings if s not in SCHEDULINGS]:
        raise ValueError(f"unknown scheduling(s) {', '.join(unknown)}; choose from {', '.join(SCHEDULINGS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    requests = load_requests(args)
    save_jsonl(requests, os.path.join(args.out_dir, "workload.jsonl"))
    runs: list[dict[str, Any]] = []
    for scheduling in schedulings:
        for mns in mns_values:
            port = free_port()
            base_url, tag = f"http://127.0.0.1:{port}", f"{scheduling}-mns{mns}"
            cmd = server_command(args, scheduling, mns, port)
            print(f"[sweep] {tag}: {shlex.join(cmd)}", flush=True)
            with ServerProcess(cmd, base_url, os.path.join(args.out_dir, f"server-{tag}.log"), args.startup_timeout):
                for rate in rates:
                    args.request_rate = rate
                    label = f"{scheduling} mns={mns} rate={rate:g}"
                    server = {"scheduling": scheduling, "max_num_seqs": mns, "request_rate": rate,
                              "command": cmd}
                    run = bench_once(client_config(args, base_url), requests, label, slo, percentiles,
                                     {"workload": workload_name(args), "server": server})
                    print(f"[sweep] {label}: {run['summary']['output_throughput']:.1f} output tok/s, "
                          f"{run['summary']['failed']:.0f} failed", flush=True)
                    runs.append(run)
                    write_csv(runs, os.path.join(args.out_dir, "sweep.csv"))  # partial results survive
    write_report(make_report(runs, percentiles), os.path.join(args.out_dir, "sweep.json"))
    print(sweep_table(runs))
    tpot_slo = args.tpot_slo_ms or slo.get("tpot")
    for path in plot_all(runs, args.out_dir, tpot_slo):
        print(f"plot written to {path}")
    if tpot_slo:
        best = pick_max_num_seqs(runs, tpot_slo)
        print(f"TPOT p99 <= {tpot_slo:g} ms: " + (f"max_num_seqs={best['config']['server']['max_num_seqs']} "
              f"({best['summary']['output_throughput']:.1f} output tok/s)" if best else "no setting meets it"))
    return 0

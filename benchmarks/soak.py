"""Soak and chaos benchmark against a real ``inflight serve`` subprocess on 127.0.0.1.

N requests (default 10,000) from the shared workload shapes with short outputs,
in Poisson bursts at ~4x the server's measured capacity; 30% of the clients
disconnect at random points, 10% send malformed requests; SIGTERM at the end.

    python benchmarks/soak.py --num-requests 10000 [--result-file soak.json] [-- extra serve flags]

Pass criteria (exit status 1 when one fails): no leaked KV blocks (read from
/metrics once idle), no stuck request, no 5xx to a well-formed request (503
load shedding with Retry-After is counted apart), the exact completion token
count for every completed request, RSS growth < 5% between the 1,000th finished
request (N/10 for smaller runs) and the end, a clean exit (status 0) after SIGTERM.
Also reported: /health p50/p99 latency during the run and the drain time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Optional

from inflight.bench import chaos
from inflight.bench import workload as wl
from inflight.bench.sweep import free_port, wait_healthy

SHAPES = ("chat", "decode", "prefix", "smoke")  # longprompt's 1,000-token prompts are cut anyway


@dataclass
class SoakConfig:
    """What the soak sends and to which server."""

    num_requests: int = 10_000
    seed: int = 0
    overload: float = 4.0  # arrival rate during a burst, in multiples of the measured capacity
    disconnect_frac: float = 0.3
    bad_frac: float = 0.1
    max_tokens: int = 8
    max_prompt_words: int = 96
    burst_s: float = 2.0
    pause_factor: float = 3.0  # pause after a burst, in bursts: 3 makes the average rate the capacity at 4x
    request_timeout_s: float = 300.0
    max_num_seqs: int = 16
    max_waiting_requests: int = 512
    kv_cache_memory: int = 256 * 2**20
    shutdown_timeout_s: float = 30.0
    server_args: list[str] = field(default_factory=list)
    log_path: str = ""


@dataclass
class SoakReport:
    """The soak's figures; ``failures`` names every criterion that was not met."""

    num_requests: int = 0
    jobs: dict = field(default_factory=dict)  # kind -> count
    capacity_rps: float = 0.0
    burst_rate_rps: float = 0.0
    wall_s: float = 0.0
    completed: int = 0
    dropped: int = 0
    leaked_kv_blocks: int = -1
    num_kv_blocks: int = 0
    stuck_requests: int = 0
    server_errors_well_formed: int = 0  # 5xx (other than shedding) or no answer to a well-formed request
    shed_503: int = 0
    bad_requests_not_4xx: int = 0
    token_count_mismatches: int = 0
    rss_mark_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_growth_pct: float = 0.0
    health_p50_ms: float = 0.0
    health_p99_ms: float = 0.0
    health_failures: int = 0
    drain_s: float = 0.0
    drain_requests: int = 0  # well-formed requests in flight at the SIGTERM
    drain_requests_exact: int = 0  # of those, finished with their exact token count (else aborted at the grace)
    drain_requests_unanswered: int = 0  # of those, cut off or hung instead of answered
    exit_code: Optional[int] = None
    examples: list = field(default_factory=list)  # a few failed results, for the log
    failures: list = field(default_factory=list)

    def check(self) -> "SoakReport":
        rules = [("leaked KV blocks", self.leaked_kv_blocks == 0), ("stuck requests", self.stuck_requests == 0),
                 ("5xx to well-formed requests", self.server_errors_well_formed == 0),
                 ("bad requests not answered 4xx", self.bad_requests_not_4xx == 0),
                 ("inexact completion token counts", self.token_count_mismatches == 0),
                 ("RSS growth >= 5%", self.rss_growth_pct < 5.0), ("exit status after SIGTERM", self.exit_code == 0),
                 ("requests cut off in the drain", self.drain_requests_unanswered == 0)]
        self.failures = [name for name, ok in rules if not ok]
        return self


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def read_metrics(base_url: str) -> dict[str, float]:
    """Unlabelled view of /metrics: metric name -> value (labels dropped, values summed)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(?:\{[^}]*\})? ([-+\deE.naNinf]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def wait_idle(base_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """Metrics once nothing runs or waits (aborts land at the next step), or at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = read_metrics(base_url)
        busy = m.get("inflight:num_requests_running", 0) + m.get("inflight:num_requests_waiting", 0)
        if busy == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def num_kv_blocks(log_path: str) -> int:
    with open(log_path) as f:
        m = re.search(r"KV cache: (\d+) blocks", f.read())
    return int(m.group(1)) if m else 0


def _prompts(cfg: SoakConfig) -> list[wl.WorkloadRequest]:
    from inflight.loader import load_tokenizer

    tok = load_tokenizer(None)
    per_shape = max(8, min(256, cfg.num_requests // len(SHAPES)))
    pools = [wl.generate(name, tok, seed=cfg.seed, num_requests=per_shape) for name in SHAPES]
    return [r for group in zip(*pools) for r in group]  # interleaved: every shape all along


async def _calibrate(base_url: str, prompts: list[wl.WorkloadRequest], cfg: SoakConfig) -> float:
    """Well-formed requests/s the server completes with max_num_seqs of them in flight."""
    jobs = chaos.plan_jobs(prompts, cfg.max_num_seqs, "soak", seed=cfg.seed + 1, disconnect_frac=0.0,
                           bad_frac=0.0, max_tokens=cfg.max_tokens, max_prompt_words=cfg.max_prompt_words)
    async with chaos.httpx.AsyncClient(base_url=base_url, timeout=cfg.request_timeout_s, trust_env=False) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(chaos.run_job(client, j, cfg.request_timeout_s) for j in jobs))
        return len(jobs) / (time.monotonic() - t0)


async def _drive(base_url: str, pid: int, jobs: list[chaos.Job], rate: float,
                 cfg: SoakConfig, report: SoakReport) -> list[chaos.JobResult]:
    mark = 1000 if cfg.num_requests >= 2000 else max(1, cfg.num_requests // 10)

    def on_result(_: chaos.JobResult, done: int) -> None:
        if done == mark:
            report.rss_mark_mb = rss_bytes(pid) / 2**20

    stop = asyncio.Event()
    health = asyncio.ensure_future(chaos.poll_health(base_url, stop))
    driver = chaos.Driver(base_url, rate, burst_s=cfg.burst_s, pause_s=cfg.pause_factor * cfg.burst_s,
                          timeout_s=cfg.request_timeout_s, seed=cfg.seed, on_result=on_result)
    results = await driver.run(jobs)
    stop.set()
    latencies, report.health_failures = await health
    latencies.sort()
    if latencies:
        report.health_p50_ms = 1000 * latencies[len(latencies) // 2]
        report.health_p99_ms = 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return results


def _classify(r: chaos.JobResult) -> str:
    """The report bucket of one result; the failing ones name a broken criterion."""
    if r.kind == "bad":
        return "ok" if 400 <= r.status < 500 else "bad_not_4xx"
    if r.timed_out:
        return "stuck"
    if r.dropped:
        return "dropped"
    if r.status == 503:
        return "shed"
    if r.status != 200 or r.error:
        return "server_error"
    return "completed" if r.exact else "mismatch"


def _tally(results: list[chaos.JobResult], report: SoakReport) -> None:
    counters = {"bad_not_4xx": "bad_requests_not_4xx", "stuck": "stuck_requests", "dropped": "dropped",
                "shed": "shed_503", "server_error": "server_errors_well_formed", "completed": "completed",
                "mismatch": "token_count_mismatches"}
    for r in results:
        report.jobs[r.kind] = report.jobs.get(r.kind, 0) + 1
        bucket = _classify(r)
        if bucket in counters:
            setattr(report, counters[bucket], getattr(report, counters[bucket]) + 1)
        if bucket in ("bad_not_4xx", "stuck", "server_error", "mismatch") and len(report.examples) < 10:
            report.examples.append(asdict(r))


def _sigterm_drain(proc: subprocess.Popen, base_url: str, jobs: list[chaos.Job], report: SoakReport,
                   timeout_s: float = 120.0) -> None:
    """SIGTERM with ``jobs`` in flight: they must still finish exactly; time until the process is gone."""
    results: list[chaos.JobResult] = []

    async def in_flight() -> None:
        async with chaos.httpx.AsyncClient(base_url=base_url, timeout=timeout_s, trust_env=False) as client:
            results.extend(await asyncio.gather(*(chaos.run_job(client, j, timeout_s) for j in jobs)))

    clients = threading.Thread(target=asyncio.run, args=(in_flight(),))
    clients.start()
    time.sleep(0.5)  # the requests are in the engine
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        report.exit_code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    report.drain_s = time.monotonic() - t0
    clients.join(timeout_s)
    report.drain_requests = len(jobs)
    report.drain_requests_exact = sum(r.exact for r in results)
    report.drain_requests_unanswered = sum(r.status == 0 for r in results)


def run_soak(cfg: SoakConfig) -> SoakReport:
    """Start a server, soak it, SIGTERM it; the report says what held."""
    report = SoakReport(num_requests=cfg.num_requests)
    prompts = _prompts(cfg)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = cfg.log_path or tempfile.mktemp(prefix="inflight-soak-", suffix=".log")
    cmd = [sys.executable, "-m", "inflight.entrypoints.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", "soak", "--max-num-seqs", str(cfg.max_num_seqs),
           "--max-waiting-requests", str(cfg.max_waiting_requests), "--disable-log-stats",
           "--kv-cache-memory", str(cfg.kv_cache_memory), "--shutdown-timeout", str(cfg.shutdown_timeout_s),
           "--uvicorn-log-level", "warning", *cfg.server_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(base_url, proc, 600, log_path)
        report.num_kv_blocks = num_kv_blocks(log_path)
        report.capacity_rps = asyncio.run(_calibrate(base_url, prompts, cfg))
        report.burst_rate_rps = cfg.overload * report.capacity_rps
        jobs = chaos.plan_jobs(prompts, cfg.num_requests, "soak", cfg.seed, cfg.disconnect_frac, cfg.bad_frac,
                               cfg.max_tokens, cfg.max_prompt_words)
        t0 = time.monotonic()
        results = asyncio.run(_drive(base_url, proc.pid, jobs, report.burst_rate_rps, cfg, report))
        report.wall_s = time.monotonic() - t0
        idle = wait_idle(base_url)
        report.stuck_requests += int(idle.get("inflight:num_requests_running", 0)
                                     + idle.get("inflight:num_requests_waiting", 0))
        report.leaked_kv_blocks = round(idle.get("inflight:kv_cache_usage_perc", 1.0) * report.num_kv_blocks)
        report.rss_end_mb = rss_bytes(proc.pid) / 2**20
        if report.rss_mark_mb:
            report.rss_growth_pct = 100.0 * (report.rss_end_mb / report.rss_mark_mb - 1.0)
        _tally(results, report)
        drain_jobs = chaos.plan_jobs(prompts, 4, "soak", cfg.seed + 2, 0.0, 0.0, cfg.max_tokens, cfg.max_prompt_words)
        _sigterm_drain(proc, base_url, drain_jobs, report)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return report.check()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overload", type=float, default=4.0, help="burst arrival rate in multiples of capacity")
    p.add_argument("--max-tokens", type=int, default=8, help="cap on each request's output tokens")
    p.add_argument("--max-prompt-words", type=int, default=96, help="cap on each prompt's length in words")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--burst-s", type=float, default=2.0, help="length of a burst of arrivals")
    p.add_argument("--pause-factor", type=float, default=3.0, help="pause after each burst, in burst lengths")
    p.add_argument("--result-file", default=None, help="write the report here as JSON")
    p.add_argument("--log-file", default="", help="the server's log (default: a temporary file)")
    p.add_argument("server_args", nargs="*", help="extra `inflight serve` flags, after --")
    args = p.parse_args(argv)
    cfg = SoakConfig(num_requests=args.num_requests, seed=args.seed, overload=args.overload,
                     max_tokens=args.max_tokens, max_prompt_words=args.max_prompt_words,
                     max_num_seqs=args.max_num_seqs, burst_s=args.burst_s, pause_factor=args.pause_factor,
                     server_args=args.server_args, log_path=args.log_file)
    report = run_soak(cfg)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.result_file:
        with open(args.result_file, "w") as f:
            f.write(text + "\n")
    if report.failures:
        print(f"soak FAILED: {', '.join(report.failures)}", file=sys.stderr)
    return 1 if report.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

"""PNG plots of benchmark runs (matplotlib, no display needed).

- ``plot_knee``: output tokens/s against TPOT p50/p99 and against TTFT p99, one
  point per ``max_num_seqs``, one line per (scheduling, request rate): where the
  line turns flat to the right, more concurrency buys latency, not throughput.
  Static runs appear only against TTFT: they hand back every token at the batch
  end, so their TPOT is meaningless.
- ``plot_compare``: runs side by side (e.g. static vs continuous): throughput
  bars, TTFT distribution, and when each request completed.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Any, Optional, Sequence

Run = dict[str, Any]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _setting(run: Run, key: str, default: Any = None) -> Any:
    cfg = run.get("config", {})
    return cfg.get("server", {}).get(key, cfg.get(key, default))


def _num(v: Any) -> float:
    """A summary value as a float (null in a JSON report: nan)."""
    return math.nan if v is None else float(v)


def _rate_text(rate: Any) -> str:
    return "all at once" if rate is None or (isinstance(rate, float) and math.isinf(rate)) or rate == "inf" \
        else f"{float(rate):g} req/s"


def knee_series(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Serving runs grouped by (scheduling, rate), each sorted by max_num_seqs."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.get("kind") != "serve" or _setting(run, "max_num_seqs") is None:
            continue
        name = f"{_setting(run, 'scheduling', 'continuous')}, {_rate_text(_setting(run, 'request_rate'))}"
        groups[name].append(run)
    return {k: sorted(v, key=lambda r: _setting(r, "max_num_seqs")) for k, v in groups.items()}


def plot_knee(runs: Sequence[Run], path: str, tpot_slo_ms: Optional[float] = None, title: str = "") -> str:
    """Throughput against TPOT (p50, p99) and TTFT p99; returns ``path``."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (name, series) in enumerate(knee_series(runs).items()):
        color = f"C{i}"
        y, p50, p99, ttft = ([_num(r["summary"][k]) for r in series]
                             for k in ("output_throughput", "tpot_p50_ms", "tpot_p99_ms", "ttft_p99_ms"))
        streamed = _setting(series[0], "scheduling", "continuous") == "continuous"
        if streamed:  # static hands every token back at the batch end: its TPOT means nothing
            ax1.plot(p50, y, "o--", color=color, alpha=0.6, label=f"{name}: TPOT p50")
            ax1.plot(p99, y, "s-", color=color, label=f"{name}: TPOT p99")
        ax2.plot(ttft, y, "s-", color=color, label=name)
        for r, xa, xb, yy in zip(series, p99, ttft, y):
            n = _setting(r, "max_num_seqs")
            if streamed:
                ax1.annotate(f"{n}", (xa, yy), textcoords="offset points", xytext=(5, 5), fontsize=8)
            ax2.annotate(f"{n}", (xb, yy), textcoords="offset points", xytext=(5, 5), fontsize=8)
    if tpot_slo_ms:
        ax1.axvline(tpot_slo_ms, color="red", linestyle=":", label=f"TPOT SLO {tpot_slo_ms:g} ms")
    ax1.set(xlabel="TPOT (ms per output token)", ylabel="output tokens/s",
            title="throughput vs TPOT (labels: max_num_seqs)")
    ax2.set(xlabel="TTFT p99 (ms)", ylabel="output tokens/s", title="throughput vs TTFT p99")
    for ax in (ax1, ax2):
        _maybe_log_x(ax)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _ecdf(ax, values: list[float], label: str, color: str) -> None:
    xs = sorted(values)
    if xs:
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label, color=color)


def plot_compare(runs: Sequence[Run], path: str, title: str = "") -> str:
    """Side by side: output tokens/s, TTFT distribution, completion times; returns ``path``."""
    plt = _plt()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = [r["label"] for r in runs]
    tps = [r["summary"]["output_throughput"] for r in runs]
    bars = ax1.bar(range(len(runs)), tps, color=[f"C{i}" for i in range(len(runs))])
    for bar, v in zip(bars, tps):
        ax1.annotate(f"{v:.0f} ({v / tps[0]:.2f}x)", (bar.get_x() + bar.get_width() / 2, v), ha="center",
                     va="bottom", fontsize=8)
    ax1.set_xticks(range(len(runs)), labels, rotation=15, fontsize=8)
    ax1.set(ylabel="output tokens/s", title="throughput")
    for i, run in enumerate(runs):
        ok = [q for q in run["requests"] if q.get("success")]
        _ecdf(ax2, [q["ttft"] for q in ok if q.get("ttft") is not None], run["label"], f"C{i}")
        _ecdf(ax3, [q["start"] + q["e2e"] for q in ok if q.get("e2e") is not None], run["label"], f"C{i}")
    ax2.set(xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT distribution")
    ax3.set(xlabel="seconds since the benchmark started", ylabel="fraction of requests completed",
            title="per-request completion time")
    for ax in (ax2, ax3):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _maybe_log_x(ax) -> None:
    lo, hi = ax.get_xlim()
    xs = [x for line in ax.get_lines() for x in line.get_xdata() if x == x and x > 0]
    if xs and max(xs) / min(xs) > 20:
        ax.set_xscale("log")
    elif lo < 0:
        ax.set_xlim(left=0)


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def compare_groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs that differ only in scheduling, grouped by (max_num_seqs, rate); groups of two or more."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        key = f"mns{_setting(run, 'max_num_seqs', 'x')}_rate{_setting(run, 'request_rate', 'inf')}"
        groups[key].append(run)
    return {k: v for k, v in groups.items() if len({_setting(r, 'scheduling') for r in v}) > 1}


def plot_all(runs: Sequence[Run], out_dir: str, tpot_slo_ms: Optional[float] = None) -> list[str]:
    """Every plot that the runs support: the knee, and one comparison per group of runs
    that differ only in scheduling; with neither, one comparison of all (2-6) runs."""
    paths = []
    if any(len({_setting(r, "max_num_seqs") for r in s}) > 1 for s in knee_series(runs).values()):
        paths.append(plot_knee(runs, os.path.join(out_dir, "knee.png"), tpot_slo_ms))
    groups = compare_groups(runs)
    for key, group in groups.items():
        name = key.replace(".", "_").replace("inf", "all")
        first = group[0]
        how = "offline" if first.get("kind") == "throughput" else _rate_text(_setting(first, "request_rate"))
        workload = f", workload {first['config']['workload']}" if first["config"].get("workload") else ""
        title = f"max_num_seqs={_setting(first, 'max_num_seqs')}, {how}{workload}"
        paths.append(plot_compare(group, os.path.join(out_dir, f"compare_{name}.png"), title=title))
    if not paths and 1 < len(runs) <= 6:
        paths.append(plot_compare(list(runs), os.path.join(out_dir, "compare.png")))
    return paths

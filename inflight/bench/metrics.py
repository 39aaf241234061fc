"""Per-request records and the numbers a benchmark reports from them.

Definitions (the same as vLLM's ``benchmark_serving``, so results compare):

- TTFT: request sent -> first chunk that carries generated text.
- E2E latency: request sent -> end of the response (the stream's ``[DONE]``).
- TPOT: ``(e2e - ttft) / (output_tokens - 1)``; undefined (left out) for one token.
- ITL: the gaps between consecutive content chunks. A server may send several
  tokens in one chunk (a token that completes no text yet rides with the next),
  so ITL counts chunks, TPOT counts tokens.
- Percentiles interpolate linearly between closest ranks (numpy's default).
- Goodput: completed requests per second that met every SLO given
  (``ttft``, ``tpot``, ``e2el``, in milliseconds); a one-token request meets any
  TPOT SLO.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """What one request did, times in seconds relative to the benchmark's start."""

    id: str
    prompt_tokens: int = 0
    max_tokens: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str = ""
    start: float = 0.0  # when the request was sent
    ttft: Optional[float] = None
    e2e: Optional[float] = None
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> Optional[float]:
        """Mean time per output token after the first; None below two tokens."""
        if not self.success or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def end(self) -> Optional[float]:
        """When the request completed (benchmark clock)."""
        return None if self.e2e is None else self.start + self.e2e

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tpot"] = self.tpot
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation; nan when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    h = (len(xs) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def nearest_rank(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) as the nearest observed value; nan when empty.

    For small samples of step times or batch latencies, where an interpolated
    value would be one that never happened."""
    if not values:
        return math.nan
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def parse_goodput(items: Optional[Iterable[str]]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    slo: dict[str, float] = {}
    for item in items or []:
        key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"bad --goodput item {item!r}: use KEY:MS with KEY one of {', '.join(SLO_KEYS)}")
        ms = float(value)
        if ms < 0:
            raise ValueError(f"bad --goodput item {item!r}: the SLO must be >= 0 ms")
        slo[key] = ms
    return slo


def meets_slo(r: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether a completed request met every SLO (milliseconds)."""
    if not r.success:
        return False
    values = {"ttft": r.ttft, "tpot": r.tpot if r.tpot is not None else 0.0, "e2el": r.e2e}
    return all(values[k] is not None and values[k] * 1000.0 <= ms for k, ms in slo.items())


def _values(records: list[RequestRecord], metric: str) -> list[float]:
    if metric == "itl":
        return [x for r in records for x in r.itl]
    attr = "e2e" if metric == "e2el" else metric
    return [v for r in records if (v := getattr(r, attr)) is not None]


def summarize(records: list[RequestRecord], duration: float, slo: Optional[dict[str, float]] = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """Throughput and latency statistics of one run, as a flat dict (latencies in ms)."""
    ok = [r for r in records if r.success]
    duration = max(duration, 1e-9)
    n_in = sum(r.prompt_tokens for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    out: dict[str, float] = {
        "num_requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "duration_s": duration, "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration, "output_throughput": n_out / duration,
        "total_token_throughput": (n_in + n_out) / duration,
    }
    if slo:
        good = sum(meets_slo(r, slo) for r in ok)
        out["good_requests"] = good
        out["goodput"] = good / duration
    for metric in LATENCY_METRICS:
        ms = [v * 1000.0 for v in _values(ok, metric)]
        out[f"{metric}_mean_ms"] = statistics.fmean(ms) if ms else math.nan
        for p in percentiles:
            out[f"{metric}_p{_pname(p)}_ms"] = percentile(ms, p)
    return out


def _pname(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p).replace(".", "_")


def format_table(title: str, summary: dict[str, float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> str:
    """A short text table of a summary, for the terminal."""
    rows: list[tuple[str, str]] = [
        ("Successful requests", f"{summary['completed']:.0f}"),
        ("Failed requests", f"{summary['failed']:.0f}"),
        ("Benchmark duration (s)", f"{summary['duration_s']:.2f}"),
        ("Total input tokens", f"{summary['total_input_tokens']:.0f}"),
        ("Total output tokens", f"{summary['total_output_tokens']:.0f}"),
        ("Request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{summary['output_throughput']:.1f}"),
        ("Total token throughput (tok/s)", f"{summary['total_token_throughput']:.1f}"),
    ]
    if "goodput" in summary:
        rows.append(("Goodput (req/s)", f"{summary['goodput']:.2f} ({summary['good_requests']:.0f} good)"))
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
    for metric in LATENCY_METRICS:
        if math.isnan(summary.get(f"{metric}_mean_ms", math.nan)):
            continue
        cells = [f"mean {summary[f'{metric}_mean_ms']:.1f}"]
        cells += [f"p{_pname(p)} {summary[f'{metric}_p{_pname(p)}_ms']:.1f}" for p in percentiles]
        rows.append((f"{names[metric]} (ms)", "  ".join(cells)))
    width = max(len(k) for k, _ in rows)
    line = "=" * (width + 42)
    body = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    return f"{line}\n{title.center(len(line))}\n{line}\n{body}\n{line}"

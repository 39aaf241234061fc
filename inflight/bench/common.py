"""What every bench subcommand shares: workload flags, the report file, machine facts.

A report (the JSON every subcommand writes; strict JSON: NaN is null, an
infinite request rate is "inf") is::

    {"schema": "inflight.bench/1", "date": ..., "machine": {...}, "command": [...],
     "runs": [{"label": ..., "kind": "serve" | "throughput", "config": {...},
               "summary": {...}, "requests": [RequestRecord.to_dict(), ...]}, ...]}
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Optional

from inflight.bench import workload as wl
from inflight.bench.metrics import DEFAULT_PERCENTILES, RequestRecord

SCHEMA = "inflight.bench/1"
RANDOM = "random"


def add_workload_args(p: argparse.ArgumentParser, default: str = "chat", engine_flags: bool = False) -> None:
    """--workload / --workload-file / --num-requests / random-length flags.

    With ``engine_flags`` the parser also has the engine's flags, whose ``--seed``
    and ``--tokenizer`` then serve the workload too."""
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default=default, choices=list(wl.WORKLOADS) + [RANDOM],
                   help=f"a generated workload shape, or '{RANDOM}' (see --input-len) (default {default})")
    g.add_argument("--workload-file", default=None,
                   help="JSONL of {prompt, max_tokens[, id, prompt_tokens]} lines (overrides --workload)")
    g.add_argument("--num-requests", type=int, default=None, help="first N requests (default: the whole workload)")
    if not engine_flags:
        g.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    g.add_argument("--input-len", default="32:256", help="random: prompt length range LO:HI in tokens")
    g.add_argument("--output-len", default="16:128", help="random: output length range LO:HI in tokens")
    g.add_argument("--length-dist", default="uniform", choices=["uniform", "lognormal"],
                   help="random: lengths uniform in [LO, HI], or lognormal around the middle, clipped")
    g.add_argument("--prefix-len", type=int, default=0, help="random: a shared prefix of this many tokens")
    if not engine_flags:
        g.add_argument("--tokenizer", default=None,
                       help="tokenizer that counts generated prompt lengths (HF folder or .gguf; default: embedded)")
    g.add_argument("--percentiles", default="50,90,99", help="latency percentiles to report")


def parse_range(text: str) -> tuple[int, int]:
    """``"32:256"`` -> (32, 256); one number means a fixed length."""
    lo, _, hi = text.partition(":")
    a, b = int(lo), int(hi or lo)
    if a < 1 or b < a:
        raise ValueError(f"bad length range {text!r}: use LO:HI with 1 <= LO <= HI")
    return a, b


def parse_percentiles(text: str) -> tuple[float, ...]:
    ps = tuple(float(x) for x in text.split(",") if x.strip())
    if not ps or any(not 0 <= p <= 100 for p in ps):
        raise ValueError(f"bad --percentiles {text!r}: comma-separated numbers in [0, 100]")
    return ps


def load_requests(args: argparse.Namespace, tokenizer: Any = None) -> list[wl.WorkloadRequest]:
    """The workload the flags describe; ``tokenizer`` is loaded (embedded model's) if needed."""
    if args.workload_file:
        reqs = wl.load_jsonl(args.workload_file)
    else:
        if tokenizer is None:
            from inflight.loader import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer)
        if args.workload == RANDOM:
            reqs = wl.custom(args.num_requests or 100, parse_range(args.input_len), parse_range(args.output_len),
                             tokenizer, seed=args.seed, distribution=args.length_dist, prefix_len=args.prefix_len)
        else:
            reqs = wl.generate(args.workload, tokenizer, seed=args.seed, num_requests=args.num_requests)
    if args.num_requests:
        reqs = reqs[:args.num_requests]
    if not reqs:
        raise ValueError("the workload is empty")
    return reqs


def workload_name(args: argparse.Namespace) -> str:
    return args.workload_file or args.workload


def machine_info() -> dict[str, Any]:
    """Facts that make a number reproducible: CPU, OS, Python, torch, accelerator."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "processor": _cpu_model(), "python": platform.python_version()}
    if hasattr(os, "getloadavg"):  # 1/5/15 min, the benchmark's own load included
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def make_run(label: str, kind: str, config: dict[str, Any], summary: dict[str, float],
             records: list[RequestRecord]) -> dict[str, Any]:
    """One run of a report."""
    return {"label": label, "kind": kind, "config": config, "summary": summary,
            "requests": [r.to_dict() for r in records]}


def make_report(runs: list[dict[str, Any]], percentiles=DEFAULT_PERCENTILES) -> dict[str, Any]:
    return {"schema": SCHEMA, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine_info(),
            "command": sys.argv, "percentiles": list(percentiles), "runs": runs}


def write_report(report: dict[str, Any], path: Optional[str]) -> None:
    """Write ``report`` as JSON (NaN becomes null) when ``path`` is given."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(json_safe(report), f, indent=1, allow_nan=False)
    print(f"results written to {path}")


def read_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Every run of the given report files, in order."""
    runs: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            runs.extend(json.load(f)["runs"])
    return runs


def json_safe(obj: Any) -> Any:
    """Strict JSON: NaN becomes null, infinities the strings "inf" / "-inf"."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None if obj != obj else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj

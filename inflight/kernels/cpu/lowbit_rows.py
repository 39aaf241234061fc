"""Up to how many rows a step reads the low-bit panels, measured once on this machine.

A step of a few rows waits on weight bytes, and a weight's low-bit panels (0.75 or
1.125 bytes, panel_lowbit.py) stream 3.6-5.3x faster than its fp32 panels (4 bytes).
With more rows the step waits on the FMA units instead, and expanding each panel to
fp32 is extra work. Where one turns into the other depends on the DRAM rate against
the compute rate, not on the ISA: a Zen 3 AVX2 host with slow DRAM gained up to 64
rows, a Zen 5 capped at AVX2 only up to 8, the same Zen 5 with AVX-512 up to 128
(benchmarks/lowbit_gemm_rows.py). So the engine times a whole step's projections
both ways at a few row counts when it loads a model (a near-tie counts for the low-bit
panels), and keeps the answer in ``$INFLIGHT_CACHE_DIR/tune``, keyed by the CPU, the ISA
level, the thread count, the GEMM's sources and the weights' shapes: a warm start measures
nothing. An answer measured while another process held the cores is used but not kept.

``INFLIGHT_LOWBIT_MAX_ROWS`` (an int; -1: never) sets the limit without measuring.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from inflight.cache_root import cache_root, write_atomic
from inflight.kernels.cpu.build import sources
from inflight.kernels.cpu.panel_lowbit import LOWBIT_MAX_ROWS

logger = logging.getLogger(__name__)

CANDIDATE_ROWS = (4, 8, 16, 32, 64, LOWBIT_MAX_ROWS)
ROUNDS = 3  # each row count: both kinds, alternating; the fastest round of each counts
# NOTE: a near-tie goes to the low-bit panels. The timing here runs the projections alone; in a
# serving step attention's K/V reads share the DRAM with the weights, and the panels that read
# fewer bytes leave more of it (and of L3) to them. Where the two tie within the measurement's
# noise, stopping there lost decode workloads much of the panels' gain (benchmarks/README.md).
TIE = 0.05
# below this share of the threads' CPU time over the measurement, another process held the cores:
# the answer is used but not kept, and the next load measures again
QUIET_SHARE = 0.8
ENV = "INFLIGHT_LOWBIT_MAX_ROWS"


def lowbit_linears(model: nn.Module) -> list[nn.Module]:
    """The model's linears that hold low-bit panels, in the order a step runs them
    (module order: the layers, then the logits projection)."""
    return [m for m in model.modules() if getattr(m, "lowbit", None) is not None]


def set_max_rows(linears: Sequence[nn.Module], rows: int) -> None:
    """Calls of at most ``rows`` rows read these linears' low-bit panels (-1: none do)."""
    for lin in linears:
        lin.lowbit_max_rows = rows


def time_step(linears: Sequence[nn.Module], rows: int, lowbit: bool) -> float:
    """Seconds for one pass of ``rows`` rows through every linear, over the low-bit
    panels or over the fp32 ones. Each weight is read once, in step order, so a model
    larger than the caches streams from DRAM as a real step does."""
    set_max_rows(linears, 1 << 30 if lowbit else -1)
    inputs = {k: torch.randn(rows, k) for k in {lin.in_features for lin in linears}}
    t0 = time.perf_counter()
    for lin in linears:
        lin(inputs[lin.in_features])
    return time.perf_counter() - t0


def measure_max_rows(timer: Callable[[int, bool], float], candidates: Sequence[int] = CANDIDATE_ROWS,
                     rounds: int = ROUNDS) -> int:
    """The largest of ``candidates`` (ascending) at which the low-bit panels are still
    faster or within ``TIE`` of the fp32 ones, trying them in order and stopping at the
    first where they are slower; 0 where none. ``timer(rows, lowbit)`` times one step.
    Each kind's fastest round counts: another process taking the core only ever adds time."""
    best = 0
    for rows in candidates:
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for low in ((False, True) if r % 2 == 0 else (True, False)):
                times[low].append(timer(rows, low))
        if min(times[True]) > min(times[False]) * (1 + TIE):
            break
        best = rows
    return best


def cpu_share(wall: float, cpu: float) -> float:
    """The share of ``torch``'s threads' time that this process ran over ``wall`` seconds in
    which it used ``cpu`` seconds of CPU."""
    return cpu / max(wall, 1e-9) / torch.get_num_threads()


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "unknown"
    first = text.split("\n\n")[0]  # one core's entry: every core of a host is alike
    keys = ("vendor_id", "cpu family", "model", "model name", "stepping", "CPU implementer", "CPU part")
    return "\n".join(ln for ln in first.splitlines() if ln.split(":")[0].strip() in keys)


def cache_key(linears: Sequence[nn.Module]) -> str:
    """What the crossover depends on: this CPU, the kernel build and level, the thread
    count, and the weights' shapes and bit widths."""
    parts = [_cpu_identity(), linears[0].isa, str(torch.get_num_threads()), "".join(sources("gemm_f32").values()),
             ";".join(f"{lin.out_features}x{lin.in_features}:{lin.lowbit_bits}" for lin in linears)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _cache_path(key: str) -> str:
    return os.path.join(cache_root(), "tune", f"lowbit-{key}.json")


def _read_cached(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            rows = json.load(f)["lowbit_max_rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rows if isinstance(rows, int) else None


def _store(path: str, rows: int) -> None:
    try:
        write_atomic(path, json.dumps({"lowbit_max_rows": rows}))
    except OSError as exc:
        logger.debug("not caching the low-bit row limit: %s", exc)


def tune_lowbit_max_rows(model: nn.Module) -> Optional[int]:
    """Set every low-bit linear's ``lowbit_max_rows`` from the environment, the cache or a
    measurement, in that order; returns the limit (None: the model has no low-bit panels)."""
    linears = lowbit_linears(model)
    if not linears:
        return None
    env = os.environ.get(ENV)
    if env:
        try:
            rows = int(env)
        except ValueError:
            raise ValueError(f"{ENV} must be an integer row count, not {env!r}") from None
    else:
        path = _cache_path(cache_key(linears))
        rows = _read_cached(path)
        if rows is None:
            t0, c0 = time.perf_counter(), time.process_time()
            for low in (False, True):  # first touch of both kinds of panels, untimed
                time_step(linears, 1, low)
            rows = measure_max_rows(lambda r, low: time_step(linears, r, low))
            wall = time.perf_counter() - t0
            share = cpu_share(wall, time.process_time() - c0)
            if share >= QUIET_SHARE:
                logger.info("low-bit panels pay up to %d rows a step here (measured in %.1f s)", rows, wall)
                _store(path, rows)
            else:
                logger.warning("low-bit panels pay up to %d rows a step, measured while another process held "
                               "%.0f%% of the cores: not kept, the next start measures again", rows,
                               100 * (1 - share))
    set_max_rows(linears, rows)
    return rows

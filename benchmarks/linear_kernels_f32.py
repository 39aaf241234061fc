"""CPU fp32 linears: our panel GEMM (csrc/gemm_f32.c) against torch's F.linear (MKL
sgemm) on SmolLM2-135M's projections, per shape and row count.

    python benchmarks/linear_kernels_f32.py [--rows 1 4 16 ...] [--repeats 9] [--isa avx2]
                                            [--threads 1 --cpu-time]

Each (shape, rows) cell: ``--repeats`` rounds, each timing one call of each kind
(alternately, so both see the same machine load) as the best of a few back-to-back
calls; the table gives the median over the rounds in GFLOP/s. Weights are as big as
a real layer's, and the decode rows (M <= 16) cycle through several copies of each
weight so they stream from DRAM as in a model step rather than from L3.
Then the 2048^3 torch.mm peak, measured the same way, for reference.

``--threads 1 --cpu-time`` times one thread by its own CPU time (CLOCK_THREAD_CPUTIME_ID):
per-core efficiency that holds up on a machine other jobs share, where wall-clock
figures of two threads mostly measure the scheduler.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from inflight.kernels.cpu.gemm_f32 import PanelLinearF32
from inflight.kernels.cpu.isa import get_level

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
COPIES_BYTES = 96 << 20  # decode rows: enough copies of a weight to overflow L3


CLOCK = time.perf_counter


def timed(fn, inner: int) -> float:
    best = float("inf")
    for _ in range(inner):
        t = CLOCK()
        fn()
        best = min(best, CLOCK() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4, 16, 64, 128, 256, 512])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--isa", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true", help="time by the thread's CPU time (with --threads 1)")
    args = ap.parse_args()
    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        if torch.get_num_threads() != 1:
            ap.error("--cpu-time needs --threads 1")
        CLOCK = time.thread_time
    level = get_level(args.isa) if args.isa else None
    torch.manual_seed(0)
    isa_name = PanelLinearF32(torch.zeros(1, 1), None, level).isa
    print(f"threads {torch.get_num_threads()}, {'CPU' if args.cpu_time else 'wall'} time, isa {isa_name}")
    print(f"{'shape':>8} {'N':>6} {'K':>5} {'M':>4} {'ours':>7} {'torch':>7} {'ratio':>6}  (GFLOP/s, median)")
    with torch.inference_mode():
        for name in args.shapes:
            n, k = SHAPES[name]
            copies = max(1, min(16, COPIES_BYTES // (4 * n * k)))
            ws = [torch.randn(n, k) * 0.02 for _ in range(copies)]
            ours = [PanelLinearF32(w, None, level) for w in ws]
            for m in args.rows:
                x = torch.randn(m, k)
                cyc = copies if m <= 16 else 1
                state = {"i": 0}

                def run_ours():
                    state["i"] = (state["i"] + 1) % cyc
                    ours[state["i"]](x)

                def run_torch():
                    state["i"] = (state["i"] + 1) % cyc
                    F.linear(x, ws[state["i"]])

                inner = 3 if m * n * k < 2e8 else 2
                t_ours, t_torch = [], []
                for _ in range(2):  # warm-up
                    run_ours(), run_torch()
                for _ in range(args.repeats):
                    t_ours.append(timed(run_ours, inner))
                    t_torch.append(timed(run_torch, inner))
                flop = 2 * m * n * k
                g_ours, g_torch = flop / statistics.median(t_ours) / 1e9, flop / statistics.median(t_torch) / 1e9
                print(f"{name:>8} {n:6d} {k:5d} {m:4d} {g_ours:7.1f} {g_torch:7.1f} {g_ours / g_torch:6.2f}",
                      flush=True)
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        torch.mm(a, b)
        peak = [2 * 2048 ** 3 / timed(lambda: torch.mm(a, b), 1) / 1e9 for _ in range(args.repeats)]
        print(f"torch.mm 2048^3: {statistics.median(peak):.1f} GFLOP/s (median of {args.repeats})")


if __name__ == "__main__":
    main()

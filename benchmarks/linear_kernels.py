"""CPU bf16 linears: our panel GEMM (csrc/gemm_bf16.c) against oneDNN's prepacked
linear, on SmolLM2-135M's projections (qkv 576->960, o 576->576, gate_up
576->3072, down 1536->576) for all 30 layers, each layer its own weights so
they stream from DRAM as in a real step.

    python benchmarks/linear_kernels.py [rows ...]

Per row count: the median time of one pass over the 120 projections for each
kind, run alternately, with the GFLOP/s and weight GB/s it reaches.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from inflight.kernels.cpu.gemm_bf16 import PanelLinear, load_gemm
from inflight.kernels.cpu.packing import PackedLinear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in)
LAYERS = 30


def one_pass(linears, xs) -> float:
    t = time.perf_counter()
    for layer in linears:
        for lin, (_, k) in zip(layer, SHAPES):
            lin(xs[k])
    return time.perf_counter() - t


def main() -> None:
    if load_gemm() is None:
        sys.exit("the panel GEMM does not run on this machine (needs AVX-512-BF16 and a C compiler)")
    rows_list = [int(a) for a in sys.argv[1:]] or [1, 4, 8, 16, 32, 64, 128, 256, 512]
    torch.manual_seed(0)
    weights = [[torch.randn(n, k, dtype=torch.bfloat16) * 0.02 for n, k in SHAPES] for _ in range(LAYERS)]
    kinds = {"oneDNN": [[PackedLinear(w, None) for w in layer] for layer in weights],
             "panel": [[PanelLinear(w, None) for w in layer] for layer in weights]}
    flop = 2 * sum(n * k for n, k in SHAPES) * LAYERS
    nbytes = flop  # 2 bytes per weight, 2 FLOPs per weight and row
    print(f"{'rows':>5} " + " ".join(f"{k + ' ms':>10} {'GFLOP/s':>8} {'GB/s':>5}" for k in kinds) + "  speed-up")
    with torch.inference_mode():
        for rows in rows_list:
            xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for _, k in SHAPES}
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(7):
                for name, lins in kinds.items():
                    times[name].append(one_pass(lins, xs))
            med = {k: statistics.median(v[1:]) for k, v in times.items()}  # first pass warms up
            cols = " ".join(f"{med[k] * 1e3:10.2f} {rows * flop / med[k] / 1e9:8.0f} {nbytes / med[k] / 1e9:5.1f}"
                            for k in kinds)
            print(f"{rows:5d} {cols}  {med['oneDNN'] / med['panel']:.2f}x")


if __name__ == "__main__":
    main()

"""The fp32 panel GEMM (csrc/gemm_f32.c) at a decode step's row counts: this checkout's
against another checkout's, interleaved in one process (the host's load drifts;
alternating calls see the same).

    python benchmarks/gemm_f32_rows_ab.py --baseline /path/to/other/checkout [--rows 7 8 16 32]
                                          [--panels q4] [--layers 30] [--repeats 15]

One "step" runs SmolLM2-135M's four projections of every layer (qkv, o, gate_up with the
SiLU epilogue, down) over 30 layers' weights, so the panels stream from DRAM as in a model
step (``--layers 1``: from the caches, the arithmetic alone). The weights are random but of
the 4-bit form (d * q + m per block of 32 inputs), so ``--panels q4`` runs the same step over
their low-bit panels (what a few rows read). Prints each kernel's median step time and
whether the outputs are bit-identical.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

from checkout_kernels import ab_setup, time_interleaved
from inflight.kernels.cpu.gemm_f32 import load_gemm_f32, pack_panels_f32
from inflight.kernels.cpu.isa import current_level
from inflight.kernels.cpu.panel_lowbit import pack_panels_lowbit

# K, N, epilogue (silu: N counts gate and up columns together)
SHAPES = [(576, 960, ""), (576, 576, ""), (576, 3072, "silu"), (1536, 576, "")]


def q4_weight(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Random weights of the 4-bit form: d * q + m in each block of 32 inputs of a row"""
    d = torch.randint(1, 255, (n, k // 32, 1), generator=g).float() * 2.0 ** -12
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    return (d * q - 8 * d).reshape(n, k)


def call(lib: ctypes.CDLL, fn: str, x: torch.Tensor, panels: torch.Tensor, n: int, mode: str,
         out: torch.Tensor) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    m, k = x.shape
    if mode == "silu":
        rc = getattr(lib, f"{fn}_silu")(p(x.data_ptr()), i64(m), i64(k), i64(k), p(panels.data_ptr()), i64(n),
                                        p(out.data_ptr()), i64(n // 2))
    else:
        rc = getattr(lib, fn)(p(x.data_ptr()), i64(m), i64(k), i64(k), p(panels.data_ptr()), i64(n), None,
                              p(out.data_ptr()), i64(n))
    assert rc == 0, "the GEMM refused the shape"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[7, 8, 10, 13, 16, 20, 32, 64, 100])
    ap.add_argument("--panels", choices=["fp32", "q4"], default="fp32")
    ap.add_argument("--layers", type=int, default=30)
    libs, args = ab_setup("gemm_f32", ap)
    packer = load_gemm_f32()
    nr = packer.gemm_f32_panel()
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(args.layers):
        for k, n, mode in SHAPES:
            w = q4_weight(n, k, g)
            packed = pack_panels_f32(w, nr)
            if args.panels == "q4":
                found = pack_panels_lowbit(w, packed, nr, packer)
                assert found is not None and found[1] == 4, "the weights have no 4-bit form"
                packed = found[0]
            layers.append((k, n, mode, packed))
    fn = "gemm_f32_q4" if args.panels == "q4" else "gemm_f32"
    print(f"level {current_level().name}, {torch.get_num_threads()} threads, {args.panels} panels, "
          f"median of {args.repeats} steps of {args.layers} layers")
    for m in args.rows:
        xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}
        outs = {name: [torch.zeros(m, n // 2 if mode else n) for _, n, mode, _ in layers] for name in libs}

        def step(name: str, lib: ctypes.CDLL) -> None:
            for (k, n, mode, packed), out in zip(layers, outs[name]):
                call(lib, fn, xs[k], packed, n, mode, out)

        times = time_interleaved(libs, step, args.repeats)
        a, b = (statistics.median(times[name]) for name in libs)
        same = all(torch.equal(x, y) for x, y in zip(outs["baseline"], outs["this"]))
        print(f"M={m:4d}: baseline {a * 1e3:7.2f} ms, this {b * 1e3:7.2f} ms = {b / a:.3f}x, "
              f"{'bit-identical' if same else 'OUTPUTS DIFFER'}")


if __name__ == "__main__":
    main()

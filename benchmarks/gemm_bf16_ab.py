"""The bf16 panel GEMM (csrc/gemm_bf16.c: plain, with the SiLU epilogue, greedy argmax): this
checkout's against another checkout's, interleaved in one process (the host's load drifts;
alternating calls see the same).

    python benchmarks/gemm_bf16_ab.py --baseline /path/to/other/checkout [--repeats 30]

Shapes: SmolLM2-135M's projections at a prefill step of 1,024 tokens and a decode step of
64, its greedy lm_head at 64 and 256 rows, and BERT-base's at 4,096 tokens. Prints each
kernel's median call time, its GFLOP/s and whether the outputs are bit-identical.
"""
from __future__ import annotations

import ctypes
import statistics

import torch

from checkout_kernels import ab_setup, time_interleaved
from inflight.kernels.cpu.gemm_bf16 import pack_panels
from inflight.kernels.cpu.isa import current_level

# M, K, N, epilogue (silu: N counts gate and up columns together; argmax: greedy over a
# vocabulary's logits, nothing stored but the best column of each row)
CASES = [(1024, 576, 3072, "silu"), (1024, 576, 960, ""), (1024, 576, 576, ""), (1024, 1536, 576, ""),
         (64, 576, 3072, "silu"), (64, 576, 49152, "argmax"), (256, 576, 49152, "argmax"),
         (4096, 768, 2304, ""), (4096, 768, 3072, ""), (4096, 3072, 768, "")]


def call(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, n: int, mode: str, out: torch.Tensor) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    m, k = x.shape
    if mode == "argmax":
        rc = lib.gemm_bf16_argmax(p(x.data_ptr()), i64(m), i64(k), i64(k), p(packed.data_ptr()), i64(n),
                                  p(out.data_ptr()))
    elif mode == "silu":
        rc = lib.gemm_bf16_silu(p(x.data_ptr()), i64(m), i64(k), i64(k), p(packed.data_ptr()), i64(n),
                                p(out.data_ptr()), i64(n // 2))
    else:
        rc = lib.gemm_bf16(p(x.data_ptr()), i64(m), i64(k), i64(k), p(packed.data_ptr()), i64(n), None,
                           p(out.data_ptr()), i64(n))
    assert rc == 0, "the GEMM refused the shape"


def main() -> None:
    libs, args = ab_setup("gemm_bf16")
    g = torch.Generator().manual_seed(0)
    print(f"level {current_level().name}, {torch.get_num_threads()} threads, median of {args.repeats}")
    for m, k, n, mode in CASES:
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        packed = pack_panels((torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16), 32)
        shape, dtype = ((m,), torch.int64) if mode == "argmax" else ((m, n // 2 if mode else n), torch.bfloat16)
        outs = {name: torch.zeros(shape, dtype=dtype) for name in libs}
        times = time_interleaved(libs, lambda name, lib: call(lib, x, packed, n, mode, outs[name]), args.repeats)
        a, b = (statistics.median(times[name]) for name in libs)
        gflop = 2 * m * k * n / 1e9
        same = torch.equal(outs["baseline"], outs["this"])
        print(f"M={m:4d} K={k:4d} N={n:4d}{mode:>7}: baseline {a * 1e3:6.2f} ms "
              f"({gflop / a:4.0f} GFLOP/s), this {b * 1e3:6.2f} ms ({gflop / b:4.0f} GFLOP/s) = {b / a:.2f}x, "
              f"{'bit-identical' if same else 'OUTPUTS DIFFER'}")


if __name__ == "__main__":
    main()

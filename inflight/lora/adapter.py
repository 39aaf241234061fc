"""A PEFT LoRA adapter folder read into the weights the LoRA layers add: per adapted
module a shrink (A) and an expand (B, the scaling folded in) linear; the shards of a
fused module (q/k/v -> qkv_proj) stacked into one A and a block-diagonal B, so a fused
projection adds its whole delta with two GEMMs."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from inflight.lora.request import LoRARequest

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# PEFT's names: base_model.model.<the HF module path>.lora_A.weight (older files add ".default")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")


@dataclass(frozen=True)
class LoRATarget:
    """A module of the model an adapter may adapt: its input and output features and,
    for a fused projection, the rows of each shard in shard order."""

    in_features: int
    out_features: int
    shard_rows: Optional[tuple[int, ...]] = None
    # the order the model keeps the output rows in (new[j] = old[row_order[j]]) where it is not the checkpoint's
    row_order: Optional[tuple[int, ...]] = None


class MatmulLinear(nn.Module):
    """``x @ W.T`` with W [out, in] kept transposed: the LoRA weights' holder where the
    platform has no packed linear."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight_t", weight.t().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_t


# a weight [out, in] on the model's device and dtype -> the module that applies it
LinearFactory = Callable[[torch.Tensor, Optional[torch.Tensor]], nn.Module]


@dataclass
class LoRAAdapter:
    """An adapter's weights: module name -> (shrink: x -> x A^T, expand: -> . B^T)."""

    request: LoRARequest
    rank: int
    weights: dict[str, tuple[nn.Module, nn.Module]]
    layouts: dict[str, Any] = field(default_factory=dict)  # the weights as a fused kernel reads them, by kernel


def read_adapter(req: LoRARequest, targets: dict[str, LoRATarget], stacked: dict[str, tuple[str, int]],
                 max_rank: int, dtype: torch.dtype, device: torch.device,
                 linear: Optional[LinearFactory] = None) -> LoRAAdapter:
    """Load and check the adapter folder ``req.lora_path`` against the model's ``targets``.

    ValueError naming the adapter for anything the layers cannot run: a missing folder or
    file, another PEFT method, DoRA, biases, extra saved modules, a rank above
    ``max_rank``, a module the model does not have, or a shape that does not fit it.
    ``linear`` holds each weight (the platform's packed linear; default: MatmulLinear)."""
    cfg = _read_config(req)
    try:
        alpha = float(cfg.get("lora_alpha", cfg.get("r", 8)))
    except (TypeError, ValueError):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: lora_alpha must be a number, "
                         f"got {str(cfg.get('lora_alpha'))[:50]!r}") from None
    if not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: lora_alpha must be finite, got {alpha}")
    sqrt = bool(cfg.get("use_rslora", False))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in _read_tensors(req).items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: unexpected tensor {key!r} (only lora_A/lora_B weights)")
        pairs.setdefault(m["module"], {})[m["ab"]] = t
    shards: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    rank = 0
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {module} has lora_{next(iter(ab))} only")
        target, shard = _target(module, stacked, targets, req)
        a, b = ab["A"], ab["B"]
        if not (a.is_floating_point() and b.is_floating_point() and a.isfinite().all() and b.isfinite().all()):
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {module} has weights that are not finite floats")
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {module}'s lora_A and lora_B must be matrices")
        r = a.shape[0]
        if r > max_rank:
            raise ValueError(f"LoRA adapter {req.lora_name!r} has rank {r}, above max_lora_rank={max_rank}; "
                             "start the engine with a larger max_lora_rank")
        info = targets[target]
        rows = info.out_features if shard is None else info.shard_rows[shard]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != info.in_features or tuple(b.shape) != (rows, r):
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {module} has lora_A {tuple(a.shape)} and lora_B "
                             f"{tuple(b.shape)}; this model needs ({r}, {info.in_features}) and ({rows}, {r})")
        scale = alpha / (math.sqrt(r) if sqrt else r)
        shards.setdefault(target, []).append((shard, a.float(), b.float() * scale))
        rank = max(rank, r)
    if not shards:
        raise ValueError(f"LoRA adapter {req.lora_name!r} has no lora_A/lora_B weights")
    make = linear or MatmulLinear
    weights = {}
    for name, parts in shards.items():
        a, b = _fuse(parts, targets[name])
        if targets[name].row_order is not None:
            b = b[list(targets[name].row_order)]
        weights[name] = (make(a.to(device, dtype), None), make(b.to(device, dtype), None))
    return LoRAAdapter(req, rank, weights)


def _read_config(req: LoRARequest) -> dict:
    path = os.path.join(req.lora_path, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: no {ADAPTER_CONFIG} in {req.lora_path!r}")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"LoRA adapter {req.lora_name!r}: cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: {ADAPTER_CONFIG} must hold a JSON object")
    unsupported = [
        (cfg.get("peft_type", "LORA") != "LORA", f"peft_type {cfg.get('peft_type')!r} (only LORA)"),
        (bool(cfg.get("use_dora")), "DoRA (use_dora)"),
        (cfg.get("bias", "none") != "none", f"bias={cfg.get('bias')!r}"),
        (bool(cfg.get("modules_to_save")), f"modules_to_save {cfg.get('modules_to_save')}"),
        (bool(cfg.get("alpha_pattern")), "alpha_pattern"),
        (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out"),
    ]
    for bad, what in unsupported:
        if bad:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {what} is not supported")
    return cfg


def _read_tensors(req: LoRARequest) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = os.path.join(req.lora_path, name)
        if not os.path.isfile(path):
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                return load_file(path)
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: cannot read {path}: {e}") from None
    raise ValueError(f"LoRA adapter {req.lora_name!r}: no {' or '.join(WEIGHT_FILES)} in {req.lora_path!r}")


def _target(module: str, stacked: dict[str, tuple[str, int]], targets: dict[str, LoRATarget],
            req: LoRARequest) -> tuple[str, Optional[int]]:
    """The model module an HF module name adapts, and its shard of a fused projection."""
    prefix, _, last = module.rpartition(".")
    if last in stacked:
        fused, shard = stacked[last]
        name = f"{prefix}.{fused}" if prefix else fused
        if name in targets and targets[name].shard_rows is not None:
            return name, shard
    if module in targets:
        return module, None
    raise ValueError(f"LoRA adapter {req.lora_name!r} adapts {module}, which is not a linear layer of this "
                     "model's decoder layers")


def _fuse(parts: list[tuple[Optional[int], torch.Tensor, torch.Tensor]],
          target: LoRATarget) -> tuple[torch.Tensor, torch.Tensor]:
    """One (A, B) for a module: shards' A stacked, their B placed block-diagonally at their
    rows; an adapter of the whole fused module (Phi-3's ``qkv_proj``: shard None) as it is."""
    if len(parts) == 1 and (target.shard_rows is None or parts[0][0] is None):
        _, a, b = parts[0]
        return a.contiguous(), b.contiguous()
    if any(shard is None for shard, _, _ in parts):
        raise ValueError("an adapter adapts a fused projection both whole and by its parts")
    offsets = [0]
    for rows in target.shard_rows:
        offsets.append(offsets[-1] + rows)
    a_all = torch.cat([a for _, a, _ in parts])
    b_all = torch.zeros(target.out_features, a_all.shape[0])
    col = 0
    for shard, a, b in parts:
        b_all[offsets[shard]:offsets[shard + 1], col:col + a.shape[0]] = b
        col += a.shape[0]
    return a_all, b_all

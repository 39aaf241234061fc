"""The model's linear layers with the LoRA deltas of this step's adapters added
(vLLM's ``BaseLayerWithLoRA``): each wrapped layer runs its own (packed) projection,
then, for each run of rows with an adapter, ``y[rows] += (x[rows] @ A.T) @ B.T``
(the same GEMM calls on the same rows, and the same roundings to the model's dtype,
as the fused layer loop: csrc/llama_layers.c). Rows without an adapter get the base
output alone."""
from __future__ import annotations

import re
from typing import Optional

import torch
from torch import nn

from inflight.lora.adapter import LoRAAdapter, LoRATarget

# the projections inside decoder layers; not the embedding, the logits head or an MoE router
_DECODER_LINEAR = re.compile(r"^layers\.\d+\..+_proj$")


class LoRABatch:
    """This step's runs of consecutive rows of the flattened batch with an adapter:
    (first row, end row, adapter); empty in a step without adapters (the layers then add nothing)."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, LoRAAdapter]] = []

    @property
    def active(self) -> bool:
        return bool(self.runs)


class LoRALinear(nn.Module):
    """``base_layer`` plus the deltas of this step's adapters for module ``name``."""

    def __init__(self, base_layer: nn.Module, name: str, batch: LoRABatch) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.lora_module_name = name
        self.lora_batch = batch

    def __getattr__(self, attr: str):
        try:
            return super().__getattr__(attr)
        except AttributeError:  # the base layer's sizes and methods (in_features, shard_rows, ...)
            return getattr(self._modules["base_layer"], attr)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        for start, end, adapter in self.lora_batch.runs:
            w = adapter.weights.get(self.lora_module_name)
            if w is not None:
                shrink, expand = w
                y[start:end] += expand(shrink(x[start:end]))
        return y


def wrap_linears(model: nn.Module, fused: dict[str, list[int]], batch: LoRABatch,
                 row_orders: Optional[dict[str, list[int]]] = None) -> dict[str, LoRATarget]:
    """Replace every projection of the decoder layers by a LoRALinear reading ``batch``;
    returns what each may be adapted with, by module name. ``fused``: the rows of each
    shard of the fused projections, by their short name (the model's ``stacked_shard_rows``);
    ``row_orders``: output rows the model keeps in another order (its ``row_orders``)."""
    found = [(name, module) for name, module in model.named_modules()
             if _DECODER_LINEAR.match(name) and hasattr(module, "in_features") and hasattr(module, "out_features")]
    targets = {}
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        rows = fused.get(child)
        order = (row_orders or {}).get(child)
        targets[name] = LoRATarget(module.in_features, module.out_features, tuple(rows) if rows else None,
                                   tuple(order) if order else None)
        setattr(model.get_submodule(parent_name), child, LoRALinear(module, name, batch))
    return targets

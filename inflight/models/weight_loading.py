"""Checkpoint tensors -> model parameters, one tensor at a time.

A model declares (through its ``ArchSpec``) which checkpoint tensors are shards of one
fused parameter (q/k/v -> qkv_proj, gate/up -> gate_up_proj) and (through
``stacked_shard_rows``) how many rows each shard has. ``plan_copies`` turns the
checkpoint's names and shapes into copies into row ranges of parameters, checking
that every parameter is covered exactly; ``load_checkpoint`` runs them, reading each
tensor straight into its rows (cast on the way) so no second copy of the model exists.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # recomputed from the config


class SkipParamInit(TorchFunctionMode):
    """Turns the ``torch.nn.init`` fills that module constructors run into no-ops.

    Used while the model is built on the meta device: those values are never kept
    (``to_empty`` + ``load_weights`` replace every parameter), yet initializing a meta
    tensor goes through torch's Python decompositions, whose first use imports
    torch._dynamo (about 1 s of start-up). Torch function modes are per-thread, so
    modules built by other threads at the same time are unaffected.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@dataclass(frozen=True)
class TensorCopy:
    """Copy checkpoint tensor ``checkpoint`` into rows [start, start + rows) of ``param``."""

    checkpoint: str
    param: str
    start: int
    rows: int


def _checkpoint_name(param: str) -> str:
    return param if param.startswith("lm_head") else f"model.{param}"


def _expected_shards(params: dict[str, nn.Parameter], stacked: dict[str, tuple[str, int]]) -> dict[str, dict]:
    """param name -> {shard index: checkpoint name} for every parameter the checkpoint must fill."""
    out: dict[str, dict[int, str]] = {}
    for pname in params:
        parts = pname.split(".")
        shards = {idx: _checkpoint_name(pname.replace(f".{fused}.", f".{frag}."))
                  for frag, (fused, idx) in stacked.items() if fused in parts}
        out[pname] = shards or {0: _checkpoint_name(pname)}
    return out


def plan_copies(model: nn.Module, stacked: dict[str, tuple[str, int]], shapes: Mapping[str, tuple],
                origin: str = "the checkpoint") -> list[TensorCopy]:
    """The copies that load a checkpoint with these tensor ``shapes`` into ``model``.

    ValueError (naming the tensor and ``origin``) for an unexpected, missing or
    misshapen tensor."""
    params = dict(model.named_parameters())
    shard_rows = model.stacked_shard_rows() if hasattr(model, "stacked_shard_rows") else {}
    tied = getattr(model, "lm_head", True) is None
    copies, seen = [], set()
    for name, shape in shapes.items():
        if name.endswith(_SKIPPED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue  # a tied checkpoint may still carry a copy of the embedding
        pname, start, idx, fused = name.removeprefix("model."), 0, 0, None
        for frag, (fused_frag, i) in stacked.items():
            if f".{frag}." in pname:
                pname, idx, fused = pname.replace(f".{frag}.", f".{fused_frag}."), i, fused_frag
                break
        if pname not in params:
            raise ValueError(f"unexpected tensor {name} in {origin}")
        want = tuple(params[pname].shape)
        if fused is not None:
            sizes = shard_rows[fused]
            start, want = sum(sizes[:idx]), (sizes[idx], *want[1:])
        if tuple(shape) != want:
            raise ValueError(f"tensor {name} in {origin} has shape {tuple(shape)}, config implies {want}")
        copies.append(TensorCopy(name, pname, start, want[0] if want else 1))
        seen.add((pname, idx))
    for pname, shards in _expected_shards(params, stacked).items():
        for idx, ckpt in shards.items():
            if (pname, idx) not in seen:
                raise ValueError(f"tensor {ckpt} missing from {origin}")
    return copies


@torch.no_grad()
def load_checkpoint(model: nn.Module, stacked: dict[str, tuple[str, int]], weights: Any) -> None:
    """Read every tensor of ``weights`` into ``model``'s parameters in their dtype and device.

    ``weights``: a loader WeightSource (streams from disk), or a mapping / iterable
    of (name, tensor) pairs."""
    from inflight.loader.stream import TensorDictSource

    if not hasattr(weights, "read_into"):
        weights = TensorDictSource(dict(weights.items() if isinstance(weights, Mapping) else weights))
    params = dict(model.named_parameters())
    for c in plan_copies(model, stacked, {n: weights.shape(n) for n in weights.keys()}):
        dest = params[c.param].data
        if c.start or c.rows != dest.shape[0]:
            dest = dest.narrow(0, c.start, c.rows)
        weights.read_into(c.checkpoint, dest)

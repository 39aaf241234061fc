"""Checkpoint tensors -> model parameters, one tensor at a time.

A model declares (through its ``ArchSpec``) which checkpoint tensors are shards of one
fused parameter (q/k/v -> qkv_proj, gate/up -> gate_up_proj) and (through
``stacked_shard_rows``) how many rows each shard has. ``plan_copies`` turns the
checkpoint's names and shapes into copies into row ranges of parameters, checking
that every parameter is covered exactly; ``load_checkpoint`` runs them, reading each
tensor straight into its rows (cast on the way) so no second copy of the model exists.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # recomputed from the config
_EXPERT_FRAGMENT = re.compile(r"(?:^|\.)(experts\.\d+\.[^.]+\.)")  # "experts.{e}.{projection}."


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
    # Tensor parallelism: only these ranges of the checkpoint tensor along ``dim``,
    # concatenated (None: the whole tensor).
    segments: Optional[tuple[int, tuple[tuple[int, int], ...]]] = None
    expert: Optional[int] = None  # rows of ``param[expert]`` (stacked mixture-of-experts weights)


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
    # checkpoint fragment -> (param fragment, checkpoint fragment, expert, shard id)
    experts = {m[1]: m for m in (model.expert_params_mapping() if hasattr(model, "expert_params_mapping") else [])}
    tied = getattr(model, "lm_head", True) is None
    # a model whose checkpoints name its tensors otherwise (an encoder's "bert." prefix, heads
    # it does not run) maps each name to its own, None for one it does not load
    rename = getattr(model, "checkpoint_rename", None)
    copies, seen = [], set()
    for name, shape in shapes.items():
        if name.endswith(_SKIPPED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue  # a tied checkpoint may still carry a copy of the embedding
        own = name if rename is None else rename(name)
        if own is None:
            continue
        copy = _expert_copy(name, tuple(shape), params, experts, origin)
        if copy is not None:
            copies.append(copy)
            seen.add((copy.param, (copy.expert, copy.start)))
            continue
        pname, start, idx, fused = own.removeprefix("model."), 0, 0, None
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
        segments = _tp_segments(model, pname, idx if fused is not None else None, shape)
        got = tuple(shape) if segments is None else _cut_shape(tuple(shape), segments)
        if got != want:
            raise ValueError(f"tensor {name} in {origin} has shape {tuple(shape)}, config implies {want}")
        copies.append(TensorCopy(name, pname, start, want[0] if want else 1, segments))
        seen.add((pname, idx))
    for pname, shards in {**_expected_shards(params, stacked), **_expected_experts(params, experts)}.items():
        for idx, ckpt in shards.items():
            if (pname, idx) not in seen:
                raise ValueError(f"tensor {ckpt} missing from {origin}")
    return copies


def _expert_target(pname: str, experts: dict) -> Optional[tuple[str, int, str]]:
    """(parameter, expert, shard id) of a per-expert checkpoint tensor, else None; ``experts``
    holds the model's ``expert_params_mapping()`` (layers/moe.py) by checkpoint fragment."""
    m = _EXPERT_FRAGMENT.search(pname)
    hit = experts.get(m.group(1)) if m else None
    if hit is None:
        return None
    param_frag, ckpt_frag, expert, shard = hit
    return pname[:m.start(1)] + param_frag + pname[m.end(1):], expert, shard


def _expert_rows(param: nn.Parameter, shard: str) -> tuple[int, int]:
    """(start, rows) of a shard in one expert's slice: gate (w1) and up (w3) halves of w13, all of w2."""
    rows = param.shape[1] // 2 if shard in ("w1", "w3") else param.shape[1]
    return (rows if shard == "w3" else 0), rows


def _expert_copy(name: str, shape: tuple, params: dict, experts: dict, origin: str) -> Optional[TensorCopy]:
    """The copy of one expert's gate, up or down projection into its stacked parameter."""
    target = _expert_target(name.removeprefix("model."), experts)
    if target is None:
        return None
    pname, expert, shard = target
    if pname not in params:
        raise ValueError(f"unexpected tensor {name} in {origin}")
    start, rows = _expert_rows(params[pname], shard)
    want = (rows, *params[pname].shape[2:])
    if shape != want or expert >= params[pname].shape[0]:
        raise ValueError(f"tensor {name} in {origin} has shape {shape}, config implies {want}")
    return TensorCopy(name, pname, start, rows, expert=expert)


def _expected_experts(params: dict, experts: dict) -> dict[str, dict]:
    """stacked expert parameter -> {(expert, start row): checkpoint name} the checkpoint must fill."""
    out: dict[str, dict] = {}
    for pname, param in params.items():
        for param_frag, ckpt_frag, expert, shard in experts.values():
            if pname.endswith(f"{param_frag}weight"):
                ckpt = pname.replace(f"{param_frag}weight", f"{ckpt_frag}weight")
                out.setdefault(pname, {})[(expert, _expert_rows(param, shard)[0])] = _checkpoint_name(ckpt)
    return out


def _tp_segments(model: nn.Module, pname: str, shard: Optional[int], shape: tuple):
    """The ranges of the checkpoint tensor this rank's parameter holds (None: all of it)."""
    path, _, attr = pname.rpartition(".")
    module = model.get_submodule(path) if path else model
    cut = getattr(module, "checkpoint_shard", None)
    if cut is None:
        return None
    segments = cut(attr, shard)
    if segments is None:
        return None
    dim, ranges = segments
    return (dim if dim >= 0 else len(shape) + dim, tuple(tuple(r) for r in ranges))


def _cut_shape(shape: tuple, segments: tuple) -> tuple:
    dim, ranges = segments
    if dim >= len(shape) or any(s < 0 or s + n > shape[dim] for s, n in ranges):
        return ()  # the checkpoint tensor is too small for the shard: reported as misshapen
    return (*shape[:dim], sum(n for _, n in ranges), *shape[dim + 1:])


def _read_segments(weights: Any, name: str, segments: tuple, dest: torch.Tensor) -> None:
    """Read one checkpoint tensor and keep only this rank's ranges of it (one tensor in memory at a time)."""
    dim, ranges = segments
    full = weights[name]
    dest.copy_(torch.cat([full.narrow(dim, s, n) for s, n in ranges], dim=dim))


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
        if c.expert is not None:
            dest = dest[c.expert]
        if c.start or c.rows != dest.shape[0]:
            dest = dest.narrow(0, c.start, c.rows)
        if c.segments is not None:
            _read_segments(weights, c.checkpoint, c.segments, dest)
        else:
            weights.read_into(c.checkpoint, dest)

"""Checks shared by every format: the weights must fit the config they came with."""

from __future__ import annotations

from typing import Any

import torch

from .stream import WeightSource
from .types import ModelLoadError


def check_weights(weights: WeightSource, cfg: dict[str, Any], source: str) -> WeightSource:
    """Check every tensor's name and shape against the model ``cfg`` describes (from
    the file headers: nothing is read) and return ``weights`` without the tensors the
    engine does not load (RoPE buffers, a tied checkpoint's copy of the embedding).

    The check is the model's own loading plan, run on a skeleton on the meta device,
    so it accepts exactly what loading will."""
    from inflight.models.registry import ModelArchConfig, arch_spec
    from inflight.models.weight_loading import plan_copies
    from inflight.models.weight_loading import SkipParamInit

    try:
        arch = ModelArchConfig.from_hf(cfg)
        spec = arch_spec(arch.architecture)
        with torch.device("meta"), SkipParamInit():
            skeleton = spec.model_class(arch, None, 1)
        copies = plan_copies(skeleton, spec.stacked, {n: weights.shape(n) for n in weights.keys()}, source)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc
    weights.keep({c.checkpoint for c in copies})
    return weights

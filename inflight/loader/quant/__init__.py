"""Quantized HF checkpoints (GPTQ, AWQ, FP8, compressed-tensors), loaded as float weights."""
from __future__ import annotations

import logging
from typing import Any, Optional

from ..stream import WeightSource
from .config import QUANTIZATION_CHOICES, QuantConfig, quant_config
from .source import DequantSource

__all__ = ["QUANTIZATION_CHOICES", "QuantConfig", "quant_config", "dequantized"]

logger = logging.getLogger(__name__)


def dequantized(weights: WeightSource, cfg: dict[str, Any], source: str,
                requested: Optional[str] = None) -> WeightSource:
    """``weights`` with each quantized layer dequantized as it is read (``weights`` itself
    when the checkpoint is not quantized); ModelLoadError for a form not supported or one
    that differs from ``requested`` (vLLM's ``quantization``)."""
    qc = quant_config(cfg, source, requested)
    if qc is None:
        return weights
    out = DequantSource(weights, qc)
    form = "fp8" if qc.float8 else f"{qc.bits}-bit, group {qc.group_size}"
    logger.info("%s checkpoint (%s): %d quantized layers, dequantized into the model's dtype as they load",
                qc.method, form, sum(1 for p in out.entries.values() if p is not None))
    return out

"""Quantized HF checkpoints (GPTQ, AWQ, FP8, compressed-tensors), loaded as float weights."""
from __future__ import annotations

from typing import Any, Optional

from ..stream import WeightSource
from .config import QUANTIZATION_CHOICES, QuantConfig, quant_config
from .source import DequantSource

__all__ = ["QUANTIZATION_CHOICES", "QuantConfig", "quant_config", "dequantized"]


def dequantized(weights: WeightSource, cfg: dict[str, Any], source: str,
                requested: Optional[str] = None) -> WeightSource:
    """``weights`` with each quantized layer dequantized as it is read (``weights`` itself
    when the checkpoint is not quantized); ModelLoadError for a form not supported or one
    that differs from ``requested`` (vLLM's ``quantization``)."""
    qc = quant_config(cfg, source, requested)
    return weights if qc is None else DequantSource(weights, qc)

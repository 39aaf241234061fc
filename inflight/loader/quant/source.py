"""A checkpoint's quantized linear layers seen as the float weights the model loads.

``DequantSource`` wraps the file's ``WeightSource``: each quantized layer's tensors
(``qweight``, ``qzeros``, ``scales`` ...; ``weight_packed``, ``weight_scale`` ...; an FP8
``weight`` with its scale) become one ``<prefix>.weight`` entry of the layer's float shape,
dequantized one layer at a time when the model reads it and cast into the parameter on the
way, so loading never holds more than one layer in float32 beside the model. Every other
tensor passes through as stored.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..stream import WeightSource
from .config import QuantConfig
from .dequant import awq_weight, fp8_weight, gptq_weight, packed_int_shape, packed_int_weight

# per method: the tensor that marks a quantized layer, and the others that belong to it
_MARKERS = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}
_PARTS = ("qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point",
          "weight_shape", "weight_g_idx", "weight_scale_inv")
# static activation and KV cache scales: the engine computes activations unquantized and
# keeps its own KV scales, so these have no parameter to go to
_DROPPED = ("input_scale", "input_zero_point", "k_scale", "v_scale", "output_scale")
_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class DequantSource(WeightSource):
    """``base`` with its quantized layers (as ``qc`` stores them) turned into float32 weights."""

    def __init__(self, base: WeightSource, qc: QuantConfig) -> None:
        self.base, self.qc = base, qc
        self.names = set(base.keys())
        self.entries: dict[str, object] = {}
        layers = self._layers()
        for name in base.keys():
            prefix, _, part = name.rpartition(".")
            if prefix in layers and (part in _PARTS or part == "weight"):
                continue
            if part not in _DROPPED:
                self.entries[name] = None  # stored as is
        for prefix in layers:
            self.entries[f"{prefix}.weight"] = prefix

    def _layers(self) -> set[str]:
        """The name prefixes of the quantized layers."""
        if self.qc.float8:
            return {n.rpartition(".")[0] for n in self.names
                    if n.endswith(".weight") and self.base.dtype(n) in _FLOAT8}
        marker = "." + _MARKERS[self.qc.method]
        return {n.removesuffix(marker) for n in self.names if n.endswith(marker)}

    def _read(self, name: str) -> torch.Tensor:
        return self.base[name]

    def _dequant(self) -> Callable:
        if self.qc.float8:
            return fp8_weight
        return {"gptq": gptq_weight, "awq": awq_weight, "compressed-tensors": packed_int_weight}[self.qc.method]

    def shape(self, name: str) -> tuple[int, ...]:
        prefix = self.entries[name]
        if prefix is None:
            return self.base.shape(name)
        if self.qc.float8:
            return self.base.shape(name)
        if self.qc.method == "compressed-tensors":
            return packed_int_shape(self._read, prefix, self.qc, self.names)
        rows, cols = self.base.shape(f"{prefix}.qweight")
        if self.qc.method == "gptq":
            return cols, rows * 32 // self.qc.bits
        return cols * 32 // self.qc.bits, rows

    def dtype(self, name: str) -> torch.dtype:
        return self.base.dtype(name) if self.entries[name] is None else torch.float32

    def read_into(self, name: str, out: torch.Tensor) -> None:
        prefix = self.entries[name]
        if prefix is None:
            self.base.read_into(name, out)
            return
        w = self._dequant()(self._read, prefix, self.qc, self.names)
        if tuple(out.shape) != tuple(w.shape):
            raise ValueError(f"{name}: shape {tuple(w.shape)} does not fit {tuple(out.shape)}")
        out.copy_(w)

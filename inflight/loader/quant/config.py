"""The ``quantization_config`` of a quantized HF checkpoint, read into one typed record.

Four producers write the checkpoints vLLM users run: AutoGPTQ / GPTQModel (``gptq``),
AutoAWQ (``awq``), transformers' fine-grained FP8 (``fp8``, DeepSeek and Qwen3 ship it)
and llm-compressor (``compressed-tensors``: packed int4/int8 weights or FP8). Each is
checked here, with vLLM's words for what it refuses, before any tensor is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..types import ModelLoadError

# what vLLM's --quantization accepts for each checkpoint method (its kernel variants included)
METHOD_ALIASES = {
    "gptq": ("gptq", "gptq_marlin", "auto_gptq"),
    "awq": ("awq", "awq_marlin"),
    "fp8": ("fp8",),
    "compressed-tensors": ("compressed-tensors", "compressed_tensors"),
}
QUANTIZATION_CHOICES = tuple(sorted({a for names in METHOD_ALIASES.values() for a in names} | {"gguf"}))


@dataclass(frozen=True)
class QuantConfig:
    """How a checkpoint's linear weights are stored. ``bits``/``group_size``/``sym`` for the
    integer forms (``group_size`` -1: one group per row); ``zero_offset`` is what GPTQ's
    original format subtracted from each stored zero point; ``float8`` marks FP8 weights,
    ``block`` their scale blocks (rows, columns) where they have them."""

    method: str
    bits: int = 4
    group_size: int = -1
    sym: bool = True
    zero_offset: int = 0
    float8: bool = False
    block: Optional[tuple[int, int]] = None


def _bad(method: str, what: str) -> ModelLoadError:
    return ModelLoadError(f"{method} checkpoint: {what} is not supported")


def _gptq(q: dict[str, Any]) -> QuantConfig:
    bits = int(q.get("bits", 4))
    if bits not in (4, 8):
        raise _bad("GPTQ", f"bits={bits} (4 and 8 are)")
    if q.get("dynamic"):
        raise _bad("GPTQ", "a per-module `dynamic` override")
    fmt = q.get("checkpoint_format") or q.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise _bad("GPTQ", f"checkpoint_format {fmt!r} (gptq and gptq_v2 are)")
    # NOTE: the original GPTQ format stores each zero point minus one; gptq_v2 stores it as is.
    return QuantConfig("gptq", bits, int(q.get("group_size", -1)), bool(q.get("sym", True)),
                       zero_offset=1 if fmt == "gptq" else 0)


def _awq(q: dict[str, Any]) -> QuantConfig:
    bits = int(q.get("bits", q.get("w_bit", 4)))
    version = str(q.get("version", "gemm")).lower()
    if bits != 4:
        raise _bad("AWQ", f"bits={bits} (4 is)")
    if version != "gemm":
        raise _bad("AWQ", f"version {version!r} (gemm is, as in vLLM)")
    if not q.get("zero_point", True):
        raise _bad("AWQ", "zero_point=false")
    return QuantConfig("awq", 4, int(q.get("group_size", q.get("q_group_size", -1))), sym=False)


def _fp8(q: dict[str, Any]) -> QuantConfig:
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _bad("FP8", f"fmt {fmt!r} (e4m3 is)")
    block = q.get("weight_block_size")
    return QuantConfig("fp8", 8, float8=True, block=tuple(int(b) for b in block) if block else None)


def _compressed(q: dict[str, Any]) -> QuantConfig:
    groups = list((q.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise _bad("compressed-tensors", f"{len(groups)} config groups (one is)")
    w = groups[0].get("weights") or {}
    fmt = groups[0].get("format") or q.get("format")
    kind, bits, strategy = w.get("type", "int"), int(w.get("num_bits", 0)), w.get("strategy")
    if kind == "float" and bits == 8 and fmt in ("float-quantized", "naive-quantized"):
        block = w.get("block_structure") if strategy == "block" else None
        return QuantConfig("compressed-tensors", 8, float8=True, block=tuple(block) if block else None)
    if kind != "int" or bits not in (4, 8) or fmt != "pack-quantized":
        raise _bad("compressed-tensors", f"{kind}{bits} weights in format {fmt!r} "
                   "(pack-quantized int4/int8 and float-quantized fp8 are)")
    if not w.get("symmetric", True):
        raise _bad("compressed-tensors", "asymmetric (zero-point) int weights")
    if strategy not in ("group", "channel"):
        raise _bad("compressed-tensors", f"strategy {strategy!r} for int weights (group and channel are)")
    return QuantConfig("compressed-tensors", bits, int(w.get("group_size") or -1) if strategy == "group" else -1)


_PARSERS = {"gptq": _gptq, "awq": _awq, "fp8": _fp8, "compressed-tensors": _compressed}


def quant_config(cfg: dict[str, Any], source: str, requested: Optional[str] = None) -> Optional[QuantConfig]:
    """The checkpoint's quantization (None for plain weights), checked against what the
    user asked for with ``quantization`` (vLLM's flag: a method or one of its kernel names)."""
    raw = cfg.get("quantization_config") or cfg.get("compression_config")
    method = str(raw.get("quant_method", "")).lower().replace("_", "-") if isinstance(raw, dict) else None
    if requested is not None and requested not in QUANTIZATION_CHOICES:
        raise ModelLoadError(f"quantization={requested!r} is not one of {', '.join(QUANTIZATION_CHOICES)}")
    if method is None:
        if requested is not None:
            raise ModelLoadError(f"quantization={requested!r}: {source} is not quantized, and quantizing "
                                 "a model while loading it is not supported; load a quantized checkpoint")
        return None
    if method not in _PARSERS:
        raise ModelLoadError(f"{source}: quantization method {method!r} is not supported "
                             f"(gptq, awq, fp8 and compressed-tensors are)")
    if requested is not None and requested not in METHOD_ALIASES[method]:
        raise ModelLoadError(f"Quantization method specified in the model config ({method}) does not match "
                             f"the quantization method specified in the `quantization` argument ({requested}).")
    return _PARSERS[method](raw)

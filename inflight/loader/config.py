"""Normalise HF-style config dicts so the engine reads one set of keys.

config.json files differ by the transformers version that wrote them (v5
writes ``rope_parameters`` and ``dtype``; v4 writes ``rope_theta``,
``rope_scaling`` and ``torch_dtype``) and by what they leave to defaults
(``head_dim``, ``num_key_value_heads``). GGUF metadata is translated into the
same dict and passes through here too.
"""

from __future__ import annotations

from typing import Any, Iterable

from .types import SUPPORTED_ARCHITECTURES, ModelLoadError, unsupported_architecture

_MODEL_TYPE_TO_ARCH = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
_REQUIRED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)


def _resolve_architecture(cfg: dict[str, Any], source: str) -> str:
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not archs:
        # Some hand-written configs only carry model_type.
        model_type = cfg.get("model_type")
        if model_type in _MODEL_TYPE_TO_ARCH:
            return _MODEL_TYPE_TO_ARCH[model_type]
        raise unsupported_architecture(model_type or "(none given)", source)
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise unsupported_architecture(archs[0], source)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Return (rope_theta, rope_scaling) from either config generation."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        scaling = dict(scaling)
        # v4 configs spell it "type"; "default" means plain RoPE, i.e. no scaling.
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if rope_type == "default" else {**scaling, "rope_type": rope_type}
    return float(theta), scaling


def normalize_hf_config(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with every key the engine reads present and typed.

    Raises ModelLoadError for an unsupported architecture or a missing size key.
    """
    cfg = dict(raw)
    arch = _resolve_architecture(cfg, source)
    missing = [k for k in _REQUIRED_KEYS if cfg.get(k) is None]
    if missing:
        raise ModelLoadError(f"config of {source} lacks {', '.join(missing)}")
    cfg["architectures"] = [arch]
    cfg["model_type"] = SUPPORTED_ARCHITECTURES[arch]
    heads = int(cfg["num_attention_heads"])
    cfg["num_key_value_heads"] = int(cfg.get("num_key_value_heads") or heads)
    cfg["head_dim"] = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    cfg["rms_norm_eps"] = float(cfg.get("rms_norm_eps", 1e-6))
    cfg["rope_theta"], cfg["rope_scaling"] = _rope(cfg)
    cfg["max_position_embeddings"] = int(cfg.get("max_position_embeddings") or 2048)
    # LlamaConfig, MistralConfig and Qwen2Config all default to untied.
    cfg["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    cfg.setdefault("hidden_act", "silu")
    cfg.setdefault("bos_token_id", None)
    cfg.setdefault("eos_token_id", None)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    return cfg


def merge_eos_ids(*sources: int | Iterable[int] | None) -> list[int]:
    """Flatten eos ids from config, generation config and tokenizer; keep first-seen order."""
    out: list[int] = []
    for src in sources:
        if src is None:
            continue
        for tok in [src] if isinstance(src, int) else src:
            if tok is not None and int(tok) not in out:
                out.append(int(tok))
    return out

"""Normalise HF-style config dicts so the engine reads one set of keys.

config.json files differ by the transformers version that wrote them (v5
writes ``rope_parameters`` and ``dtype``; v4 writes ``rope_theta``,
``rope_scaling`` and ``torch_dtype``) and by what they leave to defaults
(``head_dim``, ``num_key_value_heads``, ``rms_norm_eps``), whose values differ by
model type. GGUF metadata is translated into the same dict and passes through here
too. The parsing itself is ``inflight.models.hf_config.parse_hf_config``'s, the one
parser: the dict carries its results.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Iterable

from inflight.models.hf_config import parse_hf_config, text_part
from inflight.models.registry import headless_spec, resolve_spec

from .types import ModelLoadError, unsupported_architecture

_REQUIRED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)


def normalize_hf_config(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with every key the engine reads present and typed.

    Raises ModelLoadError for an unsupported architecture or a missing size key.
    """
    cfg = dict(raw)
    try:
        spec = resolve_spec(cfg)
    except ValueError:
        archs = cfg.get("architectures") or [cfg.get("model_type") or "(none given)"]
        raise unsupported_architecture(archs if isinstance(archs, str) else archs[0], source) from None
    if spec.text_config:  # transformers' text config class supplies what text_config leaves out
        cfg = text_part(cfg)
    missing = [k for k in _REQUIRED_KEYS if cfg.get(k) is None and not spec.text_config]
    if missing:
        raise ModelLoadError(f"config of {source} lacks {', '.join(missing)}")
    try:
        arch = parse_hf_config(cfg)
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"config of {source}: {exc}") from exc
    parsed = {k: v for k, v in asdict(arch).items() if k != "architecture"}
    if parsed["layer_types"] is None:  # every layer alike: the file's own list (if any) says so too, and
        parsed.pop("layer_types")      # some config classes cannot derive one again (EXAONE 4 without a window)
    cfg.update(parsed)
    archs = raw.get("architectures") or []
    if spec.is_encoder_only or archs and headless_spec(archs[0] if isinstance(archs, list) else archs) is spec:
        # no logits head in the checkpoint: nothing to tie or load; it serves embeddings only
        cfg["tie_word_embeddings"], cfg["has_lm_head"] = True, False
    if spec.is_encoder_only:  # its prompts run whole and uncached (LLMEngine reads this)
        cfg["is_encoder_only"] = True
    cfg["default_pooling_type"] = spec.default_pooling_type
    cfg["architectures"] = [spec.architecture]
    cfg["model_type"] = spec.model_type
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

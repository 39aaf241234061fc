"""The model's recommended sampling defaults, as vLLM reads them (``--generation-config``).

A Hugging Face folder's ``generation_config.json`` may recommend a temperature, top-p,
top-k, min-p, repetition penalty and output length (Qwen3: 0.6, 0.95, 20). vLLM applies
them to every request that leaves the field unset; so does inflight: ``"auto"`` reads the
model's folder (a GGUF file has none), ``"vllm"`` ignores it (the plain defaults), a
folder or file path reads that one. ``override_generation_config`` (a dict or JSON text)
goes on top.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional, Union

from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# generation_config.json's names; max_new_tokens is SamplingParams' max_tokens
KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def default_sampling_params(model_path: str, mode: str = "auto",
                            override: Union[str, dict[str, Any], None] = None) -> dict[str, Any]:
    """SamplingParams keyword arguments the model recommends (only the fields it sets).
    Raises ValueError for an unreadable file, an unknown override key or a bad value."""
    found = {} if mode == "vllm" else _read(model_path if mode == "auto" else mode, explicit=mode != "auto")
    extra = json.loads(override) if isinstance(override, str) else dict(override or {})
    unknown = sorted(set(extra) - set(KEYS))
    if unknown:
        raise ValueError(f"override_generation_config: unknown key(s) {unknown}; known: {', '.join(KEYS)}")
    merged = {k: v for k, v in {**found, **extra}.items() if k in KEYS and v is not None}
    kwargs = {("max_tokens" if k == "max_new_tokens" else k): v for k, v in merged.items()}
    SamplingParams(**kwargs)  # a bad recommended value fails at start-up, not in every request
    if kwargs:
        logger.info("sampling defaults from the model's generation config (--generation-config vllm "
                    "to ignore): %s", kwargs)
    return kwargs


def _read(path: str, explicit: bool) -> dict[str, Any]:
    file = path if path.endswith(".json") else os.path.join(path, "generation_config.json")
    if not os.path.isfile(file):
        if explicit:
            raise ValueError(f"generation_config: no generation_config.json at {path}")
        return {}
    with open(file, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def apply_defaults(params: Optional[SamplingParams], defaults: dict[str, Any]) -> SamplingParams:
    """``params`` or, when None, SamplingParams with the model's defaults (vLLM's
    ``LLM.get_default_sampling_params``)."""
    return params if params is not None else SamplingParams(**defaults)

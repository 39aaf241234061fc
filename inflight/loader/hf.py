"""Read an HF-transformers model folder: config.json plus (sharded) safetensors."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from .config import normalize_hf_config
from .seq_cls import classifier_settings
from .stream import SafetensorsSource, read_safetensors_header
from .types import ModelLoadError

_INDEX_FILE = "model.safetensors.index.json"


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"cannot read {path}: expected a JSON object")
    return data


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``raw`` with vLLM's ``hf_overrides`` set over it (a nested dict merged key by key)."""
    out = dict(raw)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_overrides(out[key], value)
        else:
            out[key] = value
    return out


def hf_config(folder: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read and normalise ``folder/config.json``, with vLLM's ``hf_overrides`` set over it."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{folder} has no config.json; expected an HF model folder or a .gguf file")
    return normalize_hf_config(classifier_settings(apply_overrides(_read_json(path), overrides), folder), folder)


def generation_eos(folder: str) -> int | list[int] | None:
    """eos_token_id of generation_config.json, which often lists more stop ids than config.json."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return None
    return _read_json(path).get("eos_token_id")


def safetensors_files(folder: str) -> list[str]:
    """The weight files of ``folder``, from the shard index when there is one."""
    index = os.path.join(folder, _INDEX_FILE)
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map") or {}
        files = [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise ModelLoadError(f"shard {missing[0]} listed in {index} does not exist")
        if files:
            return files
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if files:
        return files
    if glob.glob(os.path.join(folder, "*.bin")):
        raise ModelLoadError(f"{folder} holds only .bin weights; convert them to safetensors")
    raise ModelLoadError(f"{folder} has no *.safetensors weight files")


def hf_weights(folder: str) -> SafetensorsSource:
    """Every tensor of every shard, as stored; read lazily (see stream.py)."""
    paths = safetensors_files(folder)
    for path in paths:
        try:
            read_safetensors_header(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot read safetensors file {path}: {exc}") from exc
    return SafetensorsSource(paths)

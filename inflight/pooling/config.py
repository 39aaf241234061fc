"""The pooler of a pooling model (vLLM's ``PoolerConfig``), and which runner a model gets.

A decoder served with ``runner="pooling"`` returns, for each prompt, one vector made from
its final hidden states (after the last norm): the last token's (``LAST``, the default for
decoder embedding models such as Qwen3-Embedding or e5-mistral), their mean (``MEAN``) or
the first token's (``CLS``), L2-normalized unless ``use_activation`` is false. A folder
made by sentence-transformers (``modules.json``) names its pooling and normalization there;
such a folder selects the pooling runner by itself, as in vLLM."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Union

logger = logging.getLogger(__name__)

POOLING_TYPES = ("LAST", "MEAN", "CLS")
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
_ST_POOLING = {"sentence_transformers.models.Pooling",
               "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}
_ST_NORMALIZE = {"sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize",
                 "sentence_transformers.sentence_transformer.modules.normalize.Normalize"}


@dataclass
class PoolerConfig:
    """``pooling_type`` (or vLLM's ``seq_pooling_type``): LAST | MEAN | CLS (None: the
    sentence-transformers config's, else LAST); ``use_activation``: normalize the
    embeddings (None: the sentence-transformers config's, else True); ``dimensions``: the
    default Matryoshka size. ``is_matryoshka`` / ``matryoshka_dimensions`` come from the
    model's config.json (vLLM reads them there too)."""

    pooling_type: Optional[str] = None
    seq_pooling_type: Optional[str] = None
    use_activation: Optional[bool] = None
    dimensions: Optional[int] = None
    task: Optional[str] = None  # embed | classify (a sequence classifier's checkpoint)
    is_matryoshka: bool = False
    matryoshka_dimensions: Optional[list[int]] = None
    labels: Optional[list[str]] = None  # a classifier's label names (config.json's id2label)
    # a BERT cross-encoder reads token types: a pair's ride in its prompt ids (pooling/token_types.py)
    token_types: bool = False

    def __post_init__(self) -> None:
        if self.seq_pooling_type is not None:
            if self.pooling_type is not None:
                raise ValueError("Cannot set both `pooling_type` and `seq_pooling_type`")
            self.pooling_type, self.seq_pooling_type = self.seq_pooling_type, None
        if self.pooling_type is not None:
            self.pooling_type = str(self.pooling_type).upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")
        if self.task not in (None, "embed", "classify"):
            raise ValueError(f"pooler task {self.task!r} is not supported; supported: embed, classify")

    @classmethod
    def parse(cls, value: Union[None, str, dict, "PoolerConfig"]) -> Optional["PoolerConfig"]:
        """From a JSON text (``--pooler-config``), a dict or a PoolerConfig."""
        if value is None or isinstance(value, PoolerConfig):
            return value
        data = json.loads(value) if isinstance(value, str) else dict(value)
        if not isinstance(data, dict):
            raise ValueError(f"pooler_config must be a JSON object, got {value!r}")
        if "normalize" in data:
            raise ValueError("Parameter `normalize` was removed; use `use_activation` instead.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown pooler_config fields {unknown}; known: {sorted(known)}")
        return cls(**data)


def sentence_transformers_pooling(folder: str) -> Optional[dict[str, Any]]:
    """The pooling type and normalization a sentence-transformers folder declares
    (``modules.json`` and its Pooling module's ``config.json``); None for other folders."""
    path = os.path.join(folder, "modules.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        modules = json.load(f)
    found: dict[str, Any] = {"use_activation": any(m.get("type") in _ST_NORMALIZE for m in modules)}
    pooling = next((m for m in modules if m.get("type") in _ST_POOLING), None)
    if pooling is not None:
        cfg_path = os.path.join(folder, pooling.get("path", ""), "config.json")
        cfg = json.load(open(cfg_path)) if os.path.isfile(cfg_path) else {}
        for key, val in cfg.items():
            name = val if key == "pooling_mode" and isinstance(val, str) else key if val is True else None
            kind = _pooling_name(name) if name else None
            if kind in POOLING_TYPES:
                found["pooling_type"] = kind
                break
    return found


def _pooling_name(name: str) -> str:
    """``pooling_mode_mean_tokens`` -> MEAN, ``pooling_mode_lasttoken`` -> LAST (vLLM's reading)."""
    name = name.replace("pooling_mode_", "").split("_", 1)[0]
    return "LAST" if "lasttoken" in name else name.upper()


def resolve_pooler(runner: str, convert: str, pooler: Optional[PoolerConfig], folder: Optional[str],
                   hf_config: dict[str, Any], scheduling: str = "continuous") -> Optional[PoolerConfig]:
    """The pooler the model runs with, or None for a generative model.

    ``runner="auto"`` picks pooling for a sentence-transformers folder, a checkpoint without
    a logits head (``Qwen3Model``) or with ``convert="embed"``, as vLLM does; the user's
    pooler config wins over the folder's. ``runner`` and ``convert`` are EngineConfig's, checked there."""
    st = sentence_transformers_pooling(folder) if folder and os.path.isdir(folder) else None
    headless = hf_config.get("has_lm_head") is False
    num_labels = int(hf_config.get("num_labels") or 0) if headless else 0
    if runner == "auto":
        runner = "pooling" if st is not None or convert == "embed" or headless else "generate"
        if runner == "pooling":
            logger.info("Resolved `--runner auto` to `--runner pooling`.")
    if runner == "generate" and headless:
        raise ValueError("the checkpoint has no logits head (architecture *Model or *ForSequenceClassification): "
                         "it serves embeddings or classes only (runner='pooling')")
    if runner == "generate":
        if pooler is not None:
            raise ValueError("pooler_config needs runner='pooling' (--runner pooling)")
        return None
    if scheduling != "continuous":  # static batching's padding rows would pool a prompt twice
        raise ValueError("runner='pooling' needs scheduling='continuous'")
    if float(hf_config.get("logits_scaling") or 1.0) != 1.0:  # folded into the final norm's weight
        raise ValueError("runner='pooling' does not run Granite's logits_scaling: its hidden states would be scaled")
    out = replace(pooler) if pooler is not None else PoolerConfig()
    for key, val in (st or {}).items():
        if getattr(out, key) is None:
            setattr(out, key, val)
    out.pooling_type = out.pooling_type or hf_config.get("default_pooling_type") or "LAST"
    out.task = "classify" if num_labels else "embed"
    cross_encoder = bool(num_labels and hf_config.get("is_encoder_only"))  # its head is not linear
    out.token_types = cross_encoder and int(hf_config.get("type_vocab_size") or 0) > 1
    if cross_encoder and out.pooling_type != "CLS":
        raise ValueError("an encoder's classification head (dense, tanh, then the labels) reads the first token: "
                         f"pooling_type must be CLS, got {out.pooling_type}")
    if num_labels:
        names = hf_config.get("id2label") or {}
        out.labels = [str(names.get(str(i), names.get(i, f"LABEL_{i}"))) for i in range(num_labels)]
    dims = hf_config.get("matryoshka_dimensions")
    out.is_matryoshka = bool(dims) or bool(hf_config.get("is_matryoshka", False))
    out.matryoshka_dimensions = list(dims) if dims else None
    return out


def run_prompts_whole(s: Any, c: Any) -> None:
    """An encoder attends both ways, so each prompt runs in one step and nothing is cached:
    chunked prefill and prefix caching go off, as vLLM turns them off for encoder-only models
    (``s`` and ``c``: the engine's scheduler and cache configs)."""
    if s.enable_chunked_prefill or c.enable_prefix_caching:
        logger.info("Encoder-only model: chunked prefill and prefix caching are off; a prompt runs whole "
                    "(at most max_num_batched_tokens=%s tokens).", s.max_num_batched_tokens)
    s.enable_chunked_prefill, c.enable_prefix_caching = False, False

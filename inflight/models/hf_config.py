"""The one HF-config parser: ``config.json`` (or GGUF metadata translated to it) into a
``ModelArchConfig``, through transformers' own config class for the architecture's
model_type, which fills what the dict leaves out."""
from __future__ import annotations

from typing import Any, Optional

from inflight.models.registry import ModelArchConfig, resolve_spec


# what a multimodal config's top level says for its text model too
_TOP_LEVEL_KEYS = ("architectures", "torch_dtype", "dtype", "quantization_config", "bos_token_id", "eos_token_id",
                   "pad_token_id")


def text_part(hf: dict[str, Any]) -> dict[str, Any]:
    """The config a text decoder parses: a multimodal checkpoint's ``text_config`` (its spec
    says ``text_config``) with the top level's dtype, quantization and token ids; else ``hf``."""
    if "text_config" not in hf or not resolve_spec(hf).text_config:
        return hf
    return {**hf["text_config"], **{k: hf[k] for k in _TOP_LEVEL_KEYS if hf.get(k) is not None}}


def _num_labels(hf: dict[str, Any], c: Any) -> int:
    """A sequence classifier's labels: from its architecture's name, or from a config this
    module already normalized (which has no logits head); 0 for every other model."""
    archs = hf.get("architectures") or []
    arch = archs if isinstance(archs, str) else (archs[0] if archs else "")
    if arch.endswith("ForSequenceClassification") or hf.get("has_lm_head") is False:
        return int(getattr(c, "num_labels", 0) or 0)
    return 0


def _rope(c: Any) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) from transformers 5 (rope_parameters) or 4 (rope_theta, rope_scaling)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    if isinstance(params.get("full_attention"), dict):  # per layer type (Gemma 3): the global layers'
        params = dict(params["full_attention"])
    theta = float(params.pop("rope_theta", getattr(c, "rope_theta", 10000.0)))
    params.pop("partial_rotary_factor", None)  # ModelArchConfig.partial_rotary_factor
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    params.pop("type", None)
    if rope_type in ("longrope", "su"):  # Phi-3: the pretraining length is a top-level field in transformers 4
        rope_type = "longrope"
        params.setdefault("original_max_position_embeddings", getattr(c, "original_max_position_embeddings", None))
    return theta, {**params, "rope_type": rope_type}


def _partial_rotary_factor(c: Any) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    return float(factor) if factor is not None else 1.0


def parse_hf_config(hf: dict[str, Any]) -> ModelArchConfig:
    """The one HF-config parser: transformers' own config class for the architecture's
    model_type fills what the dict leaves out (defaults differ by type: rms_norm_eps,
    max_position_embeddings, Qwen3's head_dim of 128, Mistral's window). ValueError for
    an unsupported architecture or feature.

    Memoized on disk (arch_cache.py): importing transformers' config classes pulls in
    torch.distributed.tensor and sympy, which serving never uses."""
    from inflight.models.arch_cache import memoized

    return memoized(hf, _parse_hf_config, ModelArchConfig)


def _parse_hf_config(hf: dict[str, Any]) -> ModelArchConfig:
    from transformers import AutoConfig

    hf = text_part(hf)
    spec = resolve_spec(hf)
    # An explicit null stays null (Mistral's "sliding_window": null is no window); what a
    # config leaves out gets its type's default (Mistral's 4096).
    keys = {k: v for k, v in hf.items() if k not in ("model_type", "architectures", "transformers_version")}
    c = AutoConfig.for_model(spec.model_type, **keys)
    if spec.check_config is not None:
        spec.check_config(c)
    theta, scaling = _rope(c)
    heads = int(c.num_attention_heads)
    # positions past the padding id: the table's first rows are never a position
    offset = int(c.pad_token_id) + 1 if spec.positions_after_padding else 0
    window = getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None
    bias = getattr(c, "attention_bias", getattr(c, "use_qkv_bias", None))  # StableLM's name for it
    return ModelArchConfig(
        architecture=spec.architecture,
        hidden_size=int(c.hidden_size), intermediate_size=int(c.intermediate_size),
        num_hidden_layers=int(c.num_hidden_layers), num_attention_heads=heads,
        num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(c, "head_dim", None) or int(c.hidden_size) // heads),
        vocab_size=int(c.vocab_size), rms_norm_eps=float(getattr(c, "rms_norm_eps", None) or 1e-5),
        rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=_partial_rotary_factor(c),
        max_position_embeddings=int(c.max_position_embeddings),
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        attention_bias=spec.attention_bias if bias is None else bool(bias),
        qk_norm=spec.qk_norm, rope_interleaved=spec.rope_interleaved, sliding_window=int(window) if window else None,
        **_moe_fields(c),
        **{**_extra_fields(c), **(spec.config_fields(c) if spec.config_fields else {})},
        num_labels=_num_labels(hf, c),
        **(_encoder_fields(c, offset) if spec.is_encoder_only else {}),
    )


def _encoder_fields(c: Any, offset: int) -> dict[str, Any]:
    """An encoder's LayerNorm eps, activation, token types and position offset."""
    return dict(layer_norm_eps=float(c.layer_norm_eps), hidden_act=str(getattr(c, "hidden_act", "gelu")),
                type_vocab_size=int(getattr(c, "type_vocab_size", 0) or 0), position_offset=offset)


def _extra_fields(c: Any) -> dict[str, Any]:
    """Fields only some architectures have (Gemma 2/3's activation, scales, soft-caps and layer
    types); None where a config lacks them. Layer types are kept only where windowed and global
    layers mix."""
    opt = {k: getattr(c, k, None) for k in ("query_pre_attn_scalar", "attn_logit_softcapping",
                                            "final_logit_softcapping")}
    local = (getattr(c, "rope_parameters", None) or {}).get("sliding_attention")
    local_theta = local.get("rope_theta") if isinstance(local, dict) else getattr(c, "rope_local_base_freq", None)
    types = list(getattr(c, "layer_types", None) or _max_window_layer_types(c))
    mixed = "sliding_attention" in types and getattr(c, "sliding_window", None)
    # values keep their JSON types: normalize_hf_config writes them back into the config dict
    # Granite's scalars and SmolLM3's layers without positions, where the config has them
    extra = {k: float(getattr(c, k)) for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling",
                                              "attention_multiplier") if getattr(c, k, None) is not None}
    no_rope = getattr(c, "no_rope_layers", None)
    if no_rope is not None and not all(no_rope):
        extra["no_rope_layers"] = [int(x) for x in no_rope]
    return dict(layer_types=types if mixed else None, hidden_activation=getattr(c, "hidden_activation", None),
                rope_local_base_freq=local_theta, **opt, **extra)


def _max_window_layer_types(c: Any) -> list[str]:
    """Qwen2/Qwen3's layer types where transformers predates ``layer_types`` (4.x): with
    ``use_sliding_window``, the layers from ``max_window_layers`` on are windowed (the rule
    transformers 5 derives ``layer_types`` by)."""
    first = getattr(c, "max_window_layers", None)
    if first is None or not getattr(c, "use_sliding_window", False) or not getattr(c, "sliding_window", None):
        return []
    return ["sliding_attention" if i >= first else "full_attention" for i in range(int(c.num_hidden_layers))]


def _moe_fields(c: Any) -> dict[str, Any]:
    """The mixture-of-experts fields: Mixtral's ``num_local_experts`` (transformers maps
    ``num_experts`` to it), Qwen3-MoE's ``moe_intermediate_size``, its dense layers
    (``mlp_only_layers``, ``decoder_sparse_step``), ``norm_topk_prob`` (Mixtral always
    renormalises) and OLMoE's ``clip_qkv``."""
    clip = getattr(c, "clip_qkv", None)
    out: dict[str, Any] = {"clip_qkv": None if clip is None else float(clip)}
    experts = int(getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or 0)
    if not experts:
        return out
    step = int(getattr(c, "decoder_sparse_step", None) or 1)
    dense = set(getattr(c, "mlp_only_layers", None) or ())
    return {**out, "num_experts": experts, "num_experts_per_tok": int(c.num_experts_per_tok),
            "moe_intermediate_size": int(getattr(c, "moe_intermediate_size", None) or c.intermediate_size),
            "shared_expert_intermediate_size": int(getattr(c, "shared_expert_intermediate_size", None) or 0),
            "norm_topk_prob": bool(getattr(c, "norm_topk_prob", True)),
            "moe_layers": [i for i in range(int(c.num_hidden_layers)) if i not in dense and (i + 1) % step == 0]}

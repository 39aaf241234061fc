"""One description per architecture (``ArchSpec``), the one HF-config parser, and the lookup.

Each model file under ``inflight/models/`` declares ``ARCHITECTURES``, a tuple of
``ArchSpec``: the HF architecture and model_type, the model class, how checkpoint
tensors map onto its parameters (stacked q/k/v and gate/up) and the llama.cpp GGUF
names. The registry finds them by scanning the package, so adding an architecture
touches one file (plus its test).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Optional

# Checkpoint name fragment -> (fused parameter fragment, shard index): separate
# q/k/v and gate/up projections in the checkpoint, one matmul each in the model.
LLAMA_STACKED: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
# llama.cpp per-layer tensor name -> HF module path, shared by its Llama-shaped types.
LLAMA_GGUF_TENSORS: dict[str, str] = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


@dataclass
class ModelArchConfig:
    """The HF config fields a decoder model reads, with transformers' defaults filled in."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # rope_type and its parameters; None for plain RoPE
    partial_rotary_factor: float = 1.0  # RoPE turns the first head_dim * factor dims of each head (Phi-4-mini)
    rope_interleaved: bool = False  # RoPE pairs dims (2i, 2i + 1), GPT-J's way (ERNIE 4.5), not (i, i + d/2)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    sliding_window: Optional[int] = None  # attention window in tokens; None: global attention
    # mixture-of-experts MLPs (Mixtral, Qwen3-MoE, OLMoE); 0 experts: every MLP is dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # a dense expert every token takes, gated (Qwen2-MoE); 0: none
    norm_topk_prob: bool = True  # renormalise each token's top-k routing weights to sum to 1
    # the layers whose MLP is sparse (a list: the config dict round-trips through JSON)
    moe_layers: list[int] = field(default_factory=list)
    clip_qkv: Optional[float] = None  # q, k and v clamped to [-clip_qkv, clip_qkv] (OLMoE)
    # per layer "sliding_attention" or "full_attention" where a stack mixes them (Gemma 2/3); None: all alike
    layer_types: Optional[list[str]] = None
    hidden_activation: Optional[str] = None  # the gated MLP's activation where it is not SiLU (Gemma)
    query_pre_attn_scalar: Optional[float] = None  # attention scale is its -1/2 power (Gemma); None: head_dim
    attn_logit_softcapping: Optional[float] = None  # scores -> cap * tanh(scores / cap) before softmax
    final_logit_softcapping: Optional[float] = None  # the same on the output logits
    rope_local_base_freq: Optional[float] = None  # RoPE base of the sliding-window layers (Gemma 3)
    # Granite's scalars: embeddings times the first, each layer's attention and MLP outputs times
    # the second before the residual add, attention scaled by the third (None: head_dim ** -0.5),
    # logits divided by the last
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: Optional[float] = None
    logits_scaling: float = 1.0
    # per layer 1 (RoPE) or 0 (no positions: SmolLM3's every fourth layer); None: RoPE everywhere
    no_rope_layers: Optional[list[int]] = None
    num_labels: int = 0  # a sequence classifier's labels (XForSequenceClassification); 0: none
    # encoders (BERT, XLM-RoBERTa): LayerNorm eps, the MLP's activation, token types, and how far
    # past the padding id positions start (XLM-RoBERTa: pad_token_id + 1)
    layer_norm_eps: float = 1e-12
    hidden_act: str = "silu"
    type_vocab_size: int = 0
    position_offset: int = 0

    def layer_sliding_window(self, layer: int) -> Optional[int]:
        """Layer ``layer``'s attention window (None: global attention)."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def rotary_dim(self) -> int:
        """The dims of each head RoPE turns: the first ``rotary_dim``, the rest pass unchanged."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def kv_sliding_window(self) -> Optional[int]:
        """The window every layer has (the KV manager frees blocks behind it), else None."""
        windows = {self.layer_sliding_window(i) for i in range(self.num_hidden_layers)}
        return windows.pop() if len(windows) == 1 else None

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelArchConfig":
        """Parse an HF config dict (config.json, or GGUF metadata translated to it)."""
        return parse_hf_config(hf)


@dataclass(frozen=True)
class ArchSpec:
    """Everything architecture-specific outside the model code itself."""

    architecture: str  # HF ``architectures[0]``
    model_type: str  # HF ``model_type``; picks transformers' config class (and so the defaults)
    model_class: type
    stacked: dict[str, tuple[str, int]] = field(default_factory=lambda: dict(LLAMA_STACKED))
    attention_bias: bool = False  # q/k/v biases when the config does not say
    qk_norm: bool = False
    rope_interleaved: bool = False  # ModelArchConfig.rope_interleaved
    gguf_arch: Optional[str] = None  # llama.cpp ``general.architecture``, where it defines the type
    gguf_tensors: dict[str, str] = field(default_factory=lambda: dict(LLAMA_GGUF_TENSORS))
    gguf_permute_qk: bool = False  # llama.cpp's converter reorders Q/K rows for this type
    check_config: Optional[Callable[[Any], None]] = None  # raises ValueError for unsupported features
    # ModelArchConfig fields only this type derives from transformers' config object (EXAONE 4's NoPE layers)
    config_fields: Optional[Callable[[Any], dict[str, Any]]] = None
    # HF config keys from a GGUF file's metadata beyond the common ones; ``meta(key)`` reads ``<gguf_arch>.<key>``
    gguf_config: Optional[Callable[[Callable[[str], Any]], dict[str, Any]]] = None
    gguf_norm_offset: float = 0.0  # llama.cpp's converter stored every norm weight plus this (Gemma: 1)
    # llama.cpp's per-layer tensor holding every expert ([E, rows, cols]) -> HF per-expert module
    # path, ``{e}`` standing for the expert (mixture-of-experts types)
    gguf_expert_tensors: dict[str, str] = field(default_factory=dict)
    # an encoder (BERT): attention both ways, so its prompts run whole and uncached (no
    # chunked prefill, no prefix caching), and it serves embeddings only
    is_encoder_only: bool = False
    positions_after_padding: bool = False  # RoBERTa's positions start at pad_token_id + 1
    default_pooling_type: str = "LAST"  # what a pooling model of this type pools when nothing says
    # a multimodal checkpoint served for text: the decoder's settings are its config's text_config
    text_config: bool = False


@lru_cache(maxsize=1)
def _specs() -> dict[str, ArchSpec]:
    import inflight.models as pkg

    specs: dict[str, ArchSpec] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for spec in getattr(module, "ARCHITECTURES", ()):
            specs[spec.architecture] = spec
    return specs


def supported_architectures() -> list[str]:
    """HF architecture names this build runs."""
    return list(_specs())


def arch_spec(architecture: str) -> ArchSpec:
    """The spec for an HF architecture name; ValueError names the supported ones."""
    spec = _specs().get(architecture)
    if spec is None:
        raise ValueError(f"unsupported architecture {architecture!r}; "
                         f"supported: {', '.join(supported_architectures())}")
    return spec


def spec_for_model_type(model_type: Optional[str]) -> Optional[ArchSpec]:
    """The first spec with this HF model_type (for configs that carry no architectures)."""
    return next((s for s in _specs().values() if s.model_type == model_type), None)


def spec_for_gguf(gguf_arch: Optional[str]) -> Optional[ArchSpec]:
    """The first spec for a llama.cpp architecture name."""
    return next((s for s in _specs().values() if s.gguf_arch == gguf_arch), None)


def get_model_class(architecture: str):
    """The model class for an HF architecture name; ValueError names the supported ones."""
    return arch_spec(architecture).model_class


# what a multimodal config's top level says for its text model too
_TOP_LEVEL_KEYS = ("architectures", "torch_dtype", "dtype", "quantization_config", "bos_token_id", "eos_token_id",
                   "pad_token_id")


def text_part(hf: dict[str, Any]) -> dict[str, Any]:
    """The config a text decoder parses: a multimodal checkpoint's ``text_config`` (its spec
    says ``text_config``) with the top level's dtype, quantization and token ids; else ``hf``."""
    if "text_config" not in hf or not resolve_spec(hf).text_config:
        return hf
    return {**hf["text_config"], **{k: hf[k] for k in _TOP_LEVEL_KEYS if hf.get(k) is not None}}


def resolve_spec(hf: dict[str, Any]) -> ArchSpec:
    """The spec of the first supported entry of ``architectures`` (or of ``model_type``)."""
    archs = hf.get("architectures") or []
    archs = [archs] if isinstance(archs, str) else archs
    for arch in archs:
        if arch in _specs():
            return _specs()[arch]
        if (spec := headless_spec(arch)) is not None:
            return spec
    spec = None if archs else spec_for_model_type(hf.get("model_type"))
    if spec is None:
        name = archs[0] if archs else hf.get("model_type") or "(none given)"
        raise ValueError(f"unsupported architecture {name}; supported: {', '.join(supported_architectures())}")
    return spec


def headless_spec(architecture: str) -> Optional[ArchSpec]:
    """The spec of a decoder checkpoint without its logits head, else None: a bare decoder
    (``Qwen3Model``, ``MistralModel``: how embedding models such as e5-mistral ship) or a
    sequence classifier (``Qwen3ForSequenceClassification``: a ``score`` head instead)."""
    if architecture.endswith("ForSequenceClassification"):
        spec = _specs().get(architecture.removesuffix("ForSequenceClassification") + "ForCausalLM")
        return spec if spec is not None and getattr(spec.model_class, "supports_classification", False) else None
    if architecture.endswith("Model"):
        return _specs().get(architecture.removesuffix("Model") + "ForCausalLM")
    return None


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

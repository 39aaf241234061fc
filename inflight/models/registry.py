"""One description per architecture (``ArchSpec``), the model's settings (``ModelArchConfig``,
parsed by models/hf_config.py), and the lookup.

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
        from inflight.models.hf_config import parse_hf_config

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

"""Architecture name -> model class, and the normalised config models read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ModelArchConfig:
    """The handful of HF config fields a Llama-family model needs."""

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
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # Keys a token attends to (itself included); None: every earlier key.
    sliding_window: Optional[int] = None

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelArchConfig":
        arch = (hf.get("architectures") or ["LlamaForCausalLM"])[0]
        heads = hf["num_attention_heads"]
        rope_scaling = hf.get("rope_scaling")
        rope_theta = hf.get("rope_theta")
        # transformers >= 5 keeps rope settings under rope_parameters.
        rp = hf.get("rope_parameters") or {}
        if rope_theta is None:
            rope_theta = rp.get("rope_theta", 10000.0)
        if rope_scaling is None and rp.get("rope_type", "default") != "default":
            rope_scaling = rp
        return cls(
            architecture=arch,
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            vocab_size=hf["vocab_size"],
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", arch == "Qwen2ForCausalLM")),
            sliding_window=parse_sliding_window(hf),
        )


def parse_sliding_window(hf: dict[str, Any]) -> Optional[int]:
    """The HF config's ``sliding_window``, honouring ``use_sliding_window`` where the
    model type has it (Qwen2 defaults it off; Mistral applies the window whenever set).

    NOTE: ``layer_types`` (or Qwen2's ``max_window_layers``: layers from that index on
    are windowed) can window only some layers; until the layers carry their own
    window, only a config that windows every layer gets one."""
    window = hf.get("sliding_window")
    if not window or not hf.get("use_sliding_window", True):
        return None
    types = hf.get("layer_types")
    if types is None and "max_window_layers" in hf:
        types = ["sliding_attention" if i >= hf["max_window_layers"] else "full_attention"
                 for i in range(hf["num_hidden_layers"])]
    if types is not None and any(t != "sliding_attention" for t in types):
        return None
    return int(window)


SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def get_model_class(architecture: str):
    """The model class for an HF architecture name; ValueError names the supported ones."""
    if architecture in SUPPORTED_ARCHITECTURES:
        from inflight.models.llama import LlamaForCausalLM
        return LlamaForCausalLM
    raise ValueError(f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")

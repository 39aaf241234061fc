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
        )


SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def get_model_class(architecture: str):
    """The model class for an HF architecture name; ValueError names the supported ones."""
    if architecture in SUPPORTED_ARCHITECTURES:
        from inflight.models.llama import LlamaForCausalLM
        return LlamaForCausalLM
    raise ValueError(f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")

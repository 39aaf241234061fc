"""Checks shared by every format: the weights must fit the config they came with."""

from __future__ import annotations

from typing import Any

import torch

from .types import ModelLoadError


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> shape for every tensor a supported decoder needs."""
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    per_layer = {
        "self_attn.q_proj.weight": (q_dim, hidden),
        "self_attn.k_proj.weight": (kv_dim, hidden),
        "self_attn.v_proj.weight": (kv_dim, hidden),
        "self_attn.o_proj.weight": (hidden, q_dim),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    if cfg["model_type"] == "qwen2":  # Qwen2 always has q/k/v biases
        per_layer.update(
            {
                "self_attn.q_proj.bias": (q_dim,),
                "self_attn.k_proj.bias": (kv_dim,),
                "self_attn.v_proj.bias": (kv_dim,),
            }
        )
    for i in range(cfg["num_hidden_layers"]):
        for suffix, shape in per_layer.items():
            shapes[f"model.layers.{i}.{suffix}"] = shape
    return shapes


def finalize_weights(
    weights: dict[str, torch.Tensor], cfg: dict[str, Any], source: str
) -> dict[str, torch.Tensor]:
    """Drop what the engine must not see, convert to float32, and check names and shapes.

    A tied checkpoint may still carry ``lm_head.weight`` (a copy of the
    embedding); the engine reads the embedding instead, so it is dropped.
    RoPE buffers (``rotary_emb.inv_freq``) are recomputed from the config.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in weights.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and cfg["tie_word_embeddings"]:
            continue
        out[name] = value if value.dtype == torch.float32 else value.float()
    for name, shape in expected_shapes(cfg).items():
        if name not in out:
            raise ModelLoadError(f"tensor {name} missing from {source}")
        if tuple(out[name].shape) != shape:
            raise ModelLoadError(
                f"tensor {name} in {source} has shape {tuple(out[name].shape)}, config implies {shape}"
            )
    return out

"""Phi-3: the Llama-shaped decoder whose checkpoints already hold the fused
``qkv_proj`` and ``gate_up_proj`` (gate rows first), so nothing is stacked on load."""
from __future__ import annotations

from typing import Any

from inflight.models.llama import LlamaForCausalLM
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec


def _check(c: Any) -> None:
    """Partial rotary (Phi-4-mini) would need a rotary op that leaves part of each head alone."""
    params = getattr(c, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
    if factor not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor={factor} is not supported")


ARCHITECTURES = (
    ArchSpec("Phi3ForCausalLM", "phi3", LlamaForCausalLM, stacked={}, check_config=_check, gguf_arch="phi3",
             gguf_tensors={**LLAMA_GGUF_TENSORS, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
)

"""Phi-3 and Phi-4-mini: the Llama-shaped decoder whose checkpoints already hold the fused
``qkv_proj`` and ``gate_up_proj`` (gate rows first), so nothing is stacked on load; LongRoPE
(Phi-3.5, the 128k variants) and partial rotary (Phi-4-mini) are layers/rotary.py's."""
from __future__ import annotations

from typing import Any

from inflight.models.llama import LlamaForCausalLM
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec


def _check(c: Any) -> None:
    """Partial rotary (Phi-4-mini) runs as a full-width rotate-half over permuted heads
    (models/llama.py), which needs an even number of dims turned and left."""
    params = getattr(c, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rotary = int(head_dim * factor)
    if not 0 < rotary <= head_dim or rotary % 2 or (head_dim - rotary) % 2:
        raise ValueError(f"partial_rotary_factor={factor} turns {rotary} of {head_dim} dims: "
                         "only an even number of turned and unturned dims is supported")


ARCHITECTURES = (
    ArchSpec("Phi3ForCausalLM", "phi3", LlamaForCausalLM, stacked={}, check_config=_check, gguf_arch="phi3",
             gguf_tensors={**LLAMA_GGUF_TENSORS, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
)

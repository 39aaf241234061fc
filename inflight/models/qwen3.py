"""Qwen3: the Llama-shaped decoder with each q and k head RMS-normalised before RoPE
(layers/layernorm.py's QKNorm; on the CPU one C kernel, in the C layer loop too) and no
q/k/v biases."""
from __future__ import annotations

from inflight.models.llama import LlamaForCausalLM
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec

ARCHITECTURES = (
    ArchSpec("Qwen3ForCausalLM", "qwen3", LlamaForCausalLM, qk_norm=True, gguf_arch="qwen3",
             gguf_tensors={**LLAMA_GGUF_TENSORS, "attn_q_norm": "self_attn.q_norm",
                           "attn_k_norm": "self_attn.k_norm"}),
)

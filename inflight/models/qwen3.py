"""Qwen3: the Llama-shaped decoder with each q and k head RMS-normalised before RoPE
and no q/k/v biases. Its q/k norm is not in the CPU C layer loop, which declines such
stacks; they run op by op (packed linears, C element-wise ops and attention)."""
from __future__ import annotations

from inflight.models.llama import LlamaForCausalLM
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec

ARCHITECTURES = (
    ArchSpec("Qwen3ForCausalLM", "qwen3", LlamaForCausalLM, qk_norm=True, gguf_arch="qwen3",
             gguf_tensors={**LLAMA_GGUF_TENSORS, "attn_q_norm": "self_attn.q_norm",
                           "attn_k_norm": "self_attn.k_norm"}),
)

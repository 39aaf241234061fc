"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): the Gemma 2 decoder with
per-head q/k RMSNorms before RoPE, five windowed layers to each global one (its config's
layer_types), a RoPE base of its own for the windowed layers (rope_local_base_freq) and,
by default, no attention soft-cap. The multimodal Gemma3ForConditionalGeneration is not
supported."""
from __future__ import annotations

from inflight.models.gemma2 import GEMMA_GGUF_TENSORS, GemmaForCausalLM, check_gemma_config, gemma_gguf_config
from inflight.models.registry import ArchSpec

ARCHITECTURES = (
    ArchSpec("Gemma3ForCausalLM", "gemma3_text", GemmaForCausalLM, qk_norm=True, check_config=check_gemma_config,
             gguf_arch="gemma3", gguf_config=gemma_gguf_config, gguf_norm_offset=1.0,
             gguf_tensors={**GEMMA_GGUF_TENSORS, "attn_q_norm": "self_attn.q_norm",
                           "attn_k_norm": "self_attn.k_norm"}),
)

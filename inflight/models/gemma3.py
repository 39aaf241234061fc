"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): the Gemma 2 decoder with
per-head q/k RMSNorms before RoPE, five windowed layers to each global one (its config's
layer_types), a RoPE base of its own for the windowed layers (rope_local_base_freq) and,
by default, no attention soft-cap. The multimodal Gemma3ForConditionalGeneration is not
supported."""
from __future__ import annotations

from inflight.models.gemma2 import GemmaForCausalLM, check_gemma_config
from inflight.models.registry import ArchSpec

ARCHITECTURES = (
    ArchSpec("Gemma3ForCausalLM", "gemma3_text", GemmaForCausalLM, qk_norm=True, check_config=check_gemma_config),
)

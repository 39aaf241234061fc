"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): the Gemma 2 decoder with
per-head q/k RMSNorms before RoPE, five windowed layers to each global one (its config's
layer_types), a RoPE base of its own for the windowed layers (rope_local_base_freq) and,
by default, no attention soft-cap. The multimodal Gemma3ForConditionalGeneration (Gemma 3
4B, 12B, 27B) serves text: its language model, read from the checkpoint's
``language_model`` tensors; the vision tower and projector are not loaded."""
from __future__ import annotations

from typing import Optional

from inflight.models.gemma2 import GEMMA_GGUF_TENSORS, GemmaForCausalLM, check_gemma_config, gemma_gguf_config
from inflight.models.registry import ArchSpec

# the language model's tensors under the names transformers 5 and 4 save them with
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_VISION_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector.")


class Gemma3TextOfMultimodal(GemmaForCausalLM):
    """Gemma 3's decoder from a multimodal checkpoint; images are refused by the server."""

    def checkpoint_rename(self, name: str) -> Optional[str]:
        """A checkpoint tensor's name in this model; None for the vision parts (and a tied head)."""
        if name.startswith(_VISION_PREFIXES):
            return None
        for theirs, ours in _TEXT_PREFIXES:
            if name.startswith(theirs):
                name = ours + name[len(theirs):]
                break
        return None if name == "lm_head.weight" and self.lm_head is None else name


ARCHITECTURES = (
    ArchSpec("Gemma3ForCausalLM", "gemma3_text", GemmaForCausalLM, qk_norm=True, check_config=check_gemma_config,
             gguf_arch="gemma3", gguf_config=gemma_gguf_config, gguf_norm_offset=1.0,
             gguf_tensors={**GEMMA_GGUF_TENSORS, "attn_q_norm": "self_attn.q_norm",
                           "attn_k_norm": "self_attn.k_norm"}),
    ArchSpec("Gemma3ForConditionalGeneration", "gemma3_text", Gemma3TextOfMultimodal, qk_norm=True,
             check_config=check_gemma_config, text_config=True),
)

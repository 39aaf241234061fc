"""EXAONE 4.0 (1.2B, 32B): OLMo 2's norms after the sublayers with per-head q/k RMSNorms (as
Qwen3's), and, where the config sets a sliding window, three windowed layers to each global
one, the global layers without positions (no RoPE). It runs op by op on the CPU."""
from __future__ import annotations

from typing import Any

from inflight.models.llama import LlamaAttention
from inflight.models.olmo2 import Olmo2DecoderLayer, Olmo2ForCausalLM
from inflight.models.registry import ArchSpec


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    """Post-sublayer norms over per-head q/k-normalised attention."""

    attention = LlamaAttention


class Exaone4ForCausalLM(Olmo2ForCausalLM):
    """EXAONE 4.0."""

    decoder_layer = Exaone4DecoderLayer
    supports_tensor_parallel = True  # per-head norms split with the heads
    supports_hybrid_kv = True
    supports_classification = True


def _no_rope_layers(c: Any) -> dict[str, Any]:
    """With a sliding window the global layers have no positions (transformers' Exaone4Attention)."""
    types = list(getattr(c, "layer_types", None) or [])
    if not getattr(c, "sliding_window", None) or "sliding_attention" not in types:
        return {}
    return {"no_rope_layers": [int(t == "sliding_attention") for t in types]}


ARCHITECTURES = (
    ArchSpec("Exaone4ForCausalLM", "exaone4", Exaone4ForCausalLM, qk_norm=True, config_fields=_no_rope_layers),
)

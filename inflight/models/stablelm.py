"""StableLM (StableLM 2 1.6B, StableLM-3B-4E1T, Stable Code 3B): the Llama-shaped decoder with
LayerNorms (with biases) in place of RMSNorms, optional q/k/v biases (``use_qkv_bias``) and RoPE
over the first quarter of each head (partial rotary, as Phi-4-mini's: models/llama.py). The C
layer loop runs RMSNorm stacks, so it runs op by op on the CPU."""
from __future__ import annotations

from typing import Any, Optional

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import LayerNorm
from inflight.models.layer_plan import LayerPlan
from inflight.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from inflight.models.registry import ArchSpec, ModelArchConfig


class StableLmDecoderLayer(LlamaDecoderLayer):
    """Llama's layer with LayerNorms."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__(cfg, backend, layer)
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)


class StableLmForCausalLM(LlamaForCausalLM):
    """StableLM."""

    decoder_layer = StableLmDecoderLayer
    supports_tensor_parallel = True
    supports_hybrid_kv = True
    supports_classification = True

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__(cfg, backend, max_positions)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def layer_plan(self) -> Optional[LayerPlan]:
        """None: the C layer loop's norms are RMSNorms."""
        return None


def _check(c: Any) -> None:
    if getattr(c, "use_parallel_residual", False):
        raise ValueError("StableLM with use_parallel_residual is not supported")
    if getattr(c, "qk_layernorm", False):
        raise ValueError("StableLM with qk_layernorm (per-head LayerNorms) is not supported")


ARCHITECTURES = (
    ArchSpec("StableLmForCausalLM", "stablelm", StableLmForCausalLM, check_config=_check,
             config_fields=lambda c: {"layer_norm_eps": float(c.layer_norm_eps)}),
)

"""Cohere (Command R, Aya Expanse: CohereForCausalLM) and Cohere2 (Command R7B, Command A):
one LayerNorm without a bias feeds attention and MLP side by side (a parallel block), RoPE
pairs each head's dims GPT-J's way (run as Llama over permuted heads, models/llama.py) and the
logits are scaled by ``logit_scale`` (folded into the final norm at load). Cohere2 alternates
three windowed layers with a global one, which has no positions. It runs op by op on the CPU."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import LayerNorm
from inflight.models.layer_plan import LayerPlan
from inflight.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from inflight.models.registry import ArchSpec, ModelArchConfig


class CohereDecoderLayer(nn.Module):
    """x + attention(norm(x)) + mlp(norm(x))."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend, layer)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, bias=False)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's attention and MLP outputs summed, the residual stream before them)."""
        h, residual = self.input_layernorm(x, residual)
        return self.self_attn(h, rope, kv_cache, md) + self.mlp(h), residual


class CohereForCausalLM(LlamaForCausalLM):
    """Cohere and Cohere2."""

    decoder_layer = CohereDecoderLayer
    supports_tensor_parallel = True
    supports_hybrid_kv = True
    supports_classification = False  # its logit_scale is folded into the final norm

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__(cfg, backend, max_positions)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, bias=False)

    def layer_plan(self) -> Optional[LayerPlan]:
        """None: the C layer loop runs sequential RMSNorm blocks."""
        return None


def _check(c: Any) -> None:
    if getattr(c, "use_qk_norm", False):
        raise ValueError("Cohere with use_qk_norm (Command R+) is not supported")


def _fields(c: Any) -> dict[str, Any]:
    """The LayerNorm's eps and logit_scale (as the logits' divisor LlamaForCausalLM folds);
    Cohere2's global layers have no positions."""
    out = {"layer_norm_eps": float(c.layer_norm_eps), "logits_scaling": 1.0 / float(c.logit_scale)}
    types = list(getattr(c, "layer_types", None) or [])
    if "sliding_attention" in types:
        out["no_rope_layers"] = [int(t == "sliding_attention") for t in types]
    return out


ARCHITECTURES = (
    ArchSpec("CohereForCausalLM", "cohere", CohereForCausalLM, rope_interleaved=True, check_config=_check,
             config_fields=_fields),
    ArchSpec("Cohere2ForCausalLM", "cohere2", CohereForCausalLM, rope_interleaved=True, check_config=_check,
             config_fields=_fields),
)

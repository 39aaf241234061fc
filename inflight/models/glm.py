"""GLM-4 (glm-4-9b-chat-hf: GlmForCausalLM; the 0414 models and GLM-Z1: Glm4ForCausalLM):
the Llama-shaped decoder with q/k/v biases, a checkpoint that already fuses ``gate_up_proj``,
and RoPE over the first half of each head in GPT-J's interleaved pairs (run as Llama over
q/k heads permuted at load, models/llama.py). Glm4 adds a norm after each sublayer's output
as well as before it ("sandwich" norms), so it runs op by op on the CPU."""
from __future__ import annotations

from typing import Optional

from torch import nn

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import RMSNorm
from inflight.models.layer_plan import LayerPlan
from inflight.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from inflight.models.registry import ArchSpec, ModelArchConfig

_QKV = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}


class Glm4DecoderLayer(nn.Module):
    """Pre-norm attention and MLP whose outputs are normalised again before the residual add."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend, layer)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's normalised MLP output, the residual stream before it is added)."""
        h, residual = self.input_layernorm(x, residual)
        h = self.post_self_attn_layernorm(self.self_attn(h, rope, kv_cache, md))[0]
        h, residual = self.post_attention_layernorm(h, residual)
        return self.post_mlp_layernorm(self.mlp(h))[0], residual


class Glm4ForCausalLM(LlamaForCausalLM):
    """GLM-4-0414 and GLM-Z1."""

    decoder_layer = Glm4DecoderLayer
    supports_tensor_parallel = True
    supports_hybrid_kv = True
    supports_classification = True

    def layer_plan(self) -> Optional[LayerPlan]:
        """None: the C layer loop has no norms after the sublayers."""
        return None


ARCHITECTURES = (
    ArchSpec("GlmForCausalLM", "glm", LlamaForCausalLM, stacked=dict(_QKV), attention_bias=True,
             rope_interleaved=True),
    ArchSpec("Glm4ForCausalLM", "glm4", Glm4ForCausalLM, stacked=dict(_QKV), attention_bias=True,
             rope_interleaved=True),
)

"""OLMo 2: the Llama-shaped decoder with its norms after the sublayers instead of before
them (each attention and MLP output RMS-normalised before the residual add; no input
norm), and q and k each RMS-normalised over the whole projection as OLMoE's are."""
from __future__ import annotations

from typing import Optional

from torch import nn

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import RMSNorm
from inflight.models.layer_plan import LayerPlan
from inflight.models.llama import LlamaForCausalLM, LlamaMLP
from inflight.models.olmoe import OlmoeAttention
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec, ModelArchConfig


class Olmo2DecoderLayer(nn.Module):
    """x + norm(attention(x)), then + norm(mlp(.)): the norms see the sublayers' outputs."""

    attention: type[nn.Module] = OlmoeAttention  # q/k norms over the whole projection

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.self_attn = self.attention(cfg, backend, layer)
        self.mlp = LlamaMLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's normalised MLP output, the residual stream before it is added)."""
        if residual is not None:
            x = x + residual
        x = x + self.post_attention_layernorm(self.self_attn(x, rope, kv_cache, md))[0]
        return self.post_feedforward_layernorm(self.mlp(x))[0], x


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 (1B, 7B, 13B, 32B)."""

    decoder_layer = Olmo2DecoderLayer
    supports_tensor_parallel = False  # the q/k norms span every head
    supports_hybrid_kv = True
    supports_classification = True

    def layer_plan(self) -> Optional[LayerPlan]:
        """None: the C layer loop runs pre-norm stacks; OLMo 2 runs op by op."""
        return None


ARCHITECTURES = (
    ArchSpec("Olmo2ForCausalLM", "olmo2", Olmo2ForCausalLM, gguf_arch="olmo2",
             gguf_tensors={**{k: v for k, v in LLAMA_GGUF_TENSORS.items() if k not in ("attn_norm", "ffn_norm")},
                           "post_attention_norm": "post_attention_layernorm",
                           "post_ffw_norm": "post_feedforward_layernorm",
                           "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}),
)

"""OLMo 2 and OLMo 3: the Llama-shaped decoder with its norms after the sublayers instead
of before them (each attention and MLP output RMS-normalised before the residual add; no
input norm), and q and k each RMS-normalised over the whole projection as OLMoE's are.
OLMo 3 adds windowed layers with a RoPE table of their own."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import RMSNorm
from inflight.models.gemma2 import GemmaRope
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



class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3 (7B, 32B): OLMo 2 with three windowed layers to each global one; the windowed
    layers turn by plain RoPE, the global ones by the config's (YaRN in the long-context
    models), as Gemma 3's two tables do."""

    supports_tensor_parallel = False
    supports_hybrid_kv = True
    supports_classification = True

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__(cfg, backend, max_positions)
        self.rope = GemmaRope(cfg, max_positions)

    def forward(self, input_ids, positions, kv_caches: list, md) -> torch.Tensor:
        return self.norm(*self.rope.run_layers(self.layers, self.embed_tokens(input_ids), positions, kv_caches,
                                               md))[0]


def _olmo2_gguf(meta) -> dict:
    """llama.cpp files OLMo 3 under olmo2 too, with a window (every fourth layer global):
    its layer types and second RoPE table are not read from GGUF."""
    if meta("attention.sliding_window"):
        raise ValueError("an OLMo 3 GGUF (olmo2 with a sliding window) is not supported; load its HF folder")
    return {}


ARCHITECTURES = (
    ArchSpec("Olmo2ForCausalLM", "olmo2", Olmo2ForCausalLM, gguf_arch="olmo2", gguf_config=_olmo2_gguf,
             gguf_tensors={**{k: v for k, v in LLAMA_GGUF_TENSORS.items() if k not in ("attn_norm", "ffn_norm")},
                           "post_attention_norm": "post_attention_layernorm",
                           "post_ffw_norm": "post_feedforward_layernorm",
                           "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}),
    ArchSpec("Olmo3ForCausalLM", "olmo3", Olmo3ForCausalLM),
)

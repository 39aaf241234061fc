"""OLMoE: the Mixtral-shaped sparse decoder with q and k each RMS-normalised over the
whole projection (not per head) before RoPE, q/k/v clamped to ``clip_qkv`` where the
config sets it, experts under ``mlp.experts.{e}.gate_proj/up_proj/down_proj`` and
routing weights renormalised only when ``norm_topk_prob`` (false in its checkpoints)."""
from __future__ import annotations

import torch

from inflight.attention.base import AttentionBackend
from inflight.layers.layernorm import RMSNorm
from inflight.models.llama import LlamaAttention
from inflight.models.mixtral import MixtralForCausalLM, moe_gguf_config, moe_gguf_tensors
from inflight.models.registry import ArchSpec, ModelArchConfig


class OlmoeAttention(LlamaAttention):
    """Llama attention with OLMoE's full-width q/k norm and optional q/k/v clipping."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__(cfg, backend, layer)
        if self.nh != cfg.num_attention_heads:
            raise ValueError("OLMoE's q/k norm spans every head; it does not run under tensor parallelism")
        self.q_norm = RMSNorm(self.nh * self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.nkv * self.hd, cfg.rms_norm_eps)
        self.clip_qkv = cfg.clip_qkv

    def _norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        qkv = torch.cat([self.q_norm(q)[0], self.k_norm(k)[0], v], dim=-1)
        return qkv if self.clip_qkv is None else qkv.clamp(-self.clip_qkv, self.clip_qkv)


class OlmoeForCausalLM(MixtralForCausalLM):
    """OLMoE."""

    attention = OlmoeAttention
    mlp_name = "mlp"
    expert_names = ("gate_proj", "down_proj", "up_proj")


ARCHITECTURES = (
    # llama.cpp does not renormalise olmoe's top-k weights unless the file says so; a clamp of 0 is none
    ArchSpec("OlmoeForCausalLM", "olmoe", OlmoeForCausalLM, gguf_arch="olmoe",
             gguf_config=moe_gguf_config("num_experts", norm_topk_prob=lambda m: bool(m("expert_weights_norm", False)),
                                         clip_qkv=lambda m: m("attention.clamp_kqv") or None),
             **moe_gguf_tensors("mlp", "gate_proj", "down_proj", "up_proj",
                                attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")),
)

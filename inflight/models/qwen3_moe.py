"""Qwen3-MoE: the Mixtral-shaped sparse decoder with Qwen3's per-head q/k norm, its
experts under ``mlp.experts.{e}.gate_proj/up_proj/down_proj``, routing weights
renormalised only when ``norm_topk_prob``, and dense MLPs in ``mlp_only_layers`` (and
off the ``decoder_sparse_step`` grid)."""
from __future__ import annotations

from inflight.models.mixtral import MixtralForCausalLM, moe_gguf_config, moe_gguf_tensors
from inflight.models.registry import ArchSpec


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3-MoE; the q/k norm comes from the spec (``qk_norm``)."""

    mlp_name = "mlp"
    expert_names = ("gate_proj", "down_proj", "up_proj")
    supports_tensor_parallel = True  # per-head q/k norm: each rank norms its own heads


ARCHITECTURES = (
    # llama.cpp renormalises qwen3moe's top-k weights unless the file says otherwise
    ArchSpec("Qwen3MoeForCausalLM", "qwen3_moe", Qwen3MoeForCausalLM, qk_norm=True, gguf_arch="qwen3moe",
             gguf_config=moe_gguf_config("num_experts", moe_intermediate_size=lambda m: m("expert_feed_forward_length"),
                                         norm_topk_prob=lambda m: bool(m("expert_weights_norm", True))),
             **moe_gguf_tensors("mlp", "gate_proj", "down_proj", "up_proj",
                                attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")),
)

"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): the Mixtral-shaped sparse decoder with
Qwen2's q/k/v biases, experts under ``mlp.experts.{e}.gate_proj/up_proj/down_proj``, routing
weights renormalised only when ``norm_topk_prob`` (false in its checkpoints), and a shared
expert every token takes, weighted by the sigmoid of its own gate (mixtral.SparseMoeBlock)."""
from __future__ import annotations

from inflight.models.mixtral import MixtralForCausalLM
from inflight.models.registry import ArchSpec


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    """Qwen2-MoE."""

    mlp_name = "mlp"
    expert_names = ("gate_proj", "down_proj", "up_proj")
    supports_tensor_parallel = True


ARCHITECTURES = (
    ArchSpec("Qwen2MoeForCausalLM", "qwen2_moe", Qwen2MoeForCausalLM, attention_bias=True),
)

"""Qwen3-MoE: the Mixtral-shaped sparse decoder with Qwen3's per-head q/k norm, its
experts under ``mlp.experts.{e}.gate_proj/up_proj/down_proj``, routing weights
renormalised only when ``norm_topk_prob``, and dense MLPs in ``mlp_only_layers`` (and
off the ``decoder_sparse_step`` grid)."""
from __future__ import annotations

from inflight.models.mixtral import MixtralForCausalLM
from inflight.models.registry import ArchSpec


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3-MoE; the q/k norm comes from the spec (``qk_norm``)."""

    mlp_name = "mlp"
    expert_names = ("gate_proj", "down_proj", "up_proj")
    supports_tensor_parallel = True  # per-head q/k norm: each rank norms its own heads


ARCHITECTURES = (
    ArchSpec("Qwen3MoeForCausalLM", "qwen3_moe", Qwen3MoeForCausalLM, qk_norm=True),
)

"""Granite MoE (IBM Granite 3.x 1B-A400M and 3B-A800M): Mixtral's routing (softmax over
the top-k logits) with Granite's four scalars, its experts stacked in the checkpoint
(``input_linear``: every expert's gate and up rows, gate first; ``output_linear``: the
down projections) and the router under ``router.layer``. The residual multiplier is
folded into each layer's o_proj and experts' down projections and the logits scaling
into the final norm at load, as for dense Granite; MixtralForCausalLM applies the
embedding multiplier."""
from __future__ import annotations

from typing import Any, Optional

from inflight.models.llama import fold_scalars
from inflight.models.mixtral import MixtralForCausalLM
from inflight.models.registry import ArchSpec

# the checkpoint's MoE tensors -> this model's (experts stacked alike)
_RENAMES = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.w13_weight",
            "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.w2_weight",
            "block_sparse_moe.router.layer.weight": "block_sparse_moe.gate.weight"}


class GraniteMoeForCausalLM(MixtralForCausalLM):
    """Granite MoE."""

    supports_tensor_parallel = True
    supports_hybrid_kv = True

    def expert_params_mapping(self) -> list[tuple[str, str, int, str]]:
        """None per expert: the checkpoint stacks every expert's weights as the model does."""
        return []

    def checkpoint_rename(self, name: str) -> Optional[str]:
        for theirs, ours in _RENAMES.items():
            if name.endswith(theirs):
                return name[:-len(theirs)] + ours
        return name

    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        fold_scalars(self.cfg, (t for layer in self.layers for t in (layer.self_attn.o_proj.weight,
                                                                     layer.block_sparse_moe.experts.w2_weight)),
                     self.norm)


def _check(c: Any) -> None:
    if getattr(c, "attention_bias", False):
        raise ValueError("Granite MoE with attention_bias is not supported")


ARCHITECTURES = (
    ArchSpec("GraniteMoeForCausalLM", "granitemoe", GraniteMoeForCausalLM, check_config=_check),
)

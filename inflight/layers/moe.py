"""Mixture-of-experts MLP (vLLM's ``FusedMoE``): top-k routing and the experts'
gated MLPs, computed grouped by expert.

The experts' weights are stacked, ``w13_weight`` [E, 2*I, H] (gate rows, then up rows)
and ``w2_weight`` [E, H, I]. A step's (token, slot) pairs are sorted by expert, so
each expert runs one GEMM over all the rows routed to it instead of one per token;
the results are put back in slot order and summed with the routing weights. On the
CPU fast path each expert's projections are packed panel linears (kernels/cpu).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.layers.activation import SiluAndMul
from inflight.layers.custom_op import CustomOp


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k]) of each token's top-k experts.

    Softmax over every expert, then the top k; ``renormalize`` rescales those k to sum
    to 1 (Mixtral always, Qwen3-MoE and OLMoE when ``norm_topk_prob``). Renormalised,
    that equals a softmax over the top-k logits alone."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                    expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum_j weights[t, j] * expert(ids[t, j], x[t]) for every row t of ``x`` [T, H],
    calling ``expert(e, rows)`` once per expert on all of its rows.

    The k results of a row are added in slot order, in float32: where ``expert``'s GEMM
    is row-independent (the packed CPU kernels), so is a row's output."""
    num_tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # slots grouped by expert
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    rows = x[order // top_k]
    by_expert = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            by_expert[start:start + n] = expert(e, rows[start:start + n])
            start += n
    per_slot = torch.empty_like(by_expert)
    per_slot[order] = by_expert
    out = (per_slot.view(num_tokens, top_k, -1).float() * weights.unsqueeze(-1)).sum(dim=1)
    return out.to(x.dtype)


def dense_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                  expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """What ``grouped_experts`` returns, with every expert run over every row and
    weighted 0 where it is not routed: fixed shapes and no host sync, so a CUDA graph
    can capture it (at num_experts / top_k times the arithmetic, for decode steps)."""
    dense = torch.zeros(x.shape[0], num_experts, dtype=torch.float32, device=x.device).scatter_(1, ids, weights)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        out += dense[:, e:e + 1] * expert(e, x).float()
    return out.to(x.dtype)


def make_expert_params_mapping(ckpt_gate_proj_name: str, ckpt_down_proj_name: str, ckpt_up_proj_name: str,
                               num_experts: int) -> list[tuple[str, str, int, str]]:
    """(param name fragment, checkpoint name fragment, expert id, shard id) for each
    expert's checkpoint tensors, as vLLM's: shard ``w1`` (gate) and ``w3`` (up) are the
    two row halves of ``experts.w13_weight[e]``, ``w2`` (down) is ``experts.w2_weight[e]``."""
    return [("experts.w13_" if shard in ("w1", "w3") else "experts.w2_", f"experts.{e}.{name}.", e, shard)
            for e in range(num_experts)
            for shard, name in (("w1", ckpt_gate_proj_name), ("w2", ckpt_down_proj_name),
                                ("w3", ckpt_up_proj_name))]


class FusedMoE(CustomOp):
    """The experts of one sparse MLP; ``forward(x, router_logits)`` routes each row of
    ``x`` to its top-k experts and returns their weighted sum."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.intermediate_size = intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act = SiluAndMul()
        # per expert (gate_up, down) packed linears, once the CPU platform dispatches to them
        self.packed: Optional[list[tuple[nn.Module, nn.Module]]] = None

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(rows, self.w13_weight[e])), self.w2_weight[e])

    def forward_native(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if self.w13_weight is None:
            raise RuntimeError("the experts were packed for the CPU kernels; forward_native has no weights")
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return grouped_experts(x, weights, ids, self.num_experts, self._expert)

    def forward_cuda(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """Grouped by expert, except while a CUDA graph captures a decode step: grouping
        reads the per-expert row counts back to the host, which capture forbids."""
        if not torch.cuda.is_current_stream_capturing():
            return self.forward_native(x, router_logits)
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return dense_experts(x, weights, ids, self.num_experts, self._expert)

    def forward_cpu(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return self.forward_native(x, router_logits)
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)

        def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
            gate_up, down = self.packed[e]
            if hasattr(gate_up, "silu_mul"):  # SiLU in the GEMM's epilogue where the split allows
                return down(gate_up.silu_mul(rows))
            return down(self.act(gate_up(rows)))

        return grouped_experts(x, weights, ids, self.num_experts, expert)

    def dispatch_to(self, device_type: str) -> None:
        super().dispatch_to(device_type)
        if device_type == "cpu" and self.packed is None:
            self.pack_for_cpu()

    def pack_for_cpu(self) -> bool:
        """Pack each expert's projections for the CPU GEMM of the weights' dtype and drop
        the stacked tensors (the packed copies replace them); False where no packed
        linear runs for that dtype, and the stacked weights stay."""
        from inflight.kernels.cpu.packing import packed_linear_class

        w13, w2 = self.w13_weight, self.w2_weight
        cls = None if w13.device.type != "cpu" else packed_linear_class(w13.dtype)
        if cls is None:
            return False
        self.packed = [(cls(w13[e], None), cls(w2[e], None)) for e in range(self.num_experts)]
        self.w13_weight = self.w2_weight = None
        return True

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, intermediate_size={self.intermediate_size}, "
                f"renormalize={self.renormalize}, packed={self.packed is not None}")

"""Mixture-of-experts decoders: Llama-shaped attention, and in each sparse layer a
router plus ``FusedMoE`` experts in place of the dense MLP. Mixtral here; Qwen3-MoE
(q/k norm, dense ``mlp_only_layers``) and OLMoE (q/k norm over the whole projection)
are specs or subclasses of it. Not in the CPU C layer loop, which runs only dense
Llama-shaped stacks: on the CPU fast path these run op by op with packed linears and
packed experts."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.layers.layernorm import RMSNorm
from inflight.layers.moe import FusedMoE, make_expert_params_mapping
from inflight.layers.rotary import RotaryEmbedding
from inflight.models.llama import LlamaAttention, LlamaMLP, head_argmax
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec, ModelArchConfig, arch_spec
from inflight.models.weight_loading import load_checkpoint
from inflight.structured_output.masks import GrammarBitmask


class SparseMoeBlock(nn.Module):
    """The router (``gate``) and the experts of one sparse layer; with
    ``shared_expert_intermediate_size`` (Qwen2-MoE) also a dense ``shared_expert`` every
    token takes, weighted by the sigmoid of its own gate."""

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, cfg.norm_topk_prob)
        shared = cfg.shared_expert_intermediate_size
        self.shared_expert = LlamaMLP(replace(cfg, intermediate_size=shared)) if shared else None
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class MoeDecoderLayer(nn.Module):
    """A pre-norm decoder layer whose MLP (attribute ``mlp_name``) is sparse in
    ``cfg.moe_layers`` and dense elsewhere."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int,
                 attention: type[nn.Module], mlp_name: str) -> None:
        super().__init__()
        self.self_attn = attention(cfg, backend, layer)
        self.mlp_name = mlp_name
        setattr(self, mlp_name, SparseMoeBlock(cfg) if layer in cfg.moe_layers else LlamaMLP(cfg))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's MLP output, the residual stream before it is added)."""
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, kv_cache, md)
        h, residual = self.post_attention_layernorm(h, residual)
        return getattr(self, self.mlp_name)(h), residual


class MixtralForCausalLM(nn.Module):
    """A mixture-of-experts decoder stack; ``forward`` returns hidden states,
    ``compute_logits`` projects the rows that sample. Subclasses set the attention
    module, the MLP's attribute name and the checkpoint's expert tensor names."""

    attention: type[nn.Module] = LlamaAttention
    mlp_name = "block_sparse_moe"
    expert_names = ("w1", "w2", "w3")  # the checkpoint's gate, down and up projections of each expert
    # attention and dense MLPs from the parallel layers; router and experts whole on every rank
    supports_tensor_parallel = True
    supports_hybrid_kv = True  # each layer reads its own metadata (md.for_layer)

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(MoeDecoderLayer(cfg, backend, i, self.attention, self.mlp_name)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches: list, md: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.cfg.embedding_multiplier != 1.0:  # Granite MoE
            x = x * self.cfg.embedding_multiplier
        rope = self.rope.lookup(positions, x.dtype)
        residual = None
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches)):
            x, residual = layer(x, residual, rope, kv, md.for_layer(i))
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return F.linear(hidden, self.embed_tokens.weight)

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int,
                      grammar: Optional[GrammarBitmask] = None) -> Optional[torch.Tensor]:
        """Each row's argmax token from inside a packed logits GEMM, where the head is
        one (see LlamaForCausalLM.greedy_tokens); None otherwise."""
        return head_argmax(self.lm_head, hidden, vocab_size, grammar)

    def pack_lm_head(self, factory) -> None:
        """Give a tied model its own (packed) logits projection; see kernels/cpu/packing.py."""
        if self.lm_head is None:
            self.lm_head = factory(self.embed_tokens.weight, None)

    def stacked_shard_rows(self) -> dict[str, list[int]]:
        """Rows of each shard of the fused projections (this rank's; dense layers' gate_up
        too), in shard order. Under tensor parallelism the experts and the router stay
        whole on every rank: each rank computes the full MoE output."""
        rows = {"qkv_proj": self.layers[0].self_attn.qkv_proj.shard_rows()}
        mlps = [getattr(ly, self.mlp_name) for ly in self.layers]
        dense = [m for m in mlps if isinstance(m, LlamaMLP)]
        dense += [m.shared_expert for m in mlps if getattr(m, "shared_expert", None) is not None]
        sizes = {tuple(m.gate_up_proj.shard_rows()) for m in dense}
        if len(sizes) > 1:  # NOTE: one fused name, one shard layout (weight_loading.plan_copies)
            raise ValueError("dense MLPs and shared experts of different widths in one model are not supported")
        if dense:
            rows["gate_up_proj"] = dense[0].gate_up_proj.shard_rows()
        return rows

    def expert_params_mapping(self) -> list[tuple[str, str, int, str]]:
        """Each expert's checkpoint tensors -> rows of the stacked expert weights."""
        gate, down, up = self.expert_names
        return make_expert_params_mapping(gate, down, up, self.cfg.num_experts)

    def load_weights(self, weights) -> None:
        """Read HF-named checkpoint tensors into the parameters: q/k/v (and dense gate/up)
        fused as the spec says, each expert's projections into its slice of the stacked
        expert weights; every parameter must be set."""
        load_checkpoint(self, arch_spec(self.cfg.architecture).stacked, weights)


def moe_gguf_tensors(mlp: str, gate: str, down: str, up: str, **more: str) -> dict[str, Any]:
    """The ``ArchSpec`` GGUF tensor names of a Llama-shaped MoE type whose router is
    ``{mlp}.gate`` and whose expert e's projections are ``{mlp}.experts.{e}.{gate|down|up}``:
    llama.cpp stores the router as ``ffn_gate_inp`` and each projection of every expert
    stacked in one tensor (``ffn_gate_exps``, ``ffn_down_exps``, ``ffn_up_exps``)."""
    experts = {"ffn_gate_exps": gate, "ffn_down_exps": down, "ffn_up_exps": up}
    return dict(gguf_tensors={**LLAMA_GGUF_TENSORS, "ffn_gate_inp": f"{mlp}.gate", **more},
                gguf_expert_tensors={k: f"{mlp}.experts.{{e}}.{v}" for k, v in experts.items()})


def moe_gguf_config(experts_key: str, **more: Callable[[Callable[[str], Any]], Any]
                    ) -> Callable[[Callable[[str], Any]], dict[str, Any]]:
    """A ``gguf_config``: the expert count (under the HF key ``experts_key``) and top-k from
    llama.cpp's metadata, plus each of ``more`` (HF key -> its value from ``meta``)."""
    def read(meta: Callable[[str], Any]) -> dict[str, Any]:
        return {experts_key: meta("expert_count"), "num_experts_per_tok": meta("expert_used_count"),
                **{k: f(meta) for k, f in more.items()}}
    return read


ARCHITECTURES = (
    # llama.cpp files Mixtral under "llama" (Q/K permuted as for Llama); the GGUF reader
    # tells them apart by the expert count
    ArchSpec("MixtralForCausalLM", "mixtral", MixtralForCausalLM, gguf_permute_qk=True,
             gguf_config=moe_gguf_config("num_local_experts"),
             **moe_gguf_tensors("block_sparse_moe", "w1", "w2", "w3")),
)

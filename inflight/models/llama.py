"""Llama-shaped decoder on a flattened token batch: Llama, SmolLM2, SmolLM3 (no positions in
every fourth layer), Mistral, Qwen2 and Granite (four scalars) here; Qwen3 (per-head q/k
norm) and Phi-3 (fused checkpoint projections) reuse it."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.distributed.layers import (ColumnParallelLinear, ParallelLMHead, RowParallelLinear,
                                         VocabParallelEmbedding, qkv_parallel_linear)
from inflight.layers.activation import SiluAndMul
from inflight.layers.classifier import ClassifierHead
from inflight.layers.layernorm import QKNorm, RMSNorm
from inflight.layers.rotary import RotaryEmbedding, RotaryQKV, rotary_head_permutation
from inflight.models.layer_plan import DecoderLayerPlan, LayerPlan
from inflight.models.registry import ArchSpec, ModelArchConfig, arch_spec
from inflight.models.weight_loading import load_checkpoint
from inflight.structured_output.masks import GrammarBitmask


class LlamaAttention(nn.Module):
    """Self-attention of decoder layer ``layer`` (its index picks its sliding window)."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.hd = cfg.head_dim
        # this rank's heads (all of them without tensor parallelism)
        self.qkv_proj, heads = qkv_parallel_linear(cfg.hidden_size, self.hd, cfg.num_attention_heads,
                                                   cfg.num_key_value_heads, cfg.attention_bias)
        self.nh, self.nkv = heads.num_heads, heads.num_kv_heads
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * self.hd, cfg.hidden_size, bias=False)
        self.rotary = RotaryQKV(self.nh, self.nkv, self.hd)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.qk_norm = QKNorm(self.nh, self.nkv, self.hd) if cfg.qk_norm else None
        self.backend = backend
        self.scale = cfg.attention_multiplier if cfg.attention_multiplier is not None else self.hd ** -0.5
        # per layer: Qwen2/Qwen3 with use_sliding_window window only the layers from max_window_layers on
        self.sliding_window = cfg.layer_sliding_window(layer)
        self.use_rope = cfg.no_rope_layers is None or bool(cfg.no_rope_layers[layer])

    def _norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """Each q and k head RMS-normalised over head_dim (before RoPE, as Qwen3 does)."""
        return self.qk_norm(qkv, self.q_norm, self.k_norm)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv_cache, md: AttentionMetadata):
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:
            qkv = self._norm_qk(qkv)
        q, k, v = self.rotary(qkv, *rope) if self.use_rope else self.rotary.split(qkv)
        o = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], md, self.scale, self.sliding_window)
        return self.o_proj(o.reshape(-1, self.nh * self.hd))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear.split_evenly(cfg.hidden_size, [cfg.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend, layer)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's MLP output, the residual stream before it is added)."""
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, kv_cache, md)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    """The decoder stack; ``forward`` returns hidden states, ``compute_logits``
    projects only the rows that sample."""

    # built from inflight/distributed's parallel layers; checked in the class's own
    # namespace, so a subclass with layers of its own must declare it again
    supports_tensor_parallel = True
    # each layer reads its own metadata (md.for_layer): stacks that mix windowed and global
    # layers (Qwen2's max_window_layers) get a block table per layer group
    supports_hybrid_kv = True
    # a sequence-classification checkpoint loads with its ``score`` head (ClassifierHead)
    supports_classification = True
    decoder_layer: type[nn.Module] = LlamaDecoderLayer  # a variant's own layer (OLMo 2's post-norm one)

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.decoder_layer(cfg, backend, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.lm_head = None if cfg.tie_word_embeddings else ParallelLMHead(cfg.hidden_size, cfg.vocab_size)
        # a sequence classifier's head (XForSequenceClassification), which the pooler applies
        self.score = ClassifierHead(cfg.hidden_size, cfg.num_labels) if cfg.num_labels else None
        self.layer_loop = None  # set by the platform: runs every layer in one call (kernels/cpu/layer_loop.py)

    def forward(self, input_ids, positions, kv_caches: list, md: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.cfg.embedding_multiplier != 1.0:
            x = x * self.cfg.embedding_multiplier
        rope = self.rope.lookup(positions, x.dtype)
        # NOTE: the C layer loop reads one block table for every layer: layer groups run op by op
        if self.layer_loop is not None and md.per_layer is None and self.layer_loop.can_run(x, kv_caches):
            # NOTE: the same kernels as the loop below, in one C call (bit-identical output)
            x, residual = self.layer_loop.run(x, rope, kv_caches, md)
            return self.norm(x, residual)[0]
        residual = None
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches)):
            x, residual = layer(x, residual, rope, kv, md.for_layer(i))
        return self.norm(x, residual)[0]

    def layer_plan(self) -> Optional[LayerPlan]:
        """The stack as a fused layer loop reads it (see models/layer_plan.py); None where
        the loop cannot run it."""
        cfg = self.cfg
        layers = [DecoderLayerPlan(ly.input_layernorm.weight, ly.self_attn.qkv_proj, ly.self_attn.o_proj,
                                   ly.post_attention_layernorm.weight, ly.mlp.gate_up_proj, ly.mlp.down_proj,
                                   ly.self_attn, _weight(ly.self_attn.q_norm), _weight(ly.self_attn.k_norm))
                  for ly in self.layers]
        attn = self.layers[0].self_attn  # this rank's heads and MLP columns
        return LayerPlan(cfg.hidden_size, self.layers[0].mlp.down_proj.in_features, attn.nh, attn.nkv,
                         cfg.head_dim, cfg.rms_norm_eps, self.layers[0].self_attn.scale, layers,
                         cfg.attention_bias)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return self.embed_tokens.logits(hidden)

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int,
                      grammar: Optional[GrammarBitmask] = None) -> Optional[torch.Tensor]:
        """The argmax token of each row's logits without materializing them, where the
        logits projection can (a bias-free PanelLinear over exactly ``vocab_size``
        rows); None otherwise."""
        return head_argmax(self.lm_head, hidden, vocab_size, grammar)

    def pack_lm_head(self, factory) -> None:
        """Give a tied model its own (packed) logits projection; see kernels/cpu/packing.py."""
        if self.lm_head is None:
            self.lm_head = self.embed_tokens.tied_head(factory)

    def stacked_shard_rows(self) -> dict[str, list[int]]:
        """Rows of each shard of the fused projections (this rank's), in shard order."""
        layer = self.layers[0]
        return {"qkv_proj": layer.self_attn.qkv_proj.shard_rows(), "gate_up_proj": layer.mlp.gate_up_proj.shard_rows()}

    def load_weights(self, weights) -> None:
        """Read HF-named checkpoint tensors (a loader WeightSource, a dict or (name,
        tensor) pairs) into the parameters, fusing shards as the architecture's spec
        says; every parameter must be set."""
        load_checkpoint(self, arch_spec(self.cfg.architecture).stacked, weights)
        self._fold_scalars()
        self._permute_rotary_dims()

    def row_orders(self) -> dict[str, list[int]]:
        """The order each projection keeps its output rows in where it differs from the
        checkpoint's (``new[j] = old[order[j]]``), by short name: a LoRA adapter's B follows."""
        attn = self.layers[0].self_attn
        perm = self._head_permutation()
        if perm is None:
            return {}
        rows = torch.arange((attn.nh + 2 * attn.nkv) * attn.hd).view(-1, attn.hd)
        rows[:attn.nh + attn.nkv] = rows[:attn.nh + attn.nkv, perm]
        return {"qkv_proj": rows.flatten().tolist()}

    def _head_permutation(self) -> Optional[torch.Tensor]:
        cfg = self.cfg
        if cfg.rotary_dim == cfg.head_dim and not cfg.rope_interleaved:
            return None
        return torch.tensor(rotary_head_permutation(cfg.head_dim, cfg.rotary_dim, cfg.rope_interleaved))

    @torch.no_grad()
    def _permute_rotary_dims(self) -> None:
        """Partial or interleaved rotary as the full-width rotate-half every rope kernel runs
        (layers/rotary.py): each q and k head's dims reordered in the projection's rows and
        bias and in the q/k norm weights. q.k is unchanged, so nothing else needs to know."""
        perm = self._head_permutation()
        if perm is None:
            return
        for layer in self.layers:
            attn = layer.self_attn
            qk = (attn.nh + attn.nkv) * attn.hd
            for param in (attn.qkv_proj.weight, getattr(attn.qkv_proj, "bias", None)):
                if param is not None:
                    heads = param.data[:qk].view(attn.nh + attn.nkv, attn.hd, *param.shape[1:])
                    heads.copy_(heads[:, perm].clone())
            for norm in (attn.q_norm, attn.k_norm):  # per head, or over the whole projection (OLMo 2)
                if norm is not None:
                    w = norm.weight.data.view(-1, attn.hd)
                    w.copy_(w[:, perm].clone())

    def _fold_scalars(self) -> None:
        projections = (proj for layer in self.layers for proj in (layer.self_attn.o_proj, layer.mlp.down_proj))
        fold_scalars(self.cfg, (t for proj in projections for t in (proj.weight, getattr(proj, "bias", None))
                                if t is not None), self.norm)


@torch.no_grad()
def fold_scalars(cfg: ModelArchConfig, outputs: Iterable[torch.Tensor], norm: nn.Module) -> None:
    """Granite's residual multiplier into ``outputs`` (the weights and biases of every
    sublayer's output projection), its logits scaling into the final ``norm``: the same
    products, no op of their own (so the packed linears and the C layer loop run them as
    they run Llama). Cohere's logit scale arrives as a logits scaling too."""
    if cfg.residual_multiplier != 1.0:
        for t in outputs:
            t.mul_(cfg.residual_multiplier)
    if cfg.logits_scaling != 1.0:
        norm.weight.div_(cfg.logits_scaling)


def head_argmax(head: Optional[nn.Module], hidden: torch.Tensor, vocab_size: int,
                grammar: Optional[GrammarBitmask] = None) -> Optional[torch.Tensor]:
    """Each row's argmax token from inside the logits GEMM (over the tokens ``grammar``
    allows), where ``head`` is a bias-free packed projection onto exactly ``vocab_size``
    outputs; None otherwise (the caller writes the logits)."""
    if (head is None or not hasattr(head, "argmax") or getattr(head, "bias", None) is not None
            or head.out_features != vocab_size):
        return None
    return head.argmax(hidden, grammar)


def _check_granite(c) -> None:
    if getattr(c, "mlp_bias", False) or getattr(c, "attention_bias", False):
        raise ValueError("Granite with attention_bias or mlp_bias is not supported")


def _granite_gguf_config(meta) -> dict:
    """Granite's scalars as llama.cpp's converter names them."""
    names = {"embedding_scale": "embedding_multiplier", "residual_scale": "residual_multiplier",
             "attention.scale": "attention_multiplier", "logit_scale": "logits_scaling"}
    return {hf: meta(key) for key, hf in names.items() if meta(key) is not None}


def _weight(norm: Optional[RMSNorm]) -> Optional[torch.Tensor]:
    return None if norm is None else norm.weight


ARCHITECTURES = (
    ArchSpec("LlamaForCausalLM", "llama", LlamaForCausalLM, gguf_arch="llama", gguf_permute_qk=True),
    # llama.cpp files Mistral under "llama"; the GGUF reader tells them apart by name.
    ArchSpec("MistralForCausalLM", "mistral", LlamaForCausalLM, gguf_permute_qk=True),
    ArchSpec("Qwen2ForCausalLM", "qwen2", LlamaForCausalLM, attention_bias=True, gguf_arch="qwen2"),
    ArchSpec("SmolLM3ForCausalLM", "smollm3", LlamaForCausalLM, gguf_arch="smollm3", gguf_permute_qk=True),
    ArchSpec("GraniteForCausalLM", "granite", LlamaForCausalLM, check_config=_check_granite, gguf_arch="granite",
             gguf_permute_qk=True, gguf_config=_granite_gguf_config),
)

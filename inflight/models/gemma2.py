"""Gemma 2, and the decoder Gemma 3 (text) reuses: GeGLU, RMSNorm weights stored as an
offset from one, a norm before and after both attention and MLP, embeddings scaled by
sqrt(hidden_size), attention and final logit soft-capping, query_pre_attn_scalar for the
attention scale, and layers that alternate between sliding-window and global attention.
Gemma 3 adds per-head q/k norms and a RoPE base of its own for the windowed layers.

The CPU C layer loop has none of these ops, so these stacks run op by op there (packed
linears, the C RMSNorm and RoPE kernels, attention through the backend; soft-capped
attention through the torch reference)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.layers.activation import GeluAndMul
from inflight.layers.layernorm import GemmaRMSNorm, QKNorm
from inflight.layers.rotary import RotaryEmbedding, RotaryQKV
from inflight.models.llama import LlamaAttention, head_argmax
from inflight.models.registry import LLAMA_GGUF_TENSORS, ArchSpec, ModelArchConfig, arch_spec
from inflight.models.weight_loading import load_checkpoint
from inflight.structured_output.masks import GrammarBitmask

_GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


class GemmaAttention(nn.Module):
    """Fused qkv, optional per-head q/k norms, RoPE, paged attention with this layer's window
    and soft-cap, output projection."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=cfg.attention_bias)
        self.rotary = RotaryQKV(self.nh, self.nkv, self.hd)
        self.q_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.qk_norm = QKNorm(self.nh, self.nkv, self.hd) if cfg.qk_norm else None
        self.backend = backend
        self.scale = (cfg.query_pre_attn_scalar or self.hd) ** -0.5
        self.sliding_window = cfg.layer_sliding_window(layer)
        self.logits_soft_cap = cfg.attn_logit_softcapping

    _norm_qk = LlamaAttention._norm_qk  # Gemma 3's q/k heads RMS-normalised before RoPE, as Qwen3's

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv_cache, md: AttentionMetadata):
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:
            qkv = self._norm_qk(qkv)
        q, k, v = self.rotary(qkv, *rope)
        o = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], md, self.scale, self.sliding_window,
                                 self.logits_soft_cap)
        return self.o_proj(o.reshape(-1, self.nh * self.hd))


class GemmaMLP(nn.Module):
    """GeGLU: gelu(gate) * up through the fused gate_up projection, then down."""

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = GeluAndMul(_GELU[cfg.hidden_activation or "gelu_pytorch_tanh"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class GemmaDecoderLayer(nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm."""

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, layer: int) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(cfg, backend, layer)
        self.mlp = GemmaMLP(cfg)
        eps = cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)

    def forward(self, x, residual, rope, kv_cache, md):
        """Returns (this layer's normed MLP output, the residual stream before it is added):
        the post-norms apply to each branch alone, the pre-norms take the residual add."""
        h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(h, rope, kv_cache, md))[0]
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h))[0], residual


class GemmaRope(nn.Module):
    """The global layers' RoPE table and, where the windowed layers have a base of their
    own (Gemma 3's rope_local_base_freq), theirs (plain RoPE, no scaling)."""

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.global_rope = RotaryEmbedding(cfg, max_positions)
        local = cfg.rope_local_base_freq
        self.local_rope = (RotaryEmbedding(replace(cfg, rope_theta=local, rope_scaling=None), max_positions)
                           if local is not None else None)

    def build_cache(self, device: torch.device) -> None:
        """(Re)compute the tables; needed after building on the meta device."""
        for rope in (self.global_rope, self.local_rope):
            if rope is not None:
                rope.build_cache(device)

    def run_layers(self, layers: nn.ModuleList, x: torch.Tensor, positions: torch.Tensor, kv_caches: list,
                   md: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer in turn, a windowed one on the local table and a global one on the
        global; returns (the last layer's output, the residual stream before it is added)."""
        glob, local = self.lookup(positions, x.dtype)
        residual = None
        for i, (layer, kv) in enumerate(zip(layers, kv_caches)):
            rope = local if layer.self_attn.sliding_window else glob
            x, residual = layer(x, residual, rope, kv, md.for_layer(i))
        return x, residual

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype):
        """(global cos/sin, local cos/sin or the global ones) for the step's positions."""
        glob = self.global_rope.lookup(positions, dtype)
        return glob, glob if self.local_rope is None else self.local_rope.lookup(positions, dtype)


class GemmaForCausalLM(nn.Module):
    """The Gemma 2 / Gemma 3 text decoder stack; ``forward`` returns hidden states,
    ``compute_logits`` projects (and soft-caps) only the rows that sample."""

    # each layer reads its own attention metadata, so the KV pool may hold the windowed and
    # the global layers in groups with block tables of their own (worker/kv_cache.py)
    supports_hybrid_kv = True

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, backend, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = GemmaRope(cfg, max_positions)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches: list, md: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # the scale rounded to the model's dtype first, as transformers does
        x = x * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=x.dtype)
        return self.norm(*self.rope.run_layers(self.layers, x, positions, kv_caches, md))[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden) if self.lm_head is not None else F.linear(hidden, self.embed_tokens.weight)
        cap = self.cfg.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int,
                      grammar: Optional[GrammarBitmask] = None) -> Optional[torch.Tensor]:
        """The argmax token of each row without materializing the logits, where the packed
        projection can; None with a final soft-cap: tanh can saturate and tie logits that
        the uncapped argmax would tell apart, and transformers takes the first of a tie."""
        if self.cfg.final_logit_softcapping:
            return None
        return head_argmax(self.lm_head, hidden, vocab_size, grammar)

    def pack_lm_head(self, factory) -> None:
        """Give a tied model its own (packed) logits projection; see kernels/cpu/packing.py."""
        if self.lm_head is None:
            self.lm_head = factory(self.embed_tokens.weight, None)

    def stacked_shard_rows(self) -> dict[str, list[int]]:
        """Rows of each shard of the fused projections, in shard order."""
        cfg = self.cfg
        kv = cfg.num_key_value_heads * cfg.head_dim
        return {"qkv_proj": [cfg.num_attention_heads * cfg.head_dim, kv, kv],
                "gate_up_proj": [cfg.intermediate_size, cfg.intermediate_size]}

    def load_weights(self, weights) -> None:
        """Read HF-named checkpoint tensors into the parameters, fusing q/k/v and gate/up."""
        load_checkpoint(self, arch_spec(self.cfg.architecture).stacked, weights)


def check_gemma_config(c: Any) -> None:
    """ValueError for what this decoder does not implement."""
    act = getattr(c, "hidden_activation", None) or "gelu_pytorch_tanh"
    if act not in _GELU:
        raise ValueError(f"hidden_activation={act!r} is not supported")
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention is not supported (encoder use)")


def gemma_gguf_config(meta: Callable[[str], Any]) -> dict[str, Any]:
    """HF config keys from llama.cpp's Gemma metadata. The file has no query_pre_attn_scalar:
    llama.cpp takes hidden / heads for the 27B models (46 layers in Gemma 2, 62 in Gemma 3)
    and head_dim otherwise, and so does this. The layer pattern is not in the file either:
    llama.cpp's (every second layer global in Gemma 2, every sixth in Gemma 3) is
    transformers' default, as is Gemma 3's local RoPE base of 10000."""
    hidden, heads, head_dim = meta("embedding_length"), meta("attention.head_count"), meta("attention.key_length")
    big = meta("block_count") in (46, 62) and hidden and heads
    out = {"sliding_window": meta("attention.sliding_window"),
           "attn_logit_softcapping": meta("attn_logit_softcapping"),
           "final_logit_softcapping": meta("final_logit_softcapping"),
           "query_pre_attn_scalar": hidden // heads if big else head_dim}
    return {k: v for k, v in out.items() if v is not None}


# llama.cpp's names for Gemma's extra norms (its ffn_norm is the pre-feedforward one)
GEMMA_GGUF_TENSORS = {**LLAMA_GGUF_TENSORS, "post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}

ARCHITECTURES = (
    ArchSpec("Gemma2ForCausalLM", "gemma2", GemmaForCausalLM, check_config=check_gemma_config, gguf_arch="gemma2",
             gguf_tensors=GEMMA_GGUF_TENSORS, gguf_config=gemma_gguf_config, gguf_norm_offset=1.0),
)

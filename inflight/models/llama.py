"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) on a flattened token batch."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.layers.activation import SiluAndMul
from inflight.layers.layernorm import RMSNorm
from inflight.layers.rotary import RotaryEmbedding, RotaryQKV
from inflight.models.layer_plan import DecoderLayerPlan, LayerPlan
from inflight.models.registry import ModelArchConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)
        self.rotary = RotaryQKV(self.nh, self.nkv, self.hd)
        self.backend = backend
        self.scale = self.hd ** -0.5

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv_cache, md: AttentionMetadata):
        q, k, v = self.rotary(self.qkv_proj(x), *rope)
        o = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], md, self.scale)
        return self.o_proj(o.reshape(-1, self.nh * self.hd))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend)
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

    # HF name fragment -> (our fused parameter, shard index)
    _STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, backend) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.layer_loop = None  # set by the platform: runs every layer in one call (kernels/cpu/layer_loop.py)

    def forward(self, input_ids, positions, kv_caches: list, md: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rope.lookup(positions, x.dtype)
        if self.layer_loop is not None and self.layer_loop.can_run(x, kv_caches):
            # NOTE: the same kernels as the loop below, in one C call (bit-identical output)
            x, residual = self.layer_loop.run(x, rope, kv_caches, md)
            return self.norm(x, residual)[0]
        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, rope, kv, md)
        return self.norm(x, residual)[0]

    def layer_plan(self) -> LayerPlan:
        """The stack as a fused layer loop reads it (see models/layer_plan.py)."""
        cfg = self.cfg
        layers = [DecoderLayerPlan(ly.input_layernorm.weight, ly.self_attn.qkv_proj, ly.self_attn.o_proj,
                                   ly.post_attention_layernorm.weight, ly.mlp.gate_up_proj, ly.mlp.down_proj,
                                   ly.self_attn) for ly in self.layers]
        return LayerPlan(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.rms_norm_eps, self.layers[0].self_attn.scale, layers,
                         cfg.attention_bias)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return F.linear(hidden, self.embed_tokens.weight)

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int) -> Optional[torch.Tensor]:
        """The argmax token of each row's logits without materializing them, where the
        logits projection can (a bias-free PanelLinear over exactly ``vocab_size``
        rows); None otherwise."""
        head = self.lm_head
        if (head is None or not hasattr(head, "argmax") or getattr(head, "bias", None) is not None
                or head.out_features != vocab_size):
            return None
        return head.argmax(hidden)

    def pack_lm_head(self, factory) -> None:
        """Give a tied model its own (packed) logits projection; see kernels/cpu/packing.py."""
        if self.lm_head is None:
            self.lm_head = factory(self.embed_tokens.weight, None)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up; every parameter must be set."""
        params = dict(self.named_parameters())
        shards: dict[str, dict[int, torch.Tensor]] = {}
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            for frag, (fused, idx) in self._STACKED.items():
                if f".{frag}." in name:
                    shards.setdefault(name.replace(frag, fused), {})[idx] = tensor
                    break
            else:
                if name not in params:
                    raise ValueError(f"unexpected weight {name!r} in checkpoint")
                params[name].copy_(tensor)
                loaded.add(name)
        for name, parts in shards.items():
            params[name].copy_(torch.cat([parts[i] for i in sorted(parts)], dim=0))
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:5]}")

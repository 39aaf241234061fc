"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) on a flattened token batch."""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.models.registry import ModelArchConfig


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers does, then cast back; adds the
    residual first when given one (vLLM's fused add + norm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = None  # CpuFusedOps on bf16 CPU models (cpu_fused.py)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); NOTE: may update ``residual`` in place."""
        if self.fused is not None and x.dtype == torch.bfloat16:
            return self.fused.add_rmsnorm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype), x


def rope_inv_freq(cfg: ModelArchConfig, device: torch.device) -> torch.Tensor:
    """Inverse frequencies, with llama3 / linear scaling when the config asks."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "linear":
        inv = inv / sc["factor"]
    elif kind == "llama3":
        factor, lo, hi = sc["factor"], sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
        old = sc.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(is_mid, mid, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv


class RotaryEmbedding(nn.Module):
    """Non-interleaved (rotate-half) RoPE with a precomputed cos/sin table."""

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg, self.max_positions = cfg, max_positions
        self.register_buffer("cos", torch.empty(0, device="cpu"), persistent=False)
        self.register_buffer("sin", torch.empty(0, device="cpu"), persistent=False)
        self.build_cache(torch.device("cpu"))

    def build_cache(self, device: torch.device) -> None:
        """(Re)compute the table in float32; needed after building on the meta device."""
        t = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(t, rope_inv_freq(self.cfg, device))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for the step's positions, gathered once and shared by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)
        self.backend = backend
        self.scale = self.hd ** -0.5
        self.fused = None  # CpuFusedOps on bf16 CPU models (cpu_fused.py)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv_cache, md: AttentionMetadata):
        qkv = self.qkv_proj(x)
        fused = self.fused is not None and qkv.dtype == torch.bfloat16
        if fused:
            self.fused.rope_(qkv, self.nh, self.nkv, self.hd, *rope)
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nh, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        if not fused:
            q, k = apply_rope(q, k, *rope)
        o = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], md, self.scale)
        return self.o_proj(o.reshape(-1, self.nh * self.hd))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.fused = None  # CpuFusedOps on bf16 CPU models (cpu_fused.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.fused is not None and gate_up.dtype == torch.bfloat16:
            return self.down_proj(self.fused.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        # NOTE: SiLU on bfloat16 CPU tensors runs ~100x slower than on float32 in
        # torch 2.13; compute it in float32 (exact for float32 models).
        return self.down_proj(F.silu(gate.float()).to(x.dtype) * up)


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
        self.layer_loop = None  # CpuLayerLoop on the bf16 CPU fast path (cpu_layers.py)

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
        """Give a tied model its own (packed) logits projection; see cpu_packing.py."""
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

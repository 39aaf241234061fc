"""Rotary position embeddings: the cos/sin table, and the op that splits a fused qkv
projection into heads with q and k rotated."""
from __future__ import annotations

import math

import torch
from torch import nn

from inflight.kernels.cpu.ops import cpu_fused_ops
from inflight.layers.custom_op import CustomOp
from inflight.models.registry import ModelArchConfig


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
    """Non-interleaved (rotate-half) RoPE's precomputed cos/sin table."""

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


class RotaryQKV(CustomOp):
    """Fused qkv rows ``[T, (nh + 2 nkv) * hd]`` -> (q, k, v) as ``[T, heads, hd]``
    views or tensors, with q and k rotated by the step's (cos, sin)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = num_heads, num_kv_heads, head_dim

    def _split(self, qkv: torch.Tensor):
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        return q.view(-1, self.nh, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)

    def forward_native(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q, k, v = self._split(qkv)
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v

    def forward_cpu(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """As ``forward_native``, rotating in place inside ``qkv`` (q and k are views of it)."""
        ops = cpu_fused_ops(qkv.dtype)
        if ops is None or qkv.stride(-1) != 1:
            return self.forward_native(qkv, cos, sin)
        ops.rope_(qkv, self.nh, self.nkv, self.hd, cos, sin)
        return self._split(qkv)

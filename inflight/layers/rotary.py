"""Rotary position embeddings: the cos/sin table, and the op that splits a fused qkv
projection into heads with q and k rotated."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from inflight.kernels.cpu.ops import cpu_fused_ops
from inflight.layers.custom_op import CustomOp
from inflight.models.registry import ModelArchConfig


def _yarn(pos_freqs: torch.Tensor, sc: dict, cfg: ModelArchConfig) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, keep the high ones, ramp between; cos/sin
    are scaled by the attention factor."""
    d, base, factor = cfg.rotary_dim, cfg.rope_theta, sc.get("factor")
    old = sc.get("original_max_position_embeddings") or cfg.max_position_embeddings
    factor = factor or cfg.max_position_embeddings / old

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = sc.get("attention_factor")
    if attn is None:
        m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def dim_of(rotations: float) -> float:  # the dimension that turns ``rotations`` times over ``old``
        return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(sc.get("beta_fast") or 32), dim_of(sc.get("beta_slow") or 1)
    if sc.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    dims = torch.arange(d // 2, dtype=torch.float32, device=pos_freqs.device)
    ramp = (dims - lo) / (hi - lo if hi != lo else 0.001)
    keep = 1 - ramp.clamp(0, 1)  # 1: extrapolate (unchanged), 0: interpolate (divided by factor)
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep, float(attn)


def _longrope(pos_freqs: torch.Tensor, sc: dict, cfg: ModelArchConfig, long: bool) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: each frequency divided by its own factor (``long_factor`` for a
    context past the pretraining length, else ``short_factor``), cos/sin scaled by the
    attention factor."""
    old = sc.get("original_max_position_embeddings") or cfg.max_position_embeddings
    factor = sc.get("factor") or cfg.max_position_embeddings / old
    attn = sc.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    ext = torch.tensor(sc["long_factor" if long else "short_factor"], dtype=torch.float32, device=pos_freqs.device)
    return 1.0 / (ext * pos_freqs), float(attn)


def rope_tables(cfg: ModelArchConfig, max_positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of every position, ``[max_positions, head_dim]`` in rotate-half order.

    LongRoPE turns every position by the long factors when the table reaches past
    ``original_max_position_embeddings`` (max_model_len above it), else by the short ones,
    as vLLM does: transformers picks per sequence by its length, which a KV cache cannot
    follow (the keys cached early would have to turn again). With partial rotary, the last
    ``(head_dim - rotary_dim) / 2`` pairs get cos 1 and sin 0: the model permutes each q and
    k head at load so that the dims RoPE leaves alone sit in those pairs
    (``rotary_head_permutation``)."""
    t = torch.arange(max_positions, dtype=torch.float32, device=device)
    inv_freq, scale = rope_inv_freq(cfg, device, max_positions)
    angles = torch.outer(t, inv_freq)
    cos, sin = angles.cos() * scale, angles.sin() * scale
    still = (cfg.head_dim - cfg.rotary_dim) // 2
    if still:
        cos = torch.cat([cos, cos.new_ones(max_positions, still)], dim=-1)
        sin = torch.cat([sin, sin.new_zeros(max_positions, still)], dim=-1)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def rotary_head_permutation(head_dim: int, rotary_dim: int, interleaved: bool = False) -> list[int]:
    """The order of a head's dims that makes partial or interleaved rotary a full-width
    rotate-half: RoPE pairs dim i with i + rotary_dim / 2 (or, ``interleaved``, 2i with
    2i + 1) for i < rotary_dim / 2 and leaves the rest; after ``new[j] = old[perm[j]]``
    those pairs are (j, j + head_dim / 2) and the dims left alone pair among themselves.
    q and k get the same order, so q.k is unchanged."""
    r, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    turned = (list(range(0, rotary_dim, 2)), list(range(1, rotary_dim, 2))) if interleaved else \
        (list(range(r)), list(range(r, rotary_dim)))
    left = list(range(rotary_dim, rotary_dim + rest)), list(range(rotary_dim + rest, head_dim))
    return turned[0] + left[0] + turned[1] + left[1]


def rope_inv_freq(cfg: ModelArchConfig, device: torch.device,
                  max_positions: Optional[int] = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scale) for the config's rope_scaling, as transformers'
    ROPE_INIT_FUNCTIONS compute them. Dynamic NTK is fixed at the table's length
    ``max_positions``: transformers recomputes it per sequence length, which equals
    this up to the model's max_position_embeddings (plain RoPE there) and at that length."""
    d = cfg.rotary_dim
    pos_freqs = cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d)
    inv = 1.0 / pos_freqs
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "longrope":
        old = sc.get("original_max_position_embeddings") or cfg.max_position_embeddings
        return _longrope(pos_freqs, sc, cfg, long=(max_positions or 0) > old)
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
    elif kind == "dynamic":
        max_pos = cfg.max_position_embeddings
        seq_len = max(max_positions or max_pos, max_pos)
        base = cfg.rope_theta * ((sc["factor"] * seq_len / max_pos) - (sc["factor"] - 1)) ** (d / (d - 2))
        inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    elif kind == "yarn":
        return _yarn(pos_freqs, sc, cfg)
    elif kind not in ("default", None):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv, 1.0


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
        self.cos, self.sin = rope_tables(self.cfg, self.max_positions, device)

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

    def split(self, qkv: torch.Tensor):
        """(q, k, v) views of ``qkv`` without rotating: a layer that has no positions."""
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        return q.view(-1, self.nh, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)

    def forward_native(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q, k, v = self.split(qkv)
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v

    def forward_cpu(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """As ``forward_native``, rotating in place inside ``qkv`` (q and k are views of it)."""
        ops = cpu_fused_ops(qkv.dtype)
        if ops is None or qkv.stride(-1) != 1:
            return self.forward_native(qkv, cos, sin)
        ops.rope_(qkv, self.nh, self.nkv, self.hd, cos, sin)
        return self.split(qkv)

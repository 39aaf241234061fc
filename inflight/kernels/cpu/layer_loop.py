"""The decoder layers of a bf16 Llama-family model in one C call (csrc/llama_layers.c).

On the CPU fast path every layer runs seven C kernels (panel GEMMs, fused norms,
RoPE, SiLU, the paged K/V write, decode and prefill attention). Driving them from
the Python layer loop costs ~25 dispatches per layer: a 2-sequence decode step took
13.9 ms that way and takes 7.6 ms here, where Python builds the step's arguments
once and one call runs every layer.
Same kernels, same order, same buffers: the hidden states are bit-identical to
the Python loop's, which stays the path for everything else (float32, the torch
reference backend, fp8 KV caches, machines without the kernels).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import nn

from inflight.attention.base import AttentionMetadata
from inflight.kernels.cpu.build import load_library
from inflight.attention.cpu_paged import CpuPagedAttentionBackend
from inflight.attention.kv_quant import is_quantized
from inflight.kernels.cpu.gemm_bf16 import PanelLinear

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Kernels(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("gemm", "add_rmsnorm", "rope", "silu_mul", "write_kv", "decode", "prefill",
                                  "gemm_silu")]


class _Dims(ctypes.Structure):
    _fields_ = [(n, _I64) for n in ("hidden", "inter", "num_heads", "num_kv_heads", "head_dim", "block_size")] \
        + [("eps", _F32), ("scale", _F32)]


class _Layer(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("input_norm", "qkv", "qkv_bias", "o", "post_norm", "gate_up", "down",
                                  "k_cache", "v_cache")]


class _Step(ctypes.Structure):
    _fields_ = [(n, _I64) for n in ("T", "num_decodes", "num_prefills", "bt_stride", "max_decode_len")] \
        + [(n, _P) for n in ("slots", "block_tables", "seq_lens", "q_start", "q_len", "pf_seq_len", "workspace",
                             "cos", "sin", "res", "y", "h", "qkv", "attn", "gate_up", "act", "ticks")]

# csrc/llama_layers.c's enum tick, in order ("gate_up_proj" includes the SiLU when fused)
KERNELS = ("rmsnorm", "qkv_proj", "rope", "kv_write", "decode_attention", "prefill_attention", "o_proj",
           "gate_up_proj", "silu_mul", "down_proj")


def _addr(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


class CpuLayerLoop:
    """Runs ``model.layers`` in one C call; ``build`` returns None where it cannot."""

    def __init__(self, model: nn.Module, lib: ctypes.CDLL, attn: CpuPagedAttentionBackend) -> None:
        cfg, first = model.cfg, model.layers[0]
        self.model, self.lib, self.attn = model, lib, attn
        gemm = first.mlp.down_proj.lib
        fused = first.input_layernorm.fused.lib
        self.kernels = _Kernels(_addr(gemm, "gemm_bf16"), _addr(fused, "add_rmsnorm_bf16"), _addr(fused, "rope_bf16"),
                                _addr(fused, "silu_mul_bf16"), _addr(attn.lib, "write_kv_rows"),
                                _addr(attn.lib, "paged_decode_bf16"), _addr(attn.prefill_lib, "paged_prefill_bf16"),
                                # SiLU in the gate_up GEMM's epilogue when gate and up split on a panel boundary
                                _addr(gemm, "gemm_bf16_silu") if cfg.intermediate_size % gemm.gemm_bf16_panel() == 0
                                and first.mlp.gate_up_proj.bias is None else None)
        self.dims = _Dims(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                          cfg.head_dim, 0, cfg.rms_norm_eps, first.self_attn.scale)
        self.inter = cfg.intermediate_size
        self._layers = None  # (kv_caches list id, ctypes array): the pools do not move
        if lib.llama_layers_ticks() != len(KERNELS):
            raise RuntimeError("csrc/llama_layers.c and cpu_layers.KERNELS disagree")
        self.ticks: Optional[torch.Tensor] = None  # set by profile(): time-stamp counter totals per kernel
        lib.llama_layers_bf16.argtypes = [_P, _P, _P, ctypes.c_int, _P, ctypes.c_int]

    @classmethod
    def build(cls, model: nn.Module) -> Optional["CpuLayerLoop"]:
        """The loop for a bf16 Llama-family model whose every layer is on the C fast path."""
        layers = getattr(model, "layers", None)
        if not layers:
            return None
        first = layers[0]
        attn = getattr(getattr(first, "self_attn", None), "backend", None)
        if not isinstance(attn, CpuPagedAttentionBackend) or attn.prefill_lib is None:
            return None
        cfg = model.cfg
        if not attn.prefill_lib.paged_prefill_supported(ctypes.c_int(cfg.head_dim)):
            return None
        for layer in layers:
            lins = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            if not all(isinstance(m, PanelLinear) for m in lins) or layer.self_attn.o_proj.bias is not None:
                return None
            if layer.input_layernorm.fused is None or layer.self_attn.fused is None or layer.mlp.fused is None:
                return None
            if layer.input_layernorm.weight.dtype != torch.bfloat16:
                return None
        lib = load_library("llama_layers")
        return None if lib is None else cls(model, lib, attn)

    def profile(self, on: bool = True) -> None:
        """Start (zeroed) or stop adding each kernel's time-stamp-counter ticks to ``self.ticks``."""
        self.ticks = torch.zeros(len(KERNELS), dtype=torch.int64) if on else None

    def profile_shares(self) -> dict[str, float]:
        """Each kernel's share of the layer loop's time since ``profile()``."""
        total = max(int(self.ticks.sum()), 1)
        return {name: int(t) / total for name, t in zip(KERNELS, self.ticks)}

    def can_run(self, x: torch.Tensor, kv_caches: list) -> bool:
        k = kv_caches[0][0]
        return x.dtype == torch.bfloat16 and not is_quantized(k) and k.dtype == torch.bfloat16 and k.is_contiguous()

    def _layer_array(self, kv_caches: list):
        if self._layers is None or self._layers[0] is not kv_caches:
            arr = (_Layer * len(self.model.layers))()
            for a, layer, (kc, vc) in zip(arr, self.model.layers, kv_caches):
                at, mlp = layer.self_attn, layer.mlp
                a.input_norm = layer.input_layernorm.weight.data_ptr()
                a.post_norm = layer.post_attention_layernorm.weight.data_ptr()
                a.qkv, a.o = at.qkv_proj.packed.data_ptr(), at.o_proj.packed.data_ptr()
                a.qkv_bias = None if at.qkv_proj.bias is None else at.qkv_proj.bias.data_ptr()
                a.gate_up, a.down = mlp.gate_up_proj.packed.data_ptr(), mlp.down_proj.packed.data_ptr()
                a.k_cache, a.v_cache = kc.data_ptr(), vc.data_ptr()
            self._layers = (kv_caches, arr)
            self.dims.block_size = kv_caches[0][0].shape[1]
        return self._layers[1]

    def run(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv_caches: list,
            md: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over the step; returns (last layer's output, residual stream),
        what the Python loop hands to the final norm. ``x`` becomes the residual."""
        layers = self._layer_array(kv_caches)
        cfg, T = self.model.cfg, x.shape[0]
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        nd = md.num_decodes
        npf = md.num_reqs - nd
        res = x.contiguous()
        new = lambda *shape: torch.empty(shape, dtype=torch.bfloat16)  # noqa: E731
        y, h, qkv, attn = new(T, cfg.hidden_size), new(T, cfg.hidden_size), new(T, (nh + 2 * nkv) * hd), new(T, nh * hd)
        act = new(T, self.inter)
        gate_up = new(T, 2 * self.inter) if self.kernels.gemm_silu is None else None
        cos, sin = rope[0].contiguous(), rope[1].contiguous()
        slots = md.slot_mapping.contiguous()
        bt = md.block_tables.contiguous()
        s = _Step(T, nd, npf, bt.stride(0), md.max_decode_seq_len)
        if npf:  # NOTE: the tensors whose pointers the step holds stay alive as locals until the call returns
            q_start, q_len, pf_seq = self.attn.prefill_args(md, nh, nkv, hd)
            s.q_start, s.q_len, s.pf_seq_len = q_start.data_ptr(), q_len.data_ptr(), pf_seq.data_ptr()
            s.workspace = self.attn._workspace.data_ptr()
        s.slots, s.block_tables, s.seq_lens = slots.data_ptr(), bt.data_ptr(), md.seq_lens.data_ptr()
        s.cos, s.sin = cos.data_ptr(), sin.data_ptr()
        s.res, s.y, s.h, s.qkv, s.attn = res.data_ptr(), y.data_ptr(), h.data_ptr(), qkv.data_ptr(), attn.data_ptr()
        s.gate_up, s.act = None if gate_up is None else gate_up.data_ptr(), act.data_ptr()
        s.ticks = None if self.ticks is None else self.ticks.data_ptr()
        rc = self.lib.llama_layers_bf16(ctypes.byref(self.kernels), ctypes.byref(self.dims), layers,
                                        len(self.model.layers), ctypes.byref(s), 0)
        if rc != 0:
            raise RuntimeError(f"llama_layers_bf16 failed ({rc})")
        return y, res

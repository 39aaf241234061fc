"""The decoder layers of a Llama-family model in one C call (csrc/llama_layers.c).

On the CPU fast path every layer runs seven C kernels (panel GEMMs, fused norms,
RoPE, SiLU, the paged K/V write, decode and prefill attention; Qwen3's per-head q/k
norm before RoPE). Driving them from
the Python layer loop costs ~25 dispatches per layer; here Python builds the step's
arguments once and one call runs every layer. The loop reads the model's
``layer_plan()`` (models/layer_plan.py) and runs bf16 or fp32 models alike: the
kernels of each dtype take the same arguments.
Same kernels, same order, same buffers: the hidden states are bit-identical to
the Python loop's, which stays the path for everything else (the torch reference
backend, machines without the kernels).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend, kv_suffix
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.panel_lowbit import LOWBIT_FORMS, LOWBIT_MAX_ROWS
from inflight.models.layer_plan import LayerPlan

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# the C symbol of each kernel, by dtype suffix
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


class _Kernels(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("gemm", "add_rmsnorm", "rope", "silu_mul", "write_kv", "decode", "prefill",
                                  "gemm_silu", "decode_sw", "prefill_sw", "rmsnorm_heads", "gemm_q4",
                                  "gemm_q8", "gemm_q6", "gemm_q4_silu", "gemm_q8_silu", "gemm_q6_silu")]


class _Dims(ctypes.Structure):
    _fields_ = [(n, _I64) for n in ("hidden", "inter", "num_heads", "num_kv_heads", "head_dim", "block_size",
                                    "elem_size", "lowbit_max_rows")] \
        + [("eps", _F32), ("scale", _F32)]


class _Layer(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "post_norm", "gate_up",
                                  "down", "k_cache", "v_cache")] + [("window", _I64)] \
        + [(n, _P) for n in ("qkv_lb", "o_lb", "gate_up_lb", "down_lb")] \
        + [(n, _I64) for n in ("qkv_bits", "o_bits", "gate_up_bits", "down_bits", "no_rope")]


class _LoRAProj(ctypes.Structure):
    _fields_ = [("a", _P), ("b", _P), ("k", _I64)]


class _LoRALayer(ctypes.Structure):
    _fields_ = [("p", _LoRAProj * 4)]


class _LoRARun(ctypes.Structure):
    _fields_ = [("start", _I64), ("end", _I64), ("layers", _P)]


class _Step(ctypes.Structure):
    _fields_ = [(n, _I64) for n in ("T", "num_decodes", "num_prefills", "bt_stride", "max_decode_len")] \
        + [(n, _P) for n in ("slots", "block_tables", "seq_lens", "q_start", "q_len", "pf_seq_len", "workspace",
                             "cos", "sin", "res", "y", "h", "qkv", "attn", "gate_up", "act", "ticks",
                             "lora_runs")] \
        + [("num_lora_runs", _I64), ("lora_mid", _P), ("lora_out", _P)]

# csrc/llama_layers.c's enum lora_which: the projections an adapter's weights are laid out for
LORA_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")

# csrc/llama_layers.c's enum tick, in order ("gate_up_proj" includes the SiLU when fused)
KERNELS = ("rmsnorm", "qkv_proj", "qk_norm", "rope", "kv_write", "decode_attention", "prefill_attention", "o_proj",
           "gate_up_proj", "silu_mul", "down_proj")


def _prefill_supported(lib: ctypes.CDLL, dtype: torch.dtype, head_dim: int, group: int) -> bool:
    if dtype == torch.float32:
        return hasattr(lib, "paged_prefill_f32") and bool(lib.paged_prefill_f32_supported(head_dim, group))
    return hasattr(lib, "paged_prefill_bf16") and bool(lib.paged_prefill_supported(ctypes.c_int(head_dim)))


def _addr(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _window(layer) -> int:
    """A layer's sliding window (0: global attention)."""
    return getattr(layer.attention, "sliding_window", None) or 0


def _lowbit_kernels(gemm: ctypes.CDLL, silu_ok: bool) -> tuple:
    """gemm_q4, gemm_q8, gemm_q6, then their _silu twins, of the fp32 GEMM library (None: none)."""
    if not hasattr(gemm, "gemm_f32_q4"):  # the bf16 library
        return (None,) * 2 * len(LOWBIT_FORMS)
    plain = tuple(_addr(gemm, f"gemm_f32_q{b}") for b in LOWBIT_FORMS)
    return (*plain, *(_addr(gemm, f"gemm_f32_q{b}_silu") if silu_ok else None for b in LOWBIT_FORMS))


def _head_norms_ok(layer, plan: LayerPlan, dtype: torch.dtype) -> bool:
    """No q/k norm where the first layer has none, or else per-head ones that rmsnorm_heads_*
    runs (Qwen3: a [head_dim] weight each, of the model's dtype); a norm over every head
    at once (OLMoE's) is not one."""
    first = plan.layers[0].q_norm is not None
    if layer.q_norm is None and layer.k_norm is None:
        return not first
    return first and all(w is not None and w.shape == (plan.head_dim,) and w.dtype == dtype and w.is_contiguous()
                         for w in (layer.q_norm, layer.k_norm))


def _sw_kernels(attn: CpuPagedAttentionBackend, kv: str = "") -> tuple[int, int]:
    return _addr(attn.lib, f"paged_decode_f32_sw{kv}"), _addr(attn.prefill_lib, f"paged_prefill_f32_sw{kv}")


def _widening_kernels(kernels: _Kernels, attn: CpuPagedAttentionBackend, sfx: str, pool: str) -> _Kernels:
    """A loop's kernels (``sfx``: its dtype's) over pools of another element type (``pool``:
    "bf16" under a float32 model, or "fp8"): the K/V write and the attention swapped for their
    ``_kv<pool>`` forms, everything else the same. A window is a float32 model's only."""
    out = _Kernels.from_buffer_copy(kernels)
    out.write_kv = _addr(attn.lib, f"write_kv_rows_{sfx}_{pool}")
    out.decode = _addr(attn.lib, f"paged_decode_{sfx}_kv{pool}")
    out.prefill = _addr(attn.prefill_lib, f"paged_prefill_{sfx}_kv{pool}")
    if kernels.decode_sw:
        out.decode_sw, out.prefill_sw = _sw_kernels(attn, f"_kv{pool}")
    return out


def _lowbit_max_rows(plan: LayerPlan) -> int:
    """The row limit of the layers' low-bit panels (one for the model: lowbit_rows.py)."""
    return min((lin.lowbit_max_rows for ly in plan.layers
                for lin in (ly.qkv_proj, ly.o_proj, ly.gate_up_proj, ly.down_proj)
                if getattr(lin, "lowbit", None) is not None), default=LOWBIT_MAX_ROWS)


class CpuLayerLoop:
    """Runs a model's decoder layers in one C call; ``build`` returns None where it cannot."""

    def __init__(self, plan: LayerPlan, dtype: torch.dtype, lib: ctypes.CDLL, attn: CpuPagedAttentionBackend,
                 fused: ctypes.CDLL) -> None:
        first, sfx = plan.layers[0], _SUFFIX[dtype]
        self.plan, self.dtype, self.lib, self.attn = plan, dtype, lib, attn
        gemm = first.down_proj.lib
        # SiLU in the gate_up GEMM's epilogue when gate and up split on a panel boundary
        silu_ok = plan.intermediate_size % first.gate_up_proj.panel == 0 and first.gate_up_proj.bias is None
        self.kernels = _Kernels(_addr(gemm, f"gemm_{sfx}"), _addr(fused, f"add_rmsnorm_{sfx}"),
                                _addr(fused, f"rope_{sfx}"), _addr(fused, f"silu_mul_{sfx}"),
                                _addr(attn.lib, "write_kv_rows"), _addr(attn.lib, f"paged_decode_{sfx}"),
                                _addr(attn.prefill_lib, f"paged_prefill_{sfx}"),
                                _addr(gemm, f"gemm_{sfx}_silu") if silu_ok else None,
                                *(_sw_kernels(attn) if any(_window(ly) for ly in plan.layers) else (None, None)),
                                _addr(fused, f"rmsnorm_heads_{sfx}") if first.q_norm is not None else None,
                                *_lowbit_kernels(gemm, silu_ok))
        self.dims = _Dims(plan.hidden_size, plan.intermediate_size, plan.num_heads, plan.num_kv_heads,
                          plan.head_dim, 0, dtype.itemsize, _lowbit_max_rows(plan), plan.rms_norm_eps, plan.scale)
        self.inter = plan.intermediate_size
        # by the pools' kernel suffix (cpu_paged.kv_suffix): a float32 loop also reads bf16 pools
        self._kernels = {"": self.kernels, "_kvfp8": _widening_kernels(self.kernels, attn, sfx, "fp8")}
        if dtype == torch.float32:
            self._kernels["_kvbf16"] = _widening_kernels(self.kernels, attn, sfx, "bf16")
        self._layers = None  # (kv_caches list id, ctypes array): the pools do not move
        if lib.llama_layers_ticks() != len(KERNELS):
            raise RuntimeError("csrc/llama_layers.c and layer_loop.KERNELS disagree")
        self.ticks: Optional[torch.Tensor] = None  # set by profile(): time-stamp counter totals per kernel
        lib.llama_layers.argtypes = [_P, _P, _P, ctypes.c_int, _P, ctypes.c_int]

    @classmethod
    def build(cls, plan: LayerPlan, dtype: torch.dtype) -> Optional["CpuLayerLoop"]:
        """The loop for a stack whose every layer is on the C fast path for ``dtype``."""
        sfx = _SUFFIX.get(dtype)
        if sfx is None or not plan.layers or not all(_head_norms_ok(ly, plan, dtype) for ly in plan.layers):
            return None
        attn = getattr(plan.layers[0].attention, "backend", None)
        if not isinstance(attn, CpuPagedAttentionBackend) or attn.prefill_lib is None:
            return None
        if not _prefill_supported(attn.prefill_lib, dtype, plan.head_dim, plan.num_heads // plan.num_kv_heads):
            return None
        if dtype != torch.float32 and any(_window(ly) for ly in plan.layers):
            return None  # only the float32 kernels take a sliding window
        fused = load_library("fused_ops")
        if fused is None or not hasattr(fused, f"add_rmsnorm_{sfx}") or not hasattr(fused, f"rmsnorm_heads_{sfx}"):
            return None
        for layer in plan.layers:
            lins = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
            if not all(getattr(m, "packed_dtype", None) == dtype for m in lins) or layer.o_proj.bias is not None:
                return None
            if layer.input_norm.dtype != dtype:
                return None
        lib = load_library("llama_layers")
        return None if lib is None else cls(plan, dtype, lib, attn, fused)

    def profile(self, on: bool = True) -> None:
        """Start (zeroed) or stop adding each kernel's time-stamp-counter ticks to ``self.ticks``."""
        self.ticks = torch.zeros(len(KERNELS), dtype=torch.int64) if on else None

    def profile_shares(self, ticks: Optional[torch.Tensor] = None) -> dict[str, float]:
        """Each kernel's share of the layer loop's time since ``profile()``, or of ``ticks``
        (a difference of two readings of ``self.ticks``)."""
        ticks = self.ticks if ticks is None else ticks
        total = max(int(ticks.sum()), 1)
        return {name: int(t) / total for name, t in zip(KERNELS, ticks)}

    def lora_layers(self, weights_of) -> Optional[ctypes.Array]:
        """A LoRA adapter's weights per layer as the loop reads them: ``weights_of(base
        projection)`` gives its (shrink, expand) linears or None; None where any is not
        packed for this loop's GEMM."""
        arr = (_LoRALayer * len(self.plan.layers))()
        for entry, layer in zip(arr, self.plan.layers):
            for j, name in enumerate(LORA_PROJECTIONS):
                w = weights_of(getattr(layer, name))
                if w is None:
                    continue
                a, b = w
                if any(getattr(m, "packed_dtype", None) != self.dtype or getattr(m, "lib", None) is not
                       layer.down_proj.lib for m in (a, b)):
                    return None
                entry.p[j] = _LoRAProj(a.packed.data_ptr(), b.packed.data_ptr(), a.out_features)
        arr.max_rank = max((p.k for entry in arr for p in entry.p), default=0)
        return arr

    def can_run(self, x: torch.Tensor, kv_caches: list) -> bool:
        k = kv_caches[0][0]
        return x.dtype == self.dtype and kv_suffix(self.dtype, k.dtype) in self._kernels and k.is_contiguous()

    def _layer_array(self, kv_caches: list):
        if self._layers is None or self._layers[0] is not kv_caches:
            arr = (_Layer * len(self.plan.layers))()
            for a, layer, (kc, vc) in zip(arr, self.plan.layers, kv_caches):
                a.input_norm, a.post_norm = layer.input_norm.data_ptr(), layer.post_norm.data_ptr()
                a.qkv, a.o = layer.qkv_proj.packed.data_ptr(), layer.o_proj.packed.data_ptr()
                a.qkv_bias = None if layer.qkv_proj.bias is None else layer.qkv_proj.bias.data_ptr()
                a.q_norm = None if layer.q_norm is None else layer.q_norm.data_ptr()
                a.k_norm = None if layer.k_norm is None else layer.k_norm.data_ptr()
                a.gate_up, a.down = layer.gate_up_proj.packed.data_ptr(), layer.down_proj.packed.data_ptr()
                a.k_cache, a.v_cache = kc.data_ptr(), vc.data_ptr()
                a.window = _window(layer)
                a.no_rope = int(not getattr(layer.attention, "use_rope", True))
                for name in ("qkv", "o", "gate_up", "down"):
                    lin = getattr(layer, f"{name}_proj")
                    lowbit = getattr(lin, "lowbit", None)
                    setattr(a, f"{name}_lb", None if lowbit is None else lowbit.data_ptr())
                    setattr(a, f"{name}_bits", getattr(lin, "lowbit_bits", 0))
            self._layers = (kv_caches, arr)
            self.dims.block_size = kv_caches[0][0].shape[1]
        return self._layers[1]

    def run(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv_caches: list,
            md: AttentionMetadata, lora: list = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over the step; returns (last layer's output, residual stream),
        what the Python loop hands to the final norm. ``x`` becomes the residual.
        ``lora``: (first row, end row, ``lora_layers`` array) per run of rows with an adapter."""
        layers = self._layer_array(kv_caches)
        p, T = self.plan, x.shape[0]
        nh, nkv, hd = p.num_heads, p.num_kv_heads, p.head_dim
        nd = md.num_decodes
        npf = md.num_reqs - nd
        res = x.contiguous()
        new = lambda *shape: torch.empty(shape, dtype=self.dtype)  # noqa: E731
        y, h, qkv, attn = new(T, p.hidden_size), new(T, p.hidden_size), new(T, (nh + 2 * nkv) * hd), new(T, nh * hd)
        act = new(T, self.inter)
        gate_up = new(T, 2 * self.inter) if self.kernels.gemm_silu is None or lora else None
        cos, sin = rope[0].contiguous(), rope[1].contiguous()
        slots = md.slot_mapping.contiguous()
        bt = md.block_tables.contiguous()
        s = _Step(T, nd, npf, bt.stride(0), md.max_decode_seq_len)
        if npf:  # NOTE: the tensors whose pointers the step holds stay alive as locals until the call returns
            q_start, q_len, pf_seq = self.attn.prefill_args(md, nh, nkv, hd, self.dtype)
            s.q_start, s.q_len, s.pf_seq_len = q_start.data_ptr(), q_len.data_ptr(), pf_seq.data_ptr()
            s.workspace = self.attn._workspace.data_ptr()  # unused by the fp32 kernel
        s.slots, s.block_tables, s.seq_lens = slots.data_ptr(), bt.data_ptr(), md.seq_lens.data_ptr()
        s.cos, s.sin = cos.data_ptr(), sin.data_ptr()
        s.res, s.y, s.h, s.qkv, s.attn = res.data_ptr(), y.data_ptr(), h.data_ptr(), qkv.data_ptr(), attn.data_ptr()
        s.gate_up, s.act = None if gate_up is None else gate_up.data_ptr(), act.data_ptr()
        s.ticks = None if self.ticks is None else self.ticks.data_ptr()
        if lora:  # NOTE: the runs array and the scratch rows stay alive as locals until the call returns
            runs = (_LoRARun * len(lora))(*(_LoRARun(a, b, ctypes.addressof(arr)) for a, b, arr in lora))
            mid = new(T, max(arr.max_rank for _, _, arr in lora))
            out = new(T, max(qkv.shape[1], 2 * self.inter, p.hidden_size))
            s.lora_runs, s.num_lora_runs, s.lora_mid, s.lora_out = (ctypes.addressof(runs), len(lora),
                                                                    mid.data_ptr(), out.data_ptr())
        kernels = self._kernels[kv_suffix(self.dtype, kv_caches[0][0].dtype)]
        rc = self.lib.llama_layers(ctypes.byref(kernels), ctypes.byref(self.dims), layers,
                                   len(self.plan.layers), ctypes.byref(s), 0)
        if rc != 0:
            raise RuntimeError(f"llama_layers failed ({rc})")
        return y, res

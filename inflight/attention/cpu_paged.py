"""CPU attention: decode rows through the C paged-decode kernel, prefill chunks
through the C paged-prefill kernel (bf16 on AVX-512-BF16; float32 on every ISA level),
both reading K/V from the block pool in place; anything else through the torch
reference path. A sliding window runs on the float32 kernels (their ``_sw`` entry
points); bf16 declines it to the torch reference, as every kernel declines a logit soft-cap.
A float32 model over bfloat16 pools (kv_cache_dtype "bfloat16") runs the float32 kernels'
``_kvbf16`` entry points, which widen the cached values as they read them; any model over
fp8 pools (kv_cache_dtype "fp8", attention/kv_quant.py) the ``_kvfp8`` ones, which dequantize
them (a bf16 model's queries widened to float32 and its outputs rounded back)."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from inflight.attention.base import AttentionMetadata
from inflight.kernels.cpu.build import load_library, ptr
from inflight.attention.kv_quant import FP8_DTYPE, is_quantized
from inflight.attention.torch_ref import TorchAttentionBackend

_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_FNS = {dt: f"paged_decode_{name}" for dt, name in _NAMES.items()}
_i32, _i64, _f32, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# Declared argument types let the per-layer calls pass plain ints (no wrapper objects).
_DECODE_ARGS = [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i32, _i32, _i32, _i32, _i32, _f32, _i32]
_WRITE_ARGS = [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i32]
_PREFILL_ARGS = [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32, _i32, _i32, _f32, _ptr]


def kv_suffix(dtype: torch.dtype, cache_dtype: torch.dtype) -> Optional[str]:
    """The kernels' entry-point suffix for queries of ``dtype`` over pools of ``cache_dtype``:
    "" for the same dtype, "_kvbf16" for float32 over bfloat16, "_kvfp8" for float32 or
    bfloat16 over fp8, None where no kernel reads it."""
    if dtype == cache_dtype:
        return ""
    if cache_dtype == FP8_DTYPE and dtype in (torch.float32, torch.bfloat16):
        return "_kvfp8"
    return "_kvbf16" if (dtype, cache_dtype) == (torch.float32, torch.bfloat16) else None


def _write_fn(dtype: torch.dtype, cache_dtype: torch.dtype) -> str:
    """The K/V write's entry point for rows of ``dtype`` into pools of ``cache_dtype``."""
    if dtype == cache_dtype:
        return "write_kv_rows"
    return f"write_kv_rows_{_NAMES[dtype]}_{'fp8' if cache_dtype == FP8_DTYPE else _NAMES[cache_dtype]}"


class CpuPagedAttentionBackend(TorchAttentionBackend):
    """Falls back to the torch reference for anything the kernel does not cover."""

    def __init__(self, lib: Optional[ctypes.CDLL] = None, prefill_lib: Optional[ctypes.CDLL] = None) -> None:
        self.lib = lib or load_library("paged_decode")
        if self.lib is None:
            raise RuntimeError("the C paged-decode kernel is not available")
        self.prefill_lib = prefill_lib or load_library("paged_prefill")
        if self.prefill_lib is not None:
            self.prefill_lib.paged_prefill_workspace.restype = ctypes.c_int64
            self.prefill_lib.paged_prefill_f32.argtypes = _PREFILL_ARGS
            self.prefill_lib.paged_prefill_f32_supported.argtypes = [_i32, _i32]
            self.prefill_lib.paged_prefill_f32_sw.argtypes = _PREFILL_ARGS + [_i32]
            self.prefill_lib.paged_prefill_f32_kvbf16.argtypes = _PREFILL_ARGS
            self.prefill_lib.paged_prefill_f32_sw_kvbf16.argtypes = _PREFILL_ARGS + [_i32]
            for name in ("paged_prefill_f32_kvfp8", "paged_prefill_bf16_kvfp8"):
                getattr(self.prefill_lib, name).argtypes = _PREFILL_ARGS
            self.prefill_lib.paged_prefill_f32_sw_kvfp8.argtypes = _PREFILL_ARGS + [_i32]
        self._workspace = torch.empty(0, dtype=torch.uint8)
        for name in _FNS.values():
            getattr(self.lib, name).argtypes = _DECODE_ARGS
        self.lib.paged_decode_f32_sw.argtypes = _DECODE_ARGS + [_i32]
        self.lib.paged_decode_f32_kvbf16.argtypes = _DECODE_ARGS
        self.lib.paged_decode_f32_sw_kvbf16.argtypes = _DECODE_ARGS + [_i32]
        self.lib.paged_decode_f32_kvfp8.argtypes = _DECODE_ARGS
        self.lib.paged_decode_f32_sw_kvfp8.argtypes = _DECODE_ARGS + [_i32]
        self.lib.paged_decode_bf16_kvfp8.argtypes = _DECODE_ARGS
        for name in ("write_kv_rows", "write_kv_rows_f32_bf16", "write_kv_rows_f32_fp8", "write_kv_rows_bf16_fp8"):
            getattr(self.lib, name).argtypes = _WRITE_ARGS
        g, d = ctypes.c_int(), ctypes.c_int()
        self.lib.paged_decode_limits(ctypes.byref(g), ctypes.byref(d))
        self.max_g, self.max_d = g.value, d.value

    def supports(self, q: torch.Tensor, k_cache: torch.Tensor, sliding_window: Optional[int] = None) -> bool:
        nh, d = q.shape[1], q.shape[2]
        kvh = k_cache.shape[2]
        if sliding_window and q.dtype != torch.float32:
            return False  # the bf16 kernels take no window
        return (q.device.type == "cpu" and kv_suffix(q.dtype, k_cache.dtype) is not None and q.dtype in _FNS
                and nh % kvh == 0 and nh // kvh <= self.max_g and d <= self.max_d and k_cache.is_contiguous())

    def forward(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float,
                sliding_window: Optional[int] = None, logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        if logits_soft_cap or not self.supports(q, k_cache, sliding_window):
            return super().forward(q, k, v, k_cache, v_cache, md, scale, sliding_window, logits_soft_cap)
        self._write_kv(k, v, k_cache, v_cache, md.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype)
        if md.num_decodes:
            self._decode_into(q, k_cache, v_cache, md, scale, out, sliding_window)  # rows [0, num_decodes) of out
        if md.num_reqs > md.num_decodes:
            self._prefills(q, k, v, k_cache, v_cache, md, scale, out, sliding_window)
        return out

    def _write_kv(self, k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
        """New K/V rows into the pool in one C call; k and v may be views into the
        fused qkv output as long as each token's heads are contiguous."""
        row = k_cache.shape[2] * k_cache.shape[3]
        if not (k.dtype == v.dtype and kv_suffix(k.dtype, k_cache.dtype) is not None and k.stride(2) == v.stride(2) == 1
                and k.stride(1) == v.stride(1) == k_cache.shape[3] and slots.is_contiguous()):
            return super()._write_kv(k, v, k_cache, v_cache, slots)
        size = k.element_size()
        getattr(self.lib, _write_fn(k.dtype, k_cache.dtype))(
            k.data_ptr(), k.stride(0) * size, v.data_ptr(), v.stride(0) * size, k_cache.data_ptr(),
            v_cache.data_ptr(), slots.data_ptr(), slots.numel(), row * size, k_cache.shape[3])

    def _decode(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float,
                sliding_window: Optional[int] = None) -> torch.Tensor:
        if not self.supports(q, k_cache, sliding_window):
            return super()._decode(q, k_cache, v_cache, md, scale, sliding_window=sliding_window)
        out = torch.empty(md.num_decodes, *q.shape[1:], dtype=q.dtype)
        self._decode_into(q, k_cache, v_cache, md, scale, out, sliding_window)
        return out

    def _decode_into(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float, out: torch.Tensor,
                     sliding_window: Optional[int] = None) -> None:
        """Decode rows [0, num_decodes) of q into the same rows of the contiguous ``out``."""
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        bt = md.block_tables
        args = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), bt.data_ptr(), bt.stride(0),
                md.seq_lens.data_ptr(), out.data_ptr(), md.num_decodes, q.shape[1], k_cache.shape[2], q.shape[2],
                k_cache.shape[1], scale, md.max_decode_seq_len)
        sfx = kv_suffix(q.dtype, k_cache.dtype)
        if sliding_window:
            getattr(self.lib, f"paged_decode_f32_sw{sfx}")(*args, sliding_window)
        else:
            getattr(self.lib, _FNS[q.dtype] + sfx)(*args)

    def prefill_args(self, md: AttentionMetadata, num_heads: int, num_kv_heads: int,
                     head_dim: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
        """The prefill kernel's per-request arrays (query start, query length, context
        length) for the step's prefill requests; for bf16 grows ``self._workspace`` to fit
        them (paged_prefill_f32 needs none)."""
        nd, qsl = md.num_decodes, md.query_start_loc_list
        q_start = torch.tensor(qsl[nd:-1], dtype=torch.int64)
        q_len = torch.tensor([qsl[i + 1] - qsl[i] for i in range(nd, md.num_reqs)], dtype=torch.int64)
        seq_len = torch.tensor(md.seq_lens_list[nd:], dtype=torch.int64)
        if dtype == torch.float32:
            return q_start, q_len, seq_len
        need = self.prefill_lib.paged_prefill_workspace(ptr(seq_len), ptr(q_len), ctypes.c_int(md.num_reqs - nd),
                                                        ctypes.c_int(num_heads), ctypes.c_int(num_kv_heads),
                                                        ctypes.c_int(head_dim))
        if self._workspace.numel() < need:
            self._workspace = torch.empty(need, dtype=torch.uint8)
        return q_start, q_len, seq_len

    def _prefills(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float, out: torch.Tensor,
                  sliding_window: Optional[int] = None) -> None:
        lib = self.prefill_lib
        widened = q.dtype == torch.float32 or is_quantized(k_cache)  # the float32 kernel's
        if (lib is not None and widened and self.supports(q, k_cache, sliding_window) and out.is_contiguous()
                and lib.paged_prefill_f32_supported(q.shape[2], q.shape[1] // k_cache.shape[2])):
            return self._prefills_f32(q, k_cache, v_cache, md, scale, out, sliding_window)
        if (lib is None or q.dtype != torch.bfloat16 or widened or not self.supports(q, k_cache, sliding_window)
                or not out.is_contiguous() or not lib.paged_prefill_supported(ctypes.c_int(q.shape[2]))):
            return super()._prefills(q, k, v, k_cache, v_cache, md, scale, out, sliding_window)
        nd, n = md.num_decodes, md.num_reqs - md.num_decodes
        kvh, d = k_cache.shape[2], q.shape[2]
        q_start, q_len, seq_len = self.prefill_args(md, q.shape[1], kvh, d)
        if q.stride(2) != 1 or q.stride(1) != d:
            q = q.contiguous()
        bt = md.block_tables[nd:]
        rc = lib.paged_prefill_bf16(
            ptr(q), ctypes.c_int64(q.stride(0)), ptr(k_cache), ptr(v_cache), ptr(bt), ctypes.c_int64(bt.stride(0)),
            ptr(q_start), ptr(q_len), ptr(seq_len), ptr(out), ctypes.c_int(n), ctypes.c_int(q.shape[1]),
            ctypes.c_int(kvh), ctypes.c_int(d), ctypes.c_int(k_cache.shape[1]), ctypes.c_float(scale),
            ptr(self._workspace))
        if rc != 0:
            raise RuntimeError(f"paged_prefill_bf16 failed ({rc})")

    def _prefills_f32(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float, out: torch.Tensor,
                      sliding_window: Optional[int] = None) -> None:
        """Every prefill chunk of the step in one call of the float32 kernel (K/V already in the
        pool; a bf16 model's over fp8 pools through paged_prefill_bf16_kvfp8)."""
        nd, n = md.num_decodes, md.num_reqs - md.num_decodes
        kvh, d = k_cache.shape[2], q.shape[2]
        q_start, q_len, seq_len = self.prefill_args(md, q.shape[1], kvh, d, q.dtype)
        if q.stride(2) != 1 or q.stride(1) != d:
            q = q.contiguous()
        bt = md.block_tables[nd:]
        args = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), bt.data_ptr(), bt.stride(0),
                q_start.data_ptr(), q_len.data_ptr(), seq_len.data_ptr(), out.data_ptr(), n, q.shape[1], kvh, d,
                k_cache.shape[1], scale, self._workspace.data_ptr())
        name = f"paged_prefill_{_NAMES[q.dtype]}{'_sw' if sliding_window else ''}{kv_suffix(q.dtype, k_cache.dtype)}"
        rc = getattr(self.prefill_lib, name)(*args, *((sliding_window,) if sliding_window else ()))
        if rc != 0:
            raise RuntimeError(f"{name} failed ({rc})")

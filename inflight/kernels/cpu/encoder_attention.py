"""An encoder's attention on the CPU (paged_prefill.c's ``encoder_attention_bf16``): each
request's rows attend over each other both ways, in bfloat16, with the causal prefill kernel's
code on every ISA level (AMX tiles, the bf16 dot product, or widened to float32), every row
seeing every key of its request. The rows are read in place from the fused qkv output."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import current_level

_i32, _i64, _f32, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[H, T, D] as [T, H, D] whose heads lie side by side in each row (a view of the fused qkv
    output is already); the rows may be any stride apart."""
    rows = x.transpose(0, 1)
    return rows if rows.stride(2) == 1 and rows.stride(1) == rows.shape[2] else rows.contiguous()


class CpuEncoderAttention:
    """ctypes front of ``encoder_attention_bf16``; one workspace, grown as needed."""

    def __init__(self, lib: ctypes.CDLL, tiles: bool) -> None:
        self.lib = lib
        self.tiles = tiles  # built for AMX: its products run on the tiles
        lib.encoder_attention_bf16.argtypes = [_ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i32, _i32, _i32,
                                               _i32, _f32, _ptr]
        lib.encoder_attention_workspace.argtypes = [_ptr, _i32, _i32, _i32, _i32]
        lib.encoder_attention_workspace.restype = _i64
        lib.paged_prefill_supported.argtypes = [_i32]
        self._workspace = torch.empty(0, dtype=torch.uint8)

    def supports(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """bf16 on the CPU, a head size the kernel takes, whole kv-head groups."""
        return (q.dtype == k.dtype == torch.bfloat16 and q.device.type == "cpu" and q.shape[0] % k.shape[0] == 0
                and bool(self.lib.paged_prefill_supported(q.shape[2])))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: list[int],
                 q_len: list[int], scale: float) -> torch.Tensor:
        """q [H, T, D], k and v [Hkv, T, D] (views of one qkv output, or any tensors); request r is
        rows q_start[r] .. q_start[r] + q_len[r], every row in one request. Returns [T, H * D]."""
        q_rows, k_rows, v_rows = _rows(q), _rows(k), _rows(v)
        if k_rows.stride(0) != v_rows.stride(0):
            k_rows, v_rows = k_rows.contiguous(), v_rows.contiguous()
        heads, kv_heads, d = q.shape[0], k.shape[0], q.shape[2]
        starts = torch.tensor(q_start, dtype=torch.int64)
        lens = torch.tensor(q_len, dtype=torch.int64)
        n = len(q_len)
        need = self.lib.encoder_attention_workspace(lens.data_ptr(), n, heads, kv_heads, d)
        if self._workspace.numel() < need:
            self._workspace = torch.empty(need, dtype=torch.uint8)
        out = torch.empty(q.shape[1], heads, d, dtype=q.dtype)
        rc = self.lib.encoder_attention_bf16(
            q_rows.data_ptr(), q_rows.stride(0), k_rows.data_ptr(), v_rows.data_ptr(), k_rows.stride(0),
            starts.data_ptr(), lens.data_ptr(), out.data_ptr(), n, heads, kv_heads, d, scale,
            self._workspace.data_ptr())
        if rc != 0:
            raise RuntimeError(f"encoder_attention_bf16 failed ({rc})")
        return out.view(q.shape[1], heads * d)


def load_encoder_attention(level=None) -> Optional[CpuEncoderAttention]:
    """The kernel built for ``level`` (an isa.IsaLevel; the CPU's by default), or None."""
    level = level or current_level()
    lib = None if level is None else load_library("paged_prefill", level)
    if lib is None or not hasattr(lib, "encoder_attention_bf16"):
        return None
    return CpuEncoderAttention(lib, level.has_amx)

"""Integer and FP8 weights of one linear layer back to float32, exactly.

Each function takes ``read`` (checkpoint name -> tensor) and the layer's name prefix and
returns its weight as transformers holds it, [out_features, in_features]. Scales are half
floats or bfloat16 and the integers at most 8 bits wide, so ``scale * (q - zero)`` is exact
in float32: in float32 the engine computes with the very weights the quantizer meant, and
4-bit ones qualify for the fp32 GEMM's low-bit panels (kernels/cpu/panel_lowbit.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import QuantConfig

Read = Callable[[str], torch.Tensor]
# AutoAWQ interleaves each 8 output columns in a word; column j sits in nibble _AWQ_NIBBLE[j]
_AWQ_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]
_COLUMNS = 2048  # output columns dequantized at a time, to bound the temporaries


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The unsigned ``bits``-wide fields of int32 words, lowest first, laid out along ``dim``
    (0: word r holds rows r * 32 / bits ...; 1: the same along columns)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    if dim == 0:
        return ((packed.unsqueeze(1) >> shifts.view(1, per, 1)) & mask).reshape(-1, packed.shape[1])
    return ((packed.unsqueeze(2) >> shifts.view(1, 1, per)) & mask).reshape(packed.shape[0], -1)


def _groups(k: int, group_size: int, g_idx: torch.Tensor | None) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(k) // (group_size if group_size > 0 else k)


def _grouped(n: int, k: int, g: torch.Tensor, scales: torch.Tensor, columns) -> torch.Tensor:
    """``scale * (q - zero)`` of each input's group, [n, k], from ``columns(lo, hi)``: the
    integers [k, hi - lo] and zero points [G, hi - lo] of output columns lo .. hi."""
    out = torch.empty(n, k)
    for lo in range(0, n, _COLUMNS):
        hi = min(n, lo + _COLUMNS)
        q, z = columns(lo, hi)
        out[lo:hi] = ((q - z[g]).float() * scales[g, lo:hi]).t()
    return out


def gptq_weight(read: Read, prefix: str, qc: QuantConfig, names: set[str]) -> torch.Tensor:
    """AutoGPTQ / GPTQModel: ``qweight`` [K * bits / 32, N] packed along the inputs,
    ``qzeros`` [G, N * bits / 32] along the outputs, ``scales`` [G, N], optional ``g_idx`` [K]
    (act-order checkpoints give each input its group)."""
    qweight, qzeros = read(f"{prefix}.qweight"), read(f"{prefix}.qzeros")
    k, n = qweight.shape[0] * 32 // qc.bits, qweight.shape[1]
    g = _groups(k, qc.group_size, read(f"{prefix}.g_idx") if f"{prefix}.g_idx" in names else None)

    def columns(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        words = qzeros[:, lo * qc.bits // 32:-(-hi * qc.bits // 32)]
        z = unpack_int32(words, qc.bits, 1)[:, :hi - lo] + qc.zero_offset
        return unpack_int32(qweight[:, lo:hi], qc.bits, 0), z
    return _grouped(n, k, g, read(f"{prefix}.scales").float(), columns)


def awq_weight(read: Read, prefix: str, qc: QuantConfig, names: set[str]) -> torch.Tensor:
    """AutoAWQ (GEMM): ``qweight`` [K, N / 8] and ``qzeros`` [G, N / 8], both packed along the
    outputs in AWQ's interleaved order, ``scales`` [G, N]."""
    qweight, qzeros = read(f"{prefix}.qweight"), read(f"{prefix}.qzeros")
    k, n = qweight.shape[0], qweight.shape[1] * 8

    def columns(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _awq_columns(qweight[:, lo // 8:hi // 8]), _awq_columns(qzeros[:, lo // 8:hi // 8])
    return _grouped(n, k, _groups(k, qc.group_size, None), read(f"{prefix}.scales").float(), columns)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    u = unpack_int32(packed, 4, 1)
    return u.view(u.shape[0], -1, 8)[:, :, _AWQ_NIBBLE].reshape(u.shape[0], -1)


def packed_int_weight(read: Read, prefix: str, qc: QuantConfig, names: set[str]) -> torch.Tensor:
    """llm-compressor's pack-quantized (symmetric): ``weight_packed`` [N, K * bits / 32] holds
    q + 2 ** (bits - 1) along the inputs, ``weight_scale`` [N, G] (G = 1 per channel),
    ``weight_shape`` the true [N, K], optional ``weight_g_idx`` [K]."""
    n, k = packed_int_shape(read, prefix, qc, names)
    q = unpack_int32(read(f"{prefix}.weight_packed"), qc.bits, 1)[:n, :k] - (1 << (qc.bits - 1))
    g = _groups(k, qc.group_size, read(f"{prefix}.weight_g_idx") if f"{prefix}.weight_g_idx" in names else None)
    scale = read(f"{prefix}.weight_scale").float()
    return q.float() * (scale[:, g] if scale.shape[-1] > 1 else scale)


def packed_int_shape(read: Read, prefix: str, qc: QuantConfig, names: set[str]) -> tuple[int, int]:
    """[N, K] of a pack-quantized weight (``weight_shape`` where the checkpoint has it)."""
    if f"{prefix}.weight_shape" in names:
        n, k = (int(v) for v in read(f"{prefix}.weight_shape").reshape(-1).tolist())
        return n, k
    packed = read(f"{prefix}.weight_packed")
    return packed.shape[0], packed.shape[1] * 32 // qc.bits


def fp8_weight(read: Read, prefix: str, qc: QuantConfig, names: set[str]) -> torch.Tensor:
    """FP8 (e4m3) ``weight`` times its scale: ``weight_scale_inv`` per (rows, columns) block
    (transformers' fine-grained FP8) or ``weight_scale`` per tensor, row or block."""
    w = read(f"{prefix}.weight").float()
    name = f"{prefix}.weight_scale_inv" if f"{prefix}.weight_scale_inv" in names else f"{prefix}.weight_scale"
    scale = read(name).float()
    if scale.dim() == 2 and scale.shape[1] > 1:  # blocks: expand each scale over its block
        bn, bk = qc.block or (-(-w.shape[0] // scale.shape[0]), -(-w.shape[1] // scale.shape[1]))
        scale = scale.repeat_interleave(bn, 0)[:w.shape[0]].repeat_interleave(bk, 1)[:, :w.shape[1]]
    if scale.numel() == 1:
        return w * scale.reshape(())
    return w * (scale if scale.shape == w.shape else scale.reshape(-1, 1))

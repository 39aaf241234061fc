"""fp8 KV cache: float8_e4m3fn storage with one scale per (token, KV head).

Granularity. Each token's K (and V) row of each KV head gets its own scale,
``amax(|row|) / 448``, stored in bfloat16 next to the fp8 values. Why per token
and head: a token's KV is written exactly once (a block fills up over several
steps, so a per-block scale would have to be fixed before the block's later
tokens are seen, or the block rewritten), and KV heads differ in magnitude, so
one scale per layer would waste most of e4m3's 3-bit mantissa on the quiet
heads. Why a bfloat16 scale: it keeps fp32's exponent range at 2 bytes, so for
``head_dim`` 64 a token-head costs 64 + 2 bytes against 128 in bfloat16:
1.94x the tokens in the same memory (a float32 scale would give only 1.88x).
The value is divided by the *rounded* scale, so rounding the scale costs no
accuracy, only the fp8 rounding of the values (relative error <= 2^-4).

Reading. :class:`FP8KVCache` stands where a cache tensor stands: it has
``shape`` and ``dtype`` (float8_e4m3fn, so a backend without fp8 kernels, Triton's,
falls back to the torch reference), and indexing it by block ids
returns the *dequantized* blocks in the model's dtype, which is all the torch
reference backend's gathers need. Writing goes through :meth:`FP8KVCache.write`.
On the torch reference backend a prefill chunk with no cached prefix attends over its own
unquantized K/V (as vLLM does); everything read back from the cache is dequantized.

Storage. A pool is one byte buffer, each (token, KV head) row its codes then its scale
(``fp8_row_bytes``), which the CPU's C kernels read (kernels/cpu/csrc/kv_fp8.h): their K/V
write quantizes as :func:`quantize_fp8` does, bit for bit, and they read every key, a
chunk's own included, from the pool.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
SCALE_DTYPE = torch.bfloat16
_MIN_SCALE = 1e-30  # an all-zero row still gets a finite, positive scale


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., D] -> (fp8 values [..., D], bf16 scales [...]) with ``x ~= q * scale``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE).to(SCALE_DTYPE)
    # NOTE: divide by the rounded scale; the clamp catches rows that the rounding pushed past 448
    # (e4m3fn has no infinity: an overflow would become NaN).
    q = (xf / scale.float().unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`, in ``dtype``."""
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def fp8_row_bytes(head_dim: int) -> int:
    """Bytes of one (token, KV head) row in an fp8 pool: the values, padded to an even
    count, then the 2-byte scale."""
    return head_dim + (head_dim & 1) + 2


@dataclass(eq=False)
class FP8KVCache:
    """One layer's K (or V) pool in fp8: ``data`` [num_blocks, block_size, KVH, D]
    float8_e4m3fn and ``scale`` [num_blocks, block_size, KVH] bfloat16, both views of
    one byte buffer ``buf`` [num_blocks, block_size, KVH, fp8_row_bytes(D)] where each
    (token, head) row holds its values and then its scale, so a kernel reads a row's
    scale from the same cache lines as its values; reads dequantize to ``out_dtype``."""

    buf: torch.Tensor
    out_dtype: torch.dtype
    head_dim: int

    def __post_init__(self) -> None:
        d = self.head_dim
        self.data = self.buf[..., :d].view(FP8_DTYPE)
        vd = d + (d & 1)
        self.scale = self.buf[..., vd:vd + 2].view(SCALE_DTYPE).squeeze(-1)

    @classmethod
    def zeros(cls, shape: tuple[int, ...], out_dtype: torch.dtype, device: torch.device,
              zeros: Optional[Callable[[tuple, torch.dtype], torch.Tensor]] = None) -> "FP8KVCache":
        """A zero-filled pool of ``shape`` [num_blocks, block_size, KVH, D] (``zeros``: the
        allocator for the byte buffer). NOTE: zero-filled like the plain pools: padded slots
        dequantize to 0, never NaN."""
        full = (*shape[:-1], fp8_row_bytes(shape[-1]))
        buf = zeros(full, torch.uint8) if zeros else torch.zeros(full, dtype=torch.uint8, device=device)
        return cls(buf, out_dtype, shape[-1])

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def tensors(self) -> tuple[torch.Tensor]:
        """Every tensor indexed by block id (what a swap copies): the one byte buffer."""
        return (self.buf,)

    def data_ptr(self) -> int:
        """The byte buffer's address (what the C kernels read)."""
        return self.buf.data_ptr()

    def is_contiguous(self) -> bool:
        return self.buf.is_contiguous()

    def write(self, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Quantize ``x`` [T, KVH, D] into the slots ``slot_mapping`` [T]."""
        nb, bs, kvh, d = self.data.shape
        q, s = quantize_fp8(x)
        # index_copy_ has no fp8 kernel on the CPU: copy the bytes.
        self.data.view(torch.uint8).view(nb * bs, kvh, d).index_copy_(0, slot_mapping, q.view(torch.uint8))
        self.scale.view(nb * bs, kvh).index_copy_(0, slot_mapping, s)

    def __getitem__(self, index) -> torch.Tensor:
        """Dequantized blocks, e.g. ``cache[block_ids]`` -> [..., block_size, KVH, D]."""
        return dequantize_fp8(self.data[index], self.scale[index], self.out_dtype)


def is_quantized(cache) -> bool:
    """True for an fp8 cache (the torch backend quantizes on write)."""
    return isinstance(cache, FP8KVCache)

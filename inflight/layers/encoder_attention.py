"""Attention both ways over each request's own rows: an encoder's (BERT), which keeps no KV.

Every request's prompt is in the step whole (the engine runs encoders without chunking or a
prefix cache), so its rows attend over each other only. ``forward_native`` is torch's SDPA per
request. On a CPU with AMX tiles a bfloat16 model runs the C kernel
(kernels/cpu/encoder_attention.py: the prefill kernel with every key visible) over every request
of the step in one call. Without tiles it computes the two products as batched bf16 GEMMs around
torch's softmax (which accumulates in float32), faster there than torch's fused kernel at the
lengths encoders see, with the same rounding of the output; the C kernel's dot products were
not measured to beat either on such a CPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.attention.base import AttentionMetadata
from inflight.kernels.cpu.ops import cpu_encoder_attention
from inflight.layers.custom_op import CustomOp

SHORT = 64  # tokens: below this the CPU's bf16 path without tiles takes torch's fused kernel too


class EncoderAttention(CustomOp):
    """q, k, v: [H, T, D] over the step's T rows; returns [T, H * D]."""

    def forward_native(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        # [1, H, L, D]: torch's fused CPU kernel takes 4-D inputs (3-D ones fall back to the math path)
        return self._each(q, k, v, md, lambda a, b, c: F.scaled_dot_product_attention(a[None], b[None], c[None])[0])

    def forward_cpu(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        if q.dtype != torch.bfloat16:
            return self.forward_native(q, k, v, md)
        kernel = cpu_encoder_attention()
        if kernel is None or not kernel.tiles or not kernel.supports(q, k):
            return self._each(q, k, v, md, self._gemms)
        return kernel(q, k, v, md.query_start_loc_list[:md.num_reqs], self._whole_lens(md), q.shape[-1] ** -0.5)

    @staticmethod
    def _whole_lens(md: AttentionMetadata) -> list[int]:
        """Each request's rows in the step, which must be its whole prompt."""
        qsl = md.query_start_loc_list
        lens = [qsl[i + 1] - qsl[i] for i in range(md.num_reqs)]
        # NOTE: the engine runs an encoder's prompt whole (no chunking, no prefix cache)
        if md.seq_lens_list[:md.num_reqs] != lens:
            raise RuntimeError("an encoder's prompt must run whole in one step")
        return lens

    @staticmethod
    def _gemms(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """One request's [H, L, D] as two batched bf16 GEMMs around softmax (SDPA when short)."""
        if a.shape[1] < SHORT:  # one fused call beats three for a short text
            return F.scaled_dot_product_attention(a[None], b[None], c[None])[0]
        scores = torch.baddbmm(a.new_zeros(1), a, b.transpose(1, 2), beta=0, alpha=a.shape[-1] ** -0.5)
        return torch.bmm(torch.softmax(scores, -1), c)

    @staticmethod
    def _each(q, k, v, md: AttentionMetadata, attend) -> torch.Tensor:
        out = torch.empty_like(q)
        for s, n in zip(md.query_start_loc_list, EncoderAttention._whole_lens(md)):
            out[:, s:s + n] = attend(q[:, s:s + n], k[:, s:s + n], v[:, s:s + n])
        return out.transpose(0, 1).reshape(q.shape[1], -1)

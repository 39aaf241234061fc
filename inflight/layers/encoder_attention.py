"""Attention both ways over each request's own rows: an encoder's (BERT), which keeps no KV.

Every request's prompt is in the step whole (the engine runs encoders without chunking or a
prefix cache), so its rows attend over each other only. ``forward_native`` is torch's SDPA per
request. On the CPU a bfloat16 model runs the C kernel (kernels/cpu/encoder_attention.py: the
prefill kernel with every key visible) for every request where it has AMX tiles and for
requests under SHORT tokens elsewhere, where one call for all of them beats a torch call or
three per request; a longer request without tiles computes the two products as batched bf16
GEMMs around torch's softmax (which accumulates in float32), faster there than the C kernel's
dot products and than torch's fused kernel, with the same rounding of the output.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.attention.base import AttentionMetadata
from inflight.kernels.cpu.ops import cpu_encoder_attention
from inflight.layers.custom_op import CustomOp

SHORT = 64  # tokens: below this the C kernel runs on every ISA level


class EncoderAttention(CustomOp):
    """q, k, v: [H, T, D] over the step's T rows; returns [T, H * D]."""

    def forward_native(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        # [1, H, L, D]: torch's fused CPU kernel takes 4-D inputs (3-D ones fall back to the math path)
        return self._each(q, k, v, md, lambda a, b, c: F.scaled_dot_product_attention(a[None], b[None], c[None])[0])

    def forward_cpu(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        if q.dtype != torch.bfloat16:
            return self.forward_native(q, k, v, md)
        qsl, kernel = md.query_start_loc_list, cpu_encoder_attention()
        lens = [qsl[i + 1] - qsl[i] for i in range(md.num_reqs)]
        # NOTE: the engine runs an encoder's prompt whole (no chunking, no prefix cache)
        if md.seq_lens_list[:md.num_reqs] != lens:
            raise RuntimeError("an encoder's prompt must run whole in one step")
        if kernel is None or not kernel.supports(q, k):
            return self._each(q, k, v, md, self._gemms)
        on_c = [i for i, n in enumerate(lens) if kernel.tiles or n < SHORT]
        out = kernel(q, k, v, [qsl[i] for i in on_c], [lens[i] for i in on_c], q.shape[-1] ** -0.5)
        if len(on_c) < md.num_reqs:
            rows = out.view(q.shape[1], q.shape[0], q.shape[2])
            for i in sorted(set(range(md.num_reqs)) - set(on_c)):
                s, e = qsl[i], qsl[i + 1]
                rows[s:e] = self._gemms(q[:, s:e], k[:, s:e], v[:, s:e]).transpose(0, 1)
        return out

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
        qsl = md.query_start_loc_list
        for i in range(md.num_reqs):
            s, e = qsl[i], qsl[i + 1]
            # NOTE: the engine runs an encoder's prompt whole (no chunking, no prefix cache)
            if md.seq_lens_list[i] != e - s:
                raise RuntimeError("an encoder's prompt must run whole in one step")
            out[:, s:e] = attend(q[:, s:e], k[:, s:e], v[:, s:e])
        return out.transpose(0, 1).reshape(q.shape[1], -1)

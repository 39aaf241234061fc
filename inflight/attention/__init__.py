"""Attention backends behind one interface (see base.py)."""
from typing import Optional

import torch

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.attention.torch_ref import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "get_attention_backend"]


def get_attention_backend(name: str = "auto", device: Optional[torch.device] = None) -> AttentionBackend:
    """``auto``: the Triton kernels on CUDA when Triton is importable; on the CPU the C
    paged-decode kernel when it builds; else the torch reference.
    ``torch``: always the reference; ``cpu``: the C kernel or an error;
    ``triton``: the Triton kernels, or an error if Triton is missing (they run on CUDA, and on
    CPU tensors under TRITON_INTERPRET=1; anything else goes through the torch reference)."""
    on_cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
    if name == "triton" or (name == "auto" and on_cuda):
        from inflight.attention import triton as triton_attn
        if triton_attn.is_available():
            return triton_attn.TritonAttentionBackend()
        if name == "triton":
            raise RuntimeError("attention_backend='triton' needs Triton: pip install triton")
    if name in ("auto", "cpu"):
        from inflight.attention.cpu_paged import CpuPagedAttentionBackend
        try:
            return CpuPagedAttentionBackend()
        except RuntimeError:
            if name == "cpu":
                raise
    if name in ("torch", "auto"):
        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: auto, torch, cpu, triton")

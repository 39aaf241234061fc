"""Attention backends behind one interface (see base.py)."""
from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.attention.torch_ref import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "get_attention_backend"]


def get_attention_backend(name: str = "auto") -> AttentionBackend:
    """``auto``: the C paged-decode kernel on the CPU when it builds, else the torch reference.
    ``torch``: always the reference; ``cpu``: the C kernel or an error."""
    if name in ("auto", "cpu"):
        from inflight.attention.cpu_paged import CpuPagedAttentionBackend
        try:
            return CpuPagedAttentionBackend()
        except RuntimeError:
            if name == "cpu":
                raise
    if name in ("torch", "auto"):
        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: auto, torch, cpu")

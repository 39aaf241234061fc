"""Attention backends behind one interface (see base.py)."""
from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.attention.torch_ref import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "get_attention_backend"]


def get_attention_backend(name: str = "torch") -> AttentionBackend:
    """Return the backend called ``name`` (only the torch reference for now)."""
    if name in ("torch", "auto"):
        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: torch")
